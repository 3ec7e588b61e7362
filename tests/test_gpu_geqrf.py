"""GPU layer: qrgen.geqrf against the gates on every stress family, the array contract, bad input."""
import numpy as np
import pytest

import qrgen
from qrgen.check import check
from qrgen.testing import FAMILIES, mixed, stress

pytestmark = pytest.mark.gpu

SQUARE = [1, 2, 31, 32, 33, 100, 176, 255, 257, 352, 512]
LARGE = [1000, 1024, 2048, 4096]
EPS32 = float(np.finfo(np.float32).eps)


def _geqrf_checked(a_host, geqrf=qrgen.geqrf):
    import cupy

    h, tau = geqrf(cupy.asarray(a_host))
    return check(a_host, h, tau)


@pytest.mark.parametrize("n", SQUARE)
def test_square_every_family(n):
    batch = 3
    for family in FAMILIES:
        a = stress(family, n, n, batch, seed=n)
        result = _geqrf_checked(a)
        assert result.ok, f"{family} {n}x{n}: {result}"


@pytest.mark.slow
@pytest.mark.parametrize("n", LARGE)
def test_large_mixed(n):
    """Every family; above 1024 columns in batches of two (split panel products, tf32 aggregates by default)."""
    a, labels = mixed(n, n, len(FAMILIES), seed=n)
    step = len(a) if n <= 1024 else 2
    for i in range(0, len(a), step):
        result = _geqrf_checked(a[i:i + step])
        assert result.ok, f"{n}x{n} {labels[i:i + step]}: {result}"


@pytest.mark.slow
@pytest.mark.parametrize("m,n", [(8192, 512), (4096, 1024), (2048, 2048)])
def test_single_tall_matrices_every_family(m, n):
    """One matrix per call: the default's panels on clusters of blocks."""
    a, labels = mixed(m, n, len(FAMILIES), seed=m - n)
    for i, label in enumerate(labels):
        result = _geqrf_checked(a[i:i + 1])
        assert result.ok, f"{m}x{n} {label}: {result}"


@pytest.mark.slow
@pytest.mark.parametrize("m,n", [(4096, 1024), (8192, 512), (100000, 32), (40000, 256), (256, 1024)])
def test_tall_and_wide(m, n):
    a, labels = mixed(m, n, 2, seed=m + n)
    result = _geqrf_checked(a)
    assert result.ok, f"{m}x{n} {labels}: {result}"


@pytest.mark.parametrize("m,n", [(1, 64), (10, 100), (20, 33), (32, 200), (31, 32)])
def test_wide_one_panel_every_family(m, n):
    """Wide matrices whose default is a single panel with columns right of it: those columns reach h before the
    panel's update (a one-panel schedule reads the input directly only when nothing lies right of its panel)."""
    a, labels = mixed(m, n, 2 * len(FAMILIES), seed=m * n)
    result = _geqrf_checked(a)
    assert result.ok, f"{m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch,m,n", [(64, 384, 384), (80, 400, 400), (70, 512, 700), (64, 500, 450)])
def test_default_for_many_matrices_every_family(batch, m, n):
    """The default for 64 or more matrices of 384 to 512 rows (schedule.default_many: 16-wide looped rows panels,
    aggregates of 64 with tf32x3 products and lookahead 2), square, wide and not a multiple of 16, on a batch of
    every stress family at random positions."""
    from qrgen.problem import Problem
    from qrgen.schedule import default_many

    assert default_many(Problem(m, n, batch))
    a, labels = mixed(m, n, batch, seed=batch + m)
    result = _geqrf_checked(a)
    assert result.ok, f"{batch} x {m}x{n} {labels}: {result}"


@pytest.mark.parametrize("batch", [1, 7, 133, 640])
def test_batches_mixed(batch):
    a, labels = mixed(32, 32, batch, seed=batch)
    result = _geqrf_checked(a)
    assert result.ok, f"batch {batch}: {result}"


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


def test_generated_module_any_batch_and_wrong_shape(tmp_path):
    import importlib

    import cupy

    mod = importlib.import_module("generated.qr_176x176_b40")
    a = stress("colscaled", 176, 176, 5, seed=9)
    h, tau = mod.geqrf(cupy.asarray(a))
    assert check(a, h, tau).ok
    with pytest.raises(ValueError, match="176x176"):
        mod.geqrf(cupy.zeros((2, 170, 176), dtype=cupy.float32))
    from test_qmatrix import _q_gates

    q, r = mod.qr(cupy.asarray(a))
    factor, orth = _q_gates(a, q.get(), r.get())
    assert (factor <= 20).all() and (orth <= 100).all()
    well = stress("random", 176, 176, 3, seed=10)
    x, _ = mod.lstsq(cupy.asarray(well), cupy.asarray(well[..., :1]))  # b = the first column: x = e_1
    assert np.allclose(x.get()[..., 0], np.eye(176)[0], atol=1e-3)
    with pytest.raises(ValueError, match="176x176"):
        mod.qr(cupy.zeros((2, 170, 176), dtype=cupy.float32))


def test_cli_build_then_import(tmp_path):
    import importlib.util
    import subprocess
    import sys

    import cupy

    result = subprocess.run([sys.executable, "-m", "qrgen", "build", "--shape", "96x64", "--batch", "3", "--out",
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "registers" in result.stdout
    spec = importlib.util.spec_from_file_location("qr_96x64_b3", tmp_path / "qr_96x64_b3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = stress("random", 96, 64, 3, seed=4)
    h, tau = mod.geqrf(cupy.asarray(a))
    assert check(a, h, tau).ok


@pytest.mark.parametrize("variant,index", [("cols", i) for i in range(4)] + [("lanes", i) for i in range(11)])
def test_block_variants_every_family(variant, index):
    """The cols panel kernel (warps own column slices, mbarrier per reflector) and the lanes panel kernel (lane c
    owns column c, warps own row ranges; on clusters of 8, 4, 2 and 16 blocks, one on one warp with its loop over
    columns unrolled) through explicit schedules."""
    import cupy

    from qrgen.runtime import Factorizer

    from test_codegen_compile import COLS_SCHEDULES, LANES_SCHEDULES

    schedule = (COLS_SCHEDULES if variant == "cols" else LANES_SCHEDULES)[index]
    fac = Factorizer(schedule.m, schedule.n, schedule, "sm_90")
    for family in FAMILIES:
        a = stress(family, schedule.m, schedule.n, 3, seed=index)
        h, tau = fac(cupy.asarray(a))
        result = check(a, h, tau)
        assert result.ok, f"{family} {schedule.describe()}: {result}"


def test_tune_on_the_gpu(tmp_path):
    from qrgen.problem import Problem, Target
    from qrgen.tune import GPUEvaluator, tune_and_save

    problem, target = Problem(64, 64, 8), Target()
    result, path = tune_and_save(problem, target, 3, f"sqlite:///{tmp_path / 's.sqlite3'}", schedule_root=tmp_path,
                                 evaluator=GPUEvaluator(problem, target, reps=3), log=lambda _: None)
    assert path.exists() and result.outcome.accurate and result.outcome.time_us > 0


def _aggregated_schedule(m, n, width, aggregate, panel_update="cublas", lookahead=0, reach=False):
    from qrgen.schedule import Schedule, default_panel

    k = min(m, n)
    panels, col = [], 0
    while col < k:
        end = min(k, (col // aggregate + 1) * aggregate)
        panel = default_panel(m - col, end - col, (width,))
        panels.append(panel)
        col += panel.width
    return Schedule(m, n, tuple(panels), aggregate=aggregate, panel_update=panel_update, lookahead=lookahead,
                    reach=reach)


@pytest.mark.parametrize("panel_update,lookahead,reach", [
    ("cublas", 0, False), ("split", 0, False), ("split", 32, False), ("cublas", 1, False), ("fused", 0, False),
    ("fused", 2, False), ("fused", 32, True), ("cublas", 2, True), ("split", 1, True)])
@pytest.mark.parametrize("m,n,width,aggregate", [(256, 256, 32, 128), (300, 200, 16, 64), (200, 330, 32, 96),
                                                 (1024, 1024, 32, 256), (2000, 300, 8, 128)])
def test_aggregated_schedules_every_family(m, n, width, aggregate, panel_update, lookahead, reach):
    """Panels update their aggregate's columns (with reach, the next aggregate's too); each aggregate's merged WY
    form updates the rest (rank-A); the panels' own products through cuBLAS, the split kernels or the fused kernel;
    with lookahead, on two streams (with reach, the merges on the side one)."""
    import cupy

    from qrgen.runtime import Factorizer

    schedule = _aggregated_schedule(m, n, width, aggregate, panel_update, lookahead, reach)
    fac = Factorizer(m, n, schedule, "sm_90")
    for family in FAMILIES:
        a = stress(family, m, n, 3, seed=aggregate)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"


@pytest.mark.parametrize("width,rows,nc,ldc,aligned,cluster", [
    (32, 1024, 96, 1024, True, 1), (32, 1024, 96, 1024, False, 1), (32, 37, 70, 104, True, 1),
    (32, 37, 70, 101, False, 1), (16, 700, 33, 64, True, 1), (5, 300, 1, 7, False, 1), (1, 129, 40, 48, True, 1),
    (8, 2000, 250, 257, False, 1), (20, 130, 250, 260, True, 1), (32, 1024, 96, 1024, True, 2),
    (32, 1000, 40, 101, False, 4), (5, 2000, 250, 260, True, 8), (16, 9, 33, 64, True, 8)])
def test_fused_panel_products(width, rows, nc, ldc, aligned, cluster):
    """The fused kernel against float64: C -= V (Z^T C) on nc columns of C (rows x ldc per matrix, from column 4
    with every leading dimension a multiple of 4: its 16-byte path; else from column 3), the columns around them
    untouched; with a cluster, the rows split over its blocks (9 rows over 8: some blocks have none)."""
    import cupy

    from qrgen import codegen, compile as qcompile
    from qrgen.runtime import _FUSED_PARAMS, _PackedArgs

    kernel = codegen.fused_kernel(width, cluster)
    rendered = codegen.render_fused(kernel)
    binary = qcompile.compile_source(rendered.name, rendered.source, "sm_90")
    module = cupy.cuda.function.Module()
    module.load(binary.cubin)
    func = module.get_function(rendered.name)
    batch, rng = 5, np.random.default_rng(rows)
    zld, vld, col = (-(-rows // 4) * 4 + 4, -(-rows // 4) * 4, 4) if aligned else (rows + 3, rows + 1, 3)
    zt = rng.standard_normal((batch, width, zld)).astype(np.float32)  # leading dimensions past the rows
    vt = rng.standard_normal((batch, width, vld)).astype(np.float32)
    c = rng.standard_normal((batch, rows, ldc)).astype(np.float32)
    zg, vg, cg = cupy.asarray(zt), cupy.asarray(vt), cupy.asarray(c)
    values = (zg.data.ptr, zld, width * zld, vg.data.ptr, vld, width * vld, cg.data.ptr + 4 * col, ldc, rows * ldc,
              rows, nc)
    args = _PackedArgs(_FUSED_PARAMS, values)
    if kernel.shared_bytes > 48 * 1024:
        cupy.cuda.driver.funcSetAttribute(func.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          kernel.shared_bytes)
    cupy.cuda.driver.launchKernel(func.ptr, -(-nc // 32), batch, cluster, codegen.FUSED_THREADS, 1, 1,
                                  kernel.shared_bytes, cupy.cuda.get_current_stream().ptr, args.address, 0)
    out = cupy.asnumpy(cg).astype(np.float64)
    z64, v64, c64 = zt[:, :, :rows].astype(np.float64), vt[:, :, :rows].astype(np.float64), c.astype(np.float64)
    part = c64[:, :, col:col + nc]
    want = part - np.matmul(v64.transpose(0, 2, 1), np.matmul(z64, part))
    scale = np.matmul(np.abs(v64).transpose(0, 2, 1), np.matmul(np.abs(z64), np.abs(part))) + np.abs(part)
    assert np.all(np.abs(out[:, :, col:col + nc] - want) <= 2 * (rows + width) * EPS32 * scale)
    assert np.array_equal(out[:, :, :col], c64[:, :, :col])
    assert np.array_equal(out[:, :, col + nc:], c64[:, :, col + nc:])


@pytest.mark.parametrize("batch,m,n", [(20000, 32, 32), (20, 32, 32), (40, 176, 176), (40, 352, 352), (6, 300, 120),
                                       (1000, 48, 48), (2000, 64, 32),  # whole kernels (schedule.default_whole)
                                       pytest.param(640, 512, 512, marks=pytest.mark.slow),
                                       pytest.param(60, 1024, 1024, marks=pytest.mark.slow),
                                       pytest.param(8, 2048, 2048, marks=pytest.mark.slow),
                                       pytest.param(2, 4096, 4096, marks=pytest.mark.slow)])
def test_qr_reduced_and_lstsq_every_family(batch, m, n):
    """The Q issue's acceptance: qr (reduced) and lstsq on the seven reference batches and 20,000 x 32²; also two
    shapes whose default is a whole kernel (no keep plan: Q from h and tau)."""
    import cupy

    from test_qmatrix import _q_gates

    checked = min(batch, 64 if m * n <= 1 << 18 else 2)  # the float64 gates run on the host
    for family in FAMILIES:
        a = stress(family, m, n, checked, seed=m)
        q, r = qrgen.qr(cupy.asarray(a))
        factor, orth = _q_gates(a, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (family, factor.max(), orth.max())
    big = cupy.random.standard_normal((batch, m, n), dtype=cupy.float32)
    q, r = qrgen.qr(big, mode="reduced")
    assert q.shape == (batch, m, min(m, n)) and r.shape == (batch, min(m, n), n)
    if m >= n:
        a = stress("random", m, n, 4, seed=1)
        b = np.random.default_rng(0).standard_normal((4, m)).astype(np.float32)
        # precision=None: the schedule's (tf32 aggregate products from 2048 columns: backward ratio ~1-2 measured);
        # "fp32": every product in fp32 (ratio ~0.005 measured at 2048² and 4096², like torch's 0.003).
        for precision, limit in ((None, 20), ("fp32", 0.1)):
            x, res = qrgen.lstsq(cupy.asarray(a), cupy.asarray(b), precision=precision)
            x, res = x.get().astype(np.float64), res.get()
            for i in range(4):
                a64, b64 = a[i].astype(np.float64), b[i].astype(np.float64)
                # Backward error on the factor gate's scale: the normal equations' residual against the sizes of
                # a, x and b in units of eps32 (x from a + E with ||E||_1 = f n eps32 ||a||_1 gives about f here).
                r = b64 - a64 @ x[i]
                norm_a = np.linalg.norm(a64)
                ratio = np.linalg.norm(a64.T @ r) / (norm_a * (norm_a * np.linalg.norm(x[i]) + np.linalg.norm(b64))
                                                      * EPS32)
                assert ratio <= limit, (precision, ratio)
                if m > n:  # the residual of a square system is zero
                    assert np.isclose(res[i], r @ r, rtol=1e-2), (res[i], r @ r)
                if m * n <= 1 << 18:  # the forward error where random matrices are well conditioned (at 2048² it is
                    # cond(a) x backward error for any float32 solver: BENCHMARKS.md, 2026-11-30)
                    xn = np.linalg.lstsq(a64, b64, rcond=None)[0]
                    assert np.abs(x[i] - xn).max() <= 1e-3 * max(1.0, np.abs(xn).max())


@pytest.mark.parametrize("batch,m,n", [(20, 32, 32), (3, 100, 20), (2, 40, 1), (5, 257, 32)])
def test_qr_fused_q_kernel_every_family(batch, m, n):
    """Shapes whose schedule is one lanes panel with nothing right of it: qr (reduced) is one launch writing Q and R;
    every stress family passes the Q gates, R matches geqrf's, and a non-contiguous input gives the same result."""
    import cupy

    from qrgen.runtime import device_arch, factorizer_for
    from test_qmatrix import _q_gates

    assert factorizer_for(m, n, batch, device_arch(0)).fused_q is not None
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=m + n)
        q, r = qrgen.qr(cupy.asarray(a))
        assert q.shape == (batch, m, n) and r.shape == (batch, n, n)
        factor, orth = _q_gates(a, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (family, factor.max(), orth.max())
        h, _ = qrgen.geqrf(cupy.asarray(a))
        np.testing.assert_allclose(r.get(), np.triu(h.get()[:, :n, :]), rtol=1e-5, atol=1e-6 * max(1.0, abs(a).max()))
    a = stress("random", m, n, batch, seed=3)
    wide = cupy.zeros((batch, m, 2 * n), dtype=cupy.float32)
    wide[:, :, ::2] = cupy.asarray(a)
    q1, r1 = qrgen.qr(cupy.asarray(a))
    q2, r2 = qrgen.qr(wide[:, :, ::2])
    assert cupy.array_equal(q1, q2) and cupy.array_equal(r1, r2)
    torch = pytest.importorskip("torch")
    qt, rt = qrgen.qr(torch.as_tensor(a, device="cuda"))  # torch in, torch out, the same numbers
    assert isinstance(qt, torch.Tensor) and cupy.array_equal(cupy.from_dlpack(qt), q1)
    assert cupy.array_equal(cupy.from_dlpack(rt), r1)
    if batch > 1:  # a NaN in one matrix leaves the others as they were
        bad = a.copy()
        bad[0, m // 2, n // 2] = np.nan
        q3, r3 = qrgen.qr(cupy.asarray(bad))
        assert cupy.array_equal(q3[1:], q1[1:]) and cupy.array_equal(r3[1:], r1[1:])


def test_ormqr_and_householder_product_torch():
    torch = pytest.importorskip("torch")
    a = torch.randn(3, 50, 30, device="cuda")
    h, tau = qrgen.geqrf(a)
    q = qrgen.householder_product(h, tau, complete=True)
    assert isinstance(q, torch.Tensor) and q.shape == (3, 50, 50)
    ref = torch.linalg.householder_product(h.double(), tau.double())
    assert torch.allclose(q[..., :30].double(), ref, atol=1e-4)
    c = torch.randn(3, 50, 4, device="cuda")
    out = qrgen.ormqr(h, tau, c, side="L", transpose=True)
    assert torch.allclose(out.double(), q.double().transpose(-1, -2) @ c.double(), atol=1e-4)


@pytest.mark.parametrize("w", [1, 31, 32, 100, 128, 129, 176, 255, 256])
def test_t_kernel_against_the_reference(w):
    """The T kernel (runtime.tmatrix_gpu): by blocks up to 128 reflectors, by halves past it, against slarft's T in
    float64 from the same G and tau; every entry written (the lower left block of the halves too)."""
    import cupy

    from qrgen import reference
    from qrgen.runtime import tmatrix_gpu

    h, tau = reference.geqrf(stress("random", w + 40, w, 3, seed=w).astype(np.float64))
    v = np.tril(h, -1)
    v[:, np.arange(w), np.arange(w)] = 1
    g = np.swapaxes(v, 1, 2) @ v
    want = reference._tmatrix(g, tau)
    got = tmatrix_gpu(cupy.asarray(g, dtype=cupy.float32), cupy.asarray(tau, dtype=cupy.float32)).get()
    # NumPy's float32 recurrence is off by about 1 eps32 of T's largest entry here (w up to 256)
    assert np.abs(got - want).max() <= 100 * EPS32 * np.abs(want).max(), np.abs(got - want).max()
    assert np.array_equal(np.tril(got, -1), np.zeros_like(got))


def test_cublas_matmul_layouts():
    import cupy

    from qrgen.cublas import matmul

    rng = cupy.random.default_rng(0)
    a = rng.standard_normal((3, 40, 24), dtype=cupy.float32)
    b = rng.standard_normal((3, 24, 17), dtype=cupy.float32)
    for x, y in [(a, b), (a.transpose(0, 2, 1).copy().transpose(0, 2, 1), b), (a, b.transpose(0, 2, 1).copy()
                 .transpose(0, 2, 1)), (a[:, 5:30, 2:20], b[:, 2:20, :]), (a[:1], b)]:
        assert cupy.allclose(matmul(x, y), cupy.matmul(x, y), atol=1e-4)
        big = rng.standard_normal((x.shape[0] if x.shape[0] > 1 else 3, x.shape[1] + 3, y.shape[2] + 5),
                                  dtype=cupy.float32)
        before = big.copy()
        view = big[:, 2:2 + x.shape[1], 1:1 + y.shape[2]]  # in place into a view of a larger array
        assert matmul(x, y, subtract_from=view) is view
        expect = before.copy()
        expect[:, 2:2 + x.shape[1], 1:1 + y.shape[2]] -= cupy.matmul(x, y)
        assert cupy.allclose(big, expect, atol=1e-4)
        assert matmul(x, y, out=view) is view  # written into the view (beta 0), the rest of big untouched
        expect[:, 2:2 + x.shape[1], 1:1 + y.shape[2]] = cupy.matmul(x, y)
        assert cupy.allclose(big, expect, atol=1e-4)
        assert cupy.allclose(matmul(x, y, precision="tf32"), cupy.matmul(x, y), atol=1e-1)  # tf32 inputs allowed
    with pytest.raises(ValueError, match="not both"):
        matmul(a, b, subtract_from=view, out=view)


def test_geqrf_and_qr_captured_in_a_cuda_graph_replay_new_data():
    """A call captured once (CuPy stream capture) and replayed on new input data written into the same array."""
    import cupy

    for m, n in [(64, 48), (300, 200), (100, 20)]:  # (100, 20): qr by the fused Q kernel
        first, second = stress("random", m, n, 4, seed=1), stress("colscaled", m, n, 4, seed=2)
        a = cupy.asarray(first)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            qrgen.geqrf(a), qrgen.qr(a)  # build and allocate the workspaces before capturing
            stream.synchronize()
            stream.begin_capture()
            h, tau = qrgen.geqrf(a)
            q, r = qrgen.qr(a)
            graph = stream.end_capture()
            a.set(second)
            graph.launch(stream)
            stream.synchronize()
        assert check(second, h, tau).ok
        from test_qmatrix import _q_gates

        factor, orth = _q_gates(second, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (factor.max(), orth.max())


@pytest.mark.parametrize("node_priority", [False, True])
@pytest.mark.parametrize("reach", [False, True])
def test_lookahead_on_the_callers_stream_and_in_a_graph(reach, node_priority):
    """A lookahead schedule runs on its own two streams between events on the caller's: queued after the caller's
    earlier work (here a fill it must not overtake), finished before the caller's later work, and capturable: a
    graph replayed on new data gives what an eager call on that data gives (with reach, the side lane's marks
    inside the capture too), instantiated by CuPy or with node priorities (replay.end_capture)."""
    import cupy

    from qrgen.replay import Graph, end_capture
    from qrgen.runtime import Factorizer

    schedule = _aggregated_schedule(1024, 1024, 32, 128, "split", lookahead=2, reach=reach)
    fac = Factorizer(1024, 1024, schedule, "sm_90")
    first, second = stress("random", 1024, 1024, 2, seed=5), mixed(1024, 1024, 2, seed=6)[0]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        a = cupy.empty((2, 1024, 1024), dtype=cupy.float32)
        a.fill(float("nan"))
        a.set(first, stream=stream)
        h, tau = fac(a)
        h2 = h * 1.0  # queued on the caller's stream after the call
        stream.synchronize()
        assert check(first, h2, tau).ok
        a.set(second, stream=stream)
        eager_h, eager_tau = fac(a)
        stream.synchronize()
        a.set(first, stream=stream)
        stream.synchronize()
        stream.begin_capture()
        gh, gtau = fac(a)
        graph = end_capture(stream) if node_priority else stream.end_capture()
        assert isinstance(graph, Graph) == node_priority
        a.set(second, stream=stream)
        graph.launch(stream)
        stream.synchronize()
    assert check(second, gh, gtau).ok
    scale = float(cupy.abs(eager_h).max())
    assert float(cupy.abs(gh - eager_h).max()) <= 1e-5 * scale and float(cupy.abs(gtau - eager_tau).max()) <= 1e-5


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


@pytest.mark.parametrize("m,n,blocks,aggregate,batch,slots", [(8192, 64, 8, 0, 1, 4), (2000, 300, 4, 128, 2, 4),
                                                              (1024, 1024, 8, 128, 2, 4), (600, 600, 2, 0, 3, 4),
                                                              (4096, 96, 8, 0, 1, 1), (2048, 2048, 8, 128, 2, 2),
                                                              (4096, 64, 16, 0, 2, 1)])
def test_cluster_panels_every_family(m, n, blocks, aggregate, batch, slots):
    """Rows panels on a thread-block cluster (partial sums through the blocks' shared memory), with up to `slots`
    rows per thread."""
    import cupy

    from qrgen.runtime import Factorizer
    from qrgen.schedule import Schedule, cluster_panel, default_panel

    k = min(m, n)
    panels, col = [], 0
    while col < k:
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        panels.append(cluster_panel(m - col, min(32, end - col), blocks, slots) or default_panel(m - col, end - col))
        col += panels[-1].width
    schedule = Schedule(m, n, tuple(panels), aggregate=aggregate, panel_update="split" if aggregate else "cublas")
    assert any(p.cluster for p in schedule.panels)
    fac = Factorizer(m, n, schedule, "sm_90")
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=blocks)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"


@pytest.mark.parametrize("m,n,aggregate,batch,blocks", [(300, 200, 0, 3, 0), (100, 64, 0, 5, 0), (8192, 64, 0, 1, 0),
                                                        (8192, 64, 0, 1, 8), (1024, 1024, 128, 2, 0),
                                                        (2000, 300, 128, 2, 4), (40, 100, 0, 3, 0)])
def test_column_loop_panels_every_family(m, n, aggregate, batch, blocks):
    """Warp and rows panels with the column loop not unrolled (Panel.loop): one block, several blocks with flags,
    a cluster, aggregates, wide matrices."""
    import cupy

    from qrgen.runtime import Factorizer
    from qrgen.schedule import Schedule, cluster_panel, default_panel, with_loop

    k = min(m, n)
    panels, col = [], 0
    while col < k:
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        panel = (cluster_panel(m - col, min(32, end - col), blocks) if blocks else None) or default_panel(m - col,
                                                                                                          end - col)
        panels.append(with_loop(panel, True))
        col += panel.width
    schedule = Schedule(m, n, tuple(panels), aggregate=aggregate, panel_update="split" if aggregate else "cublas")
    # (panels of at most 32 rows are lanes panels on one warp, whose loop is their own)
    assert all(p.loop for p in schedule.panels if p.variant != "lanes") and schedule.panels[0].loop
    fac = Factorizer(m, n, schedule, "sm_90")
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=m + n)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"


@pytest.mark.parametrize("batch,m,n", [(6, 300, 120), (3, 90, 130), (40, 176, 176)])
def test_qr_complete_and_reduced_from_kept_panels(batch, m, n):
    """qr's Q from the factorization's own panels (keep plans, runtime.drive_q): both modes on every family, and
    the same Q as qrgen.qmatrix's blocked product of the same h and tau."""
    import cupy

    from test_qmatrix import _q_gates

    from qrgen import qmatrix
    from qrgen.runtime import factorizer_for

    assert factorizer_for(m, n, batch, "sm_90").keep_variant() is not None
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=n)
        for mode in ("reduced", "complete"):
            q, r = qrgen.qr(cupy.asarray(a), mode=mode)
            assert q.shape == (batch, m, m if mode == "complete" else min(m, n))
            factor, orth = _q_gates(a, q.get(), r.get())
            assert (factor <= 20).all() and (orth <= 100).all(), (family, mode, factor.max(), orth.max())
    a = cupy.asarray(stress("random", m, n, batch, seed=3))
    h, tau = qrgen.geqrf(a)
    q, _ = qrgen.qr(a)
    assert float(cupy.abs(q - qmatrix.householder_product(h, tau)).max()) <= 1e-4


def _qr_modes_pass_every_family(fac, batch, seed):
    """qr through `fac` (its keep plan) in both modes passes the Q gates on `batch` matrices of every family."""
    import cupy

    from test_qmatrix import _q_gates

    for family in FAMILIES:
        a = stress(family, fac.m, fac.n, batch, seed=seed)
        for mode in ("reduced", "complete"):
            q, r = qrgen.qr(cupy.asarray(a), mode=mode, factorizer=fac)
            factor, orth = _q_gates(a, q.get(), r.get())
            assert (factor <= 20).all() and (orth <= 100).all(), (family, mode, factor.max(), orth.max())


def test_qr_of_a_reach_schedule():
    """qr through the keep plan of a schedule with reach (each aggregate's merge and products on the side lane,
    merged for Q all the same): both modes pass the gates on every family, and Q is qrgen.qmatrix's of the same h
    and tau."""
    import cupy

    from qrgen import qmatrix
    from qrgen.runtime import Factorizer

    m, n = 600, 520
    fac = Factorizer(m, n, _aggregated_schedule(m, n, 32, 128, "fused", 32, reach=True), "sm_90")
    assert fac.keep_variant() is not None and any(g.c1 > g.a1 for g in fac.keep_variant().aggregates)
    _qr_modes_pass_every_family(fac, 2, seed=12)
    a = cupy.asarray(stress("random", m, n, 3, seed=3))
    h, tau = fac(a)
    q, _ = qrgen.qr(a, factorizer=fac)
    assert float(cupy.abs(q - qmatrix.householder_product(h, tau)).max()) <= 1e-4


def test_qr_q_products_of_kept_aggregates_in_tf32x3(monkeypatch):
    """qr's Q through a keep plan with aggregates of 128 on a schedule whose own products are fp32 (its gemm3
    project and update kernels the keep plan's alone): the gemm3 kernels take every Q product
    (codegen.q_precision), every family passes the gates in both modes, and Q is qrgen.qmatrix's of the same h
    and tau to fp32 accuracy."""
    import cupy

    from qrgen import qmatrix, runtime
    from qrgen.runtime import Factorizer

    launched = []  # per tf32x3 product: whether the gemm3 kernel took it
    gemm3 = runtime._CupyEngine._gemm3
    monkeypatch.setattr(runtime._CupyEngine, "_gemm3", lambda self, *args: launched.append(gemm3(self, *args)) or
                        launched[-1])
    m = n = 512
    fac = Factorizer(m, n, _aggregated_schedule(m, n, 32, 128, "fused", 2), "sm_90")
    own = {k.name for k in fac.kernels if k.variant == "gemm3"}
    assert own <= {"qr_gemm3_gram"}  # at most the gram kernel, for an fp32 G (codegen.gemm3_kinds)
    assert {"qr_gemm3_project", "qr_gemm3_update"} <= {k.name for k in fac.keep_variant().kernels}
    _qr_modes_pass_every_family(fac, 3, seed=11)
    # every Q product aligned and at least 64 in each dimension: none falls back to cuBLAS
    assert launched and all(launched)
    a = cupy.asarray(stress("random", m, n, 4, seed=3))
    h, tau = fac(a)
    q, _ = qrgen.qr(a, factorizer=fac)
    assert float(cupy.abs(q - qmatrix.householder_product(h, tau)).max()) <= 1e-4


@pytest.mark.parametrize("m,n,aggregate,lookahead", [(512, 512, 128, 2), (300, 200, 64, 0), (257, 255, 64, 2)])
def test_tf32x3_products(m, n, aggregate, lookahead, monkeypatch):
    """The aggregates' products as three tf32 products (the gemm3 kernels; 257 x 255 is not 16-byte aligned and
    falls back to cuBLAS in fp32, as the panels' thin products always do): every stress family passes the gates,
    close to the fp32 schedule's result."""
    import dataclasses

    import cupy

    from qrgen import runtime
    from qrgen.runtime import Factorizer
    from qrgen.schedule import Precision

    launched = []  # per tf32x3 product: whether the gemm3 kernel took it
    gemm3 = runtime._CupyEngine._gemm3
    monkeypatch.setattr(runtime._CupyEngine, "_gemm3", lambda self, *args: launched.append(gemm3(self, *args)) or
                        launched[-1])
    fp32 = _aggregated_schedule(m, n, 32, aggregate, "cublas", lookahead)
    split3 = dataclasses.replace(fp32, precision=Precision("fp32", "tf32x3", "tf32x3"))
    fac, ref = Factorizer(m, n, split3, "sm_90"), Factorizer(m, n, fp32, "sm_90")
    assert any(k.variant == "gemm3" for k in fac.kernels)
    a, _ = mixed(m, n, 2 * len(FAMILIES), seed=9)
    h, tau = fac(cupy.asarray(a))
    report = check(a, h, tau)
    assert report.ok, str(report)
    # the aggregates' products where every operand is 16-byte aligned; never a panel's thin ones (cuBLAS)
    assert launched and any(launched) == (m % 4 == 0 and n % 4 == 0) and not all(launched)
    b = cupy.asarray(stress("random", m, n, 4, seed=2))
    assert float(cupy.abs(fac(b)[0] - ref(b)[0]).max()) <= 1e-3 * float(cupy.abs(b).max())


@pytest.mark.parametrize("m,n,batch,aggregate,lookahead", [(1024, 1024, 3, 128, 0), (1024, 1024, 2, 256, 32)])
def test_fp16_products_at_every_scale(m, n, batch, aggregate, lookahead):
    """Schedules with fp16 product inputs scale each matrix by a power of two first (Schedule.scaled): a mixed
    batch at 2^±60 and at 1e±6 passes the gates (fp16 alone: inf past 65504, zero below 6e-8), and R of a 2^p is
    R of a times 2^p, the rest of h and tau as they were. (fp16's rounding alone fails the factor gate below
    about a thousand columns, at any scale: 300 x 200 measured 41.)"""
    import dataclasses

    import cupy

    from qrgen.runtime import Factorizer
    from qrgen.schedule import Precision

    schedule = dataclasses.replace(_aggregated_schedule(m, n, 32, aggregate, "split", lookahead),
                                   precision=Precision("fp16", "fp32", "fp16"))
    assert schedule.scaled
    fac = Factorizer(m, n, schedule, "sm_90")
    a, labels = mixed(m, n, len(FAMILIES), seed=5)
    h0, t0 = fac(cupy.asarray(a))
    assert check(a, h0, t0).ok  # (on the GPU: h is a CuPy array)
    upper = np.zeros((m, n), dtype=bool)
    upper[:min(m, n)] = np.triu(np.ones((min(m, n), n), dtype=bool))
    upper = cupy.asarray(upper)
    for p in (60, -60):
        big = np.ldexp(a, p)
        h, t = fac(cupy.asarray(big))
        assert check(big, h, t).ok, p
        assert float(cupy.abs(h[:, ~upper] - h0[:, ~upper]).max()) <= 1e-6
        assert float(cupy.abs(t - t0).max()) <= 1e-6
        scale = float(cupy.abs(h0).max())
        assert float(cupy.abs(h[:, upper] * 2.0 ** -p - h0[:, upper]).max()) <= 1e-6 * scale
    for factor in (1e6, 1e-6):
        result = _geqrf_checked((a * factor).astype(np.float32), fac)
        assert result.ok, (factor, result)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_committed_fp16_schedules_far_from_unit_scale(batch):
    """The committed 4096² schedules take fp16 products: random matrices at 1e4 (W past fp16's 65504 unscaled)
    and at 1e-6 pass the gates."""
    from qrgen.runtime import factorizer_for

    fac = factorizer_for(4096, 4096, batch, "sm_90")
    assert fac.schedule.scaled
    a = stress("random", 4096, 4096, batch, seed=11)
    for factor in (1e4, 1e-6):
        result = _geqrf_checked((a * factor).astype(np.float32), fac)
        assert result.ok, (factor, result)


@pytest.mark.parametrize("m,n,batch,panels,aggregate", [
    (3000, 48, 1, ((16, 64, 256, False),) * 3, 0),
    (5000, 96, 2, ((32, 128, 256, False),) * 3, 64),
    (20000, 40, 1, ((16, 256, 512, True),) * 2 + ((8, 256, 512, True),), 0),
    (700, 100, 3, ((32, 64, 128, True),) * 3 + ((4, 64, 128, False),), 0),
    (256, 300, 2, ((32, 64, 128, False),) * 8, 128),
    (3000, 37, 2, ((16, 128, 256, True),) * 2 + ((5, 64, 128, False),), 0),
], ids=["3000x48", "5000x96-aggregates", "20000x40-loop", "700x100", "256x300-wide", "3000x37-odd-width"])
def test_tsqr_panels_every_family(m, n, batch, panels, aggregate):
    """tsqr panels (a tree of QRs over row tiles, reflectors rebuilt from Q): one to three levels, with and without
    the columns right of them, aggregates, column loops, a tree of one tile, wide matrices."""
    import cupy

    from qrgen.runtime import Factorizer
    from qrgen.schedule import Panel, Schedule

    schedule = Schedule(m, n, tuple(Panel(w, "tsqr", t, tile=tile, loop=loop) for w, t, tile, loop in panels),
                        aggregate=aggregate)
    fac = Factorizer(m, n, schedule, "sm_90")
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=m + n)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"
    a, _ = mixed(m, n, max(batch, 4), seed=2)
    assert check(a, *fac(cupy.asarray(a))).ok


def test_tsqr_default_and_qr_on_tsqr_schedules():
    """The heuristic's tsqr panels for a tall matrix without a schedule file, and qrgen.qr (its Q from the kept
    panels) and lstsq on the committed tsqr schedule of 100000 x 32."""
    import cupy

    from test_qmatrix import _q_gates

    from qrgen.runtime import factorizer_for

    assert {p.variant for p in factorizer_for(40000, 64, 2, "sm_90").schedule.panels} == {"tsqr"}
    assert {p.variant for p in factorizer_for(100000, 32, 1, "sm_90").schedule.panels} == {"tsqr"}
    for family in FAMILIES:
        a = stress(family, 40000, 64, 2, seed=4)
        assert _geqrf_checked(a).ok, family
        a = stress(family, 100000, 32, 1, seed=5)
        q, r = qrgen.qr(cupy.asarray(a))
        factor, orth = _q_gates(a, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (family, factor.max(), orth.max())
    a = stress("random", 100000, 32, 1, seed=6)
    b = np.random.default_rng(1).standard_normal((1, 100000)).astype(np.float32)
    x, _ = qrgen.lstsq(cupy.asarray(a), cupy.asarray(b))
    xn = np.linalg.lstsq(a[0].astype(np.float64), b[0].astype(np.float64), rcond=None)[0]
    assert np.abs(x.get()[0] - xn).max() <= 1e-3 * max(1.0, np.abs(xn).max())


def test_gemm3_matmul_layouts_and_refusals():
    """runtime.gemm3_matmul (the Q functions' tf32x3 products) against float64: A K-contiguous ("project") and
    M-contiguous (a transposed view: "update"), C a view into a larger array updated in place (alpha -1, beta 1);
    thin or misaligned products are refused with nothing written."""
    import cupy

    from qrgen.runtime import gemm3_matmul

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal((3, 192, 136), dtype=np.float32))
    at = cupy.asarray(rng.standard_normal((3, 136, 192), dtype=np.float32)).transpose(0, 2, 1)
    b = cupy.asarray(rng.standard_normal((3, 136, 200), dtype=np.float32))
    c = cupy.full((3, 192, 200), np.nan, dtype=cupy.float32)
    assert gemm3_matmul(a, b, c, 1.0, 0.0)
    ref = cupy.matmul(a.astype(cupy.float64), b.astype(cupy.float64))
    assert float(cupy.abs(c - ref).max()) <= 1e-5 * float(cupy.abs(ref).max())
    big = cupy.ones((3, 300, 260), dtype=cupy.float32)
    view = big[:, 4:196, 8:208]
    assert gemm3_matmul(at, b, view, -1.0, 1.0)
    ref = 1.0 - cupy.matmul(at.astype(cupy.float64), b.astype(cupy.float64))
    assert float(cupy.abs(view - ref).max()) <= 1e-5 * float(cupy.abs(ref).max())
    outside = cupy.ones_like(big, dtype=cupy.bool_)
    outside[:, 4:196, 8:208] = False
    assert bool((big[outside] == 1.0).all())
    before = big.copy()
    assert not gemm3_matmul(a[:, :, :60], b[:, :60, :], view, 1.0, 0.0)  # depth under GEMM3_MIN
    assert not gemm3_matmul(a, b, big[:, 1:193, 1:201], 1.0, 0.0)  # C not 16-byte aligned
    assert not gemm3_matmul(a, b.transpose(0, 2, 1).copy().transpose(0, 2, 1), view, 1.0, 0.0)  # B column-major
    assert bool((big == before).all())


def test_householder_product_in_tf32x3(monkeypatch):
    """qmatrix.householder_product(precision="tf32x3"): the gemm3 kernels take its wide products (blocks of 128
    and 256), Q passes the gates on every family and stays within fp32's Q's accuracy."""
    import cupy

    from test_qmatrix import _q_gates

    from qrgen import qmatrix

    taken = []
    gemm3 = qmatrix._gemm3
    monkeypatch.setattr(qmatrix, "_gemm3", lambda *args: taken.append(gemm3(*args)) or taken[-1])
    a, labels = mixed(512, 512, len(FAMILIES), seed=21)
    h, tau = qrgen.geqrf(cupy.asarray(a))
    r = np.triu(h.get())
    for block in (128, 256):
        q32 = qmatrix.householder_product(h, tau, block=block)
        q3 = qmatrix.householder_product(h, tau, block=block, precision="tf32x3")
        assert any(taken)
        taken.clear()
        f3, o3 = _q_gates(a, q3.get(), r)
        f32, o32 = _q_gates(a, q32.get(), r)
        assert (f3 <= 20).all() and (o3 <= 100).all(), (labels, f3, o3)
        # The tensor cores' fp32 sums do not round to nearest: measured on the H200 at 512^2, orthogonality 1.3 to
        # 1.8 against fp32's 0.3 to 0.5 (4.1 at 4096^2), a tenth of the gate at most.
        assert o3.max() <= 10 and float(cupy.abs(q3 - q32).max()) <= 1e-4, (o3, o32, cupy.abs(q3 - q32).max())


def test_q_precision_of_qr_and_householder_product(monkeypatch):
    """qr's Q (where no keep plan forms it) and qrgen.householder_product take the gemm3 kernels by default and
    none with precision="fp32"."""
    import cupy

    from qrgen import linalg, qmatrix

    taken = []
    gemm3 = qmatrix._gemm3
    monkeypatch.setattr(qmatrix, "_gemm3", lambda *args: taken.append(gemm3(*args)) or taken[-1])
    monkeypatch.setattr(linalg, "keeps_q", lambda *args: False)
    monkeypatch.setenv("QRGEN_REPLAY", "0")
    a = cupy.asarray(np.random.default_rng(3).standard_normal((2, 384, 384), dtype=np.float32))
    h, tau = qrgen.geqrf(a)
    for precision in (None, "fp32"):
        for call in (lambda: qrgen.qr(a, precision=precision)[0],
                     lambda: qrgen.householder_product(h, tau, precision=precision)):
            q = call()
            assert any(taken) == (precision is None)
            taken.clear()
            assert float(cupy.abs(q.transpose(0, 2, 1) @ q - cupy.eye(384)).max()) <= 1e-4


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_fast_lane_one_launch_calls(kind, monkeypatch):
    """A one-launch shape's second call on a stream takes the fast lane (no DLPack, no stream objects): results
    equal the general path's bit for bit, of the input's kind, with leading dimensions and a contiguous input one
    float off 16-byte alignment; a new stream goes through the general path first; qr's fused kernel likewise."""
    import cupy

    from qrgen import runtime

    if kind == "torch":
        torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    host = rng.standard_normal((2, 10, 32, 32), dtype=np.float32)
    flat = cupy.asarray(np.concatenate([[7.0], host.ravel()]).astype(np.float32))
    arrays = {"aligned": flat[1:].copy().reshape(host.shape), "misaligned": flat[1:].reshape(host.shape)}
    if kind == "torch":
        arrays = {k: torch.from_dlpack(v) for k, v in arrays.items()}
    general = {}
    for name, x in arrays.items():
        general[name] = (qrgen.geqrf(x), qrgen.qr(x))  # the first calls: the general path
    general_path = runtime.as_device_array
    taken = []
    monkeypatch.setattr(runtime, "as_device_array", lambda a: taken.append(1) or general_path(a))
    for name, x in arrays.items():
        taken.clear()
        (h, tau), (q, r) = qrgen.geqrf(x), qrgen.qr(x)
        assert not taken, name  # the kernel's scalar loads take a misaligned input as it is
        for got, want in zip((h, tau, q, r), (*general[name][0], *general[name][1])):
            assert type(got) is type(want) and tuple(got.shape) == tuple(want.shape)
            got, want = (cupy.asarray(v) for v in (got, want))
            assert bool((got == want).all()), name
    h, tau = (cupy.asarray(v) for v in qrgen.geqrf(arrays["aligned"]))
    assert check(host.reshape(-1, 32, 32), h.reshape(-1, 32, 32), tau.reshape(-1, 32)).ok
    if kind == "cupy":
        stream = cupy.cuda.Stream()
        with stream:
            taken.clear()
            qrgen.geqrf(arrays["aligned"])
            assert taken  # a new stream: the general path makes its workspace first
            taken.clear()
            h2, _ = qrgen.geqrf(arrays["aligned"])
            assert not taken
        stream.synchronize()
        assert bool((h2 == h).all())


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
        assert bool((cupy.from_dlpack(h) == want_h).all()) and bool((cupy.from_dlpack(tau) == want_tau).all()), name
        q, r = qrgen.qr(x)
        assert torch.allclose(q @ r, x.detach().resolve_neg(), atol=1e-4), name


def test_back_to_back_time_is_the_kernels_own():
    """qrgen.bench.back_to_back_us: calls captured back to back in one graph cost less a call than one replayed
    graph with the L2 flushed before it (graph launch and cold memory left out), and more than nothing."""
    import cupy

    from qrgen.bench import back_to_back_us, graph_time_us
    from qrgen.runtime import device_arch, factorizer_for

    fac = factorizer_for(32, 32, 20, device_arch(0))
    a = cupy.asarray(stress("random", 32, 32, 20, seed=1))
    b2b = back_to_back_us(lambda: fac(a), calls=50)
    assert 0.0 < b2b < graph_time_us(fac, [a], 10)


@pytest.mark.parametrize("m,n,threads,slice_,loop", [(48, 48, 32, 4, False), (64, 64, 64, 8, False),
                                                     (64, 32, 32, 4, False), (130, 100, 128, 16, True),
                                                     (100, 130, 128, 16, False), (33, 33, 64, 8, False),
                                                     (176, 176, 256, 8, True), (96, 96, 128, 8, False)])
def test_whole_kernel_every_family(m, n, threads, slice_, loop):
    """The whole factorization in one kernel per matrix (Panel variant "whole"): square, tall, wide, min(m, n) no
    multiple of the panels' width, shared memory past 48 KiB with the panels' state (96², 128 threads), on every
    stress family; a NaN in one matrix leaves the others as they were."""
    import cupy

    from qrgen.runtime import Factorizer
    from qrgen.schedule import Panel, Schedule

    fac = Factorizer(m, n, Schedule(m, n, (Panel(min(m, n), "whole", threads, slice=slice_, loop=loop),)), "sm_90")
    for family in FAMILIES:
        a = stress(family, m, n, 5, seed=m + n)
        result = _geqrf_checked(a, fac)
        assert result.ok, f"{family} {fac.schedule.describe()}: {result}"
    a = stress("random", m, n, 6, seed=1)
    h_clean, _ = fac(cupy.asarray(a))
    a[3, m // 2, n // 3] = np.nan
    h, _ = fac(cupy.asarray(a))
    keep = [0, 1, 2, 4, 5]
    assert np.array_equal(cupy.asnumpy(h)[keep], cupy.asnumpy(h_clean)[keep])
    assert np.isnan(cupy.asnumpy(h)[3]).any()


@pytest.mark.parametrize("batch,m,n", [(1000, 48, 48), (1200, 64, 64), (1000, 64, 32)])
def test_default_whole_mixed_batch(batch, m, n):
    """The default for many small matrices (schedule.default_whole) on a batch of every stress family."""
    from qrgen.problem import Problem
    from qrgen.schedule import default_whole

    assert default_whole(Problem(m, n, batch)) is not None
    a, labels = mixed(m, n, batch, seed=batch)
    result = _geqrf_checked(a)
    assert result.ok, f"{batch} x {m}x{n}: {result}"
