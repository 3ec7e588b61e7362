"""GPU layer: qrgen.geqrf on its default schedules against the gates on every stress family (square, tall, wide,
many matrices, whole kernels), the array contract (torch and CuPy in and out, leading dimensions, views, streams),
NaNs, bad and empty input, and the gates' own GPU path."""
import numpy as np
import pytest

import qrgen
from gpu_cases import geqrf_checked
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed, stress

pytestmark = pytest.mark.gpu

SQUARE = [1, 2, 31, 32, 33, 100, 176, 255, 257, 352, 512]
LARGE = [1000, 1024, 2048, 4096]


@pytest.mark.parametrize("n", SQUARE)
def test_square_every_family(n):
    batch = 3
    for family in FAMILIES:
        a = stress(family, n, n, batch, seed=n)
        result = geqrf_checked(a)
        assert result.ok, f"{family} {n}x{n}: {result}"


@pytest.mark.slow
@pytest.mark.parametrize("n", LARGE)
def test_large_mixed(n):
    """Every family; above 1024 columns in batches of two (split panel products, tf32 aggregates by default)."""
    a, labels = mixed(n, n, len(FAMILIES), seed=n)
    step = len(a) if n <= 1024 else 2
    for i in range(0, len(a), step):
        result = geqrf_checked(a[i:i + step])
        assert result.ok, f"{n}x{n} {labels[i:i + step]}: {result}"


@pytest.mark.slow
@pytest.mark.parametrize("m,n", [(8192, 512), (4096, 1024), (2048, 2048)])
def test_single_tall_matrices_every_family(m, n):
    """One matrix per call: the default's panels on clusters of blocks."""
    a, labels = mixed(m, n, len(FAMILIES), seed=m - n)
    for i, label in enumerate(labels):
        result = geqrf_checked(a[i:i + 1])
        assert result.ok, f"{m}x{n} {label}: {result}"


@pytest.mark.slow
@pytest.mark.parametrize("m,n", [(4096, 1024), (8192, 512), (100000, 32), (40000, 256), (256, 1024)])
def test_tall_and_wide(m, n):
    a, labels = mixed(m, n, 2, seed=m + n)
    result = geqrf_checked(a)
    assert result.ok, f"{m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch,m,n", [(1, 20000, 256), (3, 20000, 192)])
def test_few_tall_matrices_with_products_in_parts_every_family(batch, m, n):
    """tsqr panels whose aggregates' G and projections split their K over the SMs, each product's parts added into
    its first (run/buffers.gram_parts and w_parts, docs/decisions.md#tsqr-tf32x3); every family, `batch` a call."""
    from qrgen.problem import Problem
    from qrgen.run.buffers import gram_parts, w_parts
    from qrgen.run.factorizer import Factorizer
    from qrgen.schedule.files import find
    from qrgen.targets import Target

    target = Target("cuda", "sm_90")
    fac = Factorizer(m, n, find(Problem(m, n, batch), target)[0], target)
    assert gram_parts(fac, batch, 132) > 1 and w_parts(fac, batch, 132) > 1
    a, labels = mixed(m, n, batch * len(FAMILIES), seed=m + n)
    for i in range(0, len(a), batch):
        result = geqrf_checked(a[i:i + batch])
        assert result.ok, f"{batch}x{m}x{n} {labels[i:i + batch]}: {result}"


@pytest.mark.parametrize("m,n", [(1, 64), (10, 100), (20, 33), (32, 200), (31, 32)])
def test_wide_one_panel_every_family(m, n):
    """Wide matrices whose default is a single panel with columns right of it: those columns reach h before the
    panel's update (a one-panel schedule reads the input directly only when nothing lies right of its panel)."""
    a, labels = mixed(m, n, 2 * len(FAMILIES), seed=m * n)
    result = geqrf_checked(a)
    assert result.ok, f"{m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch,m,n", [(70, 512, 700), (64, 500, 620)])
def test_default_for_many_wide_matrices_every_family(batch, m, n):
    """The default for 64 or more wide matrices of 384 to 512 rows where cols panels of 64 columns do not fit (sm_86
    and sm_89's shared memory; schedule.default_many: 16-wide looped rows panels, aggregates of 64 with tf32x3
    products and lookahead 2), not a multiple of 16, run on this GPU, on a batch of every stress family at random
    positions."""
    import cupy

    from qrgen.problem import Problem
    from qrgen.run.factorizer import Factorizer
    from qrgen.run.launch import device_target
    from qrgen.schedule.heuristic import default_many, default_schedule
    from qrgen.targets import Target

    schedule = default_schedule(Problem(m, n, batch), Target("cuda", "sm_86"))
    assert default_many(Problem(m, n, batch)) and {p.width for p in schedule.panels[:-2]} == {16}
    fac = Factorizer(m, n, schedule, device_target(cupy.cuda.Device().id))
    a, labels = mixed(m, n, batch, seed=batch + m)
    result = geqrf_checked(a, fac)
    assert result.ok, f"{batch} x {m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch,m,n", [(10, 128, 512), (100, 128, 512), (100, 128, 129), (10, 130, 260),
                                       (100, 130, 395), (100, 134, 300), (16, 256, 1024), (64, 384, 1000),
                                       (100, 512, 1100)])
def test_wide_cols_aggregates_every_family(batch, m, n):
    """Wide matrices of 128 to 512 rows: cols panels over their first m columns, each its own aggregate, whose
    updates carry the columns past them (schedule.default_cols_aggregates): one panel with every column right of it
    (128 rows: the input copied into h first, run/sequence.reads_input), a last panel of 2 or 6 rows forming its T
    (rows of T no whole quads), on one block and on clusters. Every stress family at random positions, each call
    twice (the second one through the fast lane where it takes the shape)."""
    from qrgen.problem import Problem
    from qrgen.schedule.heuristic import default_schedule

    schedule = default_schedule(Problem(m, n, batch))
    assert {p.variant for p in schedule.panels} == {"cols"} and schedule.aggregate
    a, labels = mixed(m, n, batch, seed=batch + m + n)
    for _ in range(2):
        result = geqrf_checked(a)
        assert result.ok, f"{batch} x {m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch,m,n", [(133, 384, 384), (140, 400, 400), (150, 500, 450), (200, 512, 300)])
def test_cols_aggregates_past_one_wave_every_family(batch, m, n):
    """More than COLS_MAX_BATCH matrices of up to 512 rows too tall for cols panels of 128 columns: cols panels of 64,
    each its own aggregate (schedule.default_cols_aggregates), on a batch of every stress family at random positions."""
    from qrgen.problem import Problem
    from qrgen.schedule.heuristic import default_schedule

    schedule = default_schedule(Problem(m, n, batch))
    assert schedule.aggregate == 64 and {p.variant for p in schedule.panels} == {"cols"}
    a, labels = mixed(m, n, batch, seed=batch + m)
    result = geqrf_checked(a)
    assert result.ok, f"{batch} x {m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch", [1, 7, 133, 640])
def test_batches_mixed(batch):
    a, labels = mixed(32, 32, batch, seed=batch)
    result = geqrf_checked(a)
    assert result.ok, f"batch {batch}: {result}"


@pytest.mark.parametrize("batch,m,n,variant", [(1000, 48, 48, "lanes"), (1200, 64, 64, "lanes"), (7, 64, 40, "lanes"),
                                               (300, 128, 128, "lanes"), (1000, 64, 32, "whole")])
def test_default_one_kernel_mixed_batch(batch, m, n, variant):
    """The defaults of one kernel a matrix for small ones (schedule.heuristic.default_wide_lanes, default_whole) on a
    batch of every stress family."""
    from qrgen.problem import Problem
    from qrgen.schedule.heuristic import default_schedule

    (panel,) = default_schedule(Problem(m, n, batch)).panels
    assert panel.variant == variant
    a, labels = mixed(m, n, batch, seed=batch)
    result = geqrf_checked(a)
    assert result.ok, f"{batch} x {m}x{n}: {result}"


def test_torch_in_torch_out_same_stream_input_untouched():
    torch = pytest.importorskip("torch")
    a = torch.randn(5, 64, 48, device="cuda")
    before = a.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        h, tau = qrgen.geqrf(a)
    stream.synchronize()
    assert isinstance(h, torch.Tensor) and h.device == a.device and h.shape == a.shape and tau.shape == (5, 48)
    assert torch.equal(a, before)
    q = torch.linalg.householder_product(h.double(), tau.double())
    r = torch.triu(h.double())[..., :48, :]
    assert torch.allclose(q @ r, a.double(), atol=1e-4)


def test_cupy_leading_dims_and_noncontiguous():
    import cupy

    a = cupy.random.standard_normal((2, 3, 40, 24), dtype=cupy.float32)
    h, tau = qrgen.geqrf(a)
    assert isinstance(h, cupy.ndarray) and h.shape == a.shape and tau.shape == (2, 3, 24)
    assert check(a, h, tau).ok
    at = cupy.random.standard_normal((4, 24, 40), dtype=cupy.float32).transpose(0, 2, 1)
    h2, tau2 = qrgen.geqrf(at)
    assert check(at, h2, tau2).ok


def test_torch_views_strided_offset_negated_and_requiring_grad():
    """torch inputs are read where they lie (strides, storage offset), a lazily negated view as its values, a
    tensor that requires grad without complaint; results equal those of the same values as a CuPy array."""
    import cupy

    torch = pytest.importorskip("torch")
    base = torch.randn(4, 70, 90, device="cuda")
    views = {"transposed": base[:, 3:67, 5:69].transpose(-1, -2), "offset": base[1:3, 6:46, 10:50],
             "negated": torch._neg_view(base[:, :40, :40]) if hasattr(torch, "_neg_view") else -base[:, :40, :40],
             "grad": base[:, :33, :31].clone().requires_grad_(True)}
    for name, x in views.items():
        h, tau = qrgen.geqrf(x)
        want_h, want_tau = qrgen.geqrf(cupy.asarray(x.detach().resolve_neg().contiguous()))
        assert isinstance(h, torch.Tensor) and tuple(h.shape) == tuple(x.shape), name
        h, tau = h.detach(), tau.detach()  # as torch.geqrf's, they require grad where x does
        assert bool((cupy.from_dlpack(h) == want_h).all()) and bool((cupy.from_dlpack(tau) == want_tau).all()), name
        q, r = qrgen.qr(x)
        assert torch.allclose(q @ r, x.detach().resolve_neg(), atol=1e-4), name


def test_nan_in_one_matrix_leaves_the_others():
    import cupy

    a = stress("random", 64, 64, 4, seed=3)
    a[2, 5, 7] = np.nan
    h, tau = qrgen.geqrf(cupy.asarray(a))
    h = h.get()
    assert np.isnan(h[2]).any()
    keep = [0, 1, 3]
    assert check(a[keep], h[keep], tau.get()[keep]).ok


def test_bad_input():
    import cupy

    with pytest.raises(TypeError, match="float32"):
        qrgen.geqrf(cupy.zeros((2, 4, 4), dtype=cupy.float64))
    with pytest.raises(TypeError, match="host"):
        qrgen.geqrf(np.zeros((2, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        qrgen.geqrf(cupy.zeros((4,), dtype=cupy.float32))


def test_empty():
    import cupy

    for shape in [(0, 4, 4), (3, 0, 4), (3, 4, 0)]:
        h, tau = qrgen.geqrf(cupy.zeros(shape, dtype=cupy.float32))
        assert h.shape == shape and tau.shape == shape[:-2] + (min(shape[-2:]),)


def test_check_on_the_gpu_matches_lapack():
    """check() runs in float64 on the GPU where h is a CuPy array; it must give LAPACK's numbers on the host."""
    import cupy

    for m, n in [(64, 48), (300, 200), (100, 257)]:
        a, _ = mixed(m, n, len(FAMILIES), seed=m)
        h, tau = qrgen.geqrf(cupy.asarray(a))
        h[1, 0, 1] += 1.0  # one wrong factorization
        gpu, cpu = check(a, h, tau, device="gpu"), check(a, h, tau, device="cpu")
        np.testing.assert_allclose(gpu.factor, cpu.factor, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(gpu.orthogonality, cpu.orthogonality, rtol=1e-6, atol=1e-6)
        assert not gpu.passed[1] and gpu.passed[np.arange(len(a)) != 1].all()
