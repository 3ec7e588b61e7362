"""GPU layer, Metal: the rendered Metal kernels of the default Apple schedules run on this GPU through the CUDA
translation layer (qrgen/compile/msl.to_cuda: a threadgroup a block, a SIMD group a warp, Apple's limits on every
dispatch) and pass the gates on every stress family, at the reference batches and tall shapes (tsqr panels for the
tallest). No Apple GPU has run
them: this and the CPU layer (tests/cpu/test_metal.py) are what verifies them."""
import pytest

from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed

pytestmark = pytest.mark.gpu

CASES = [(20, 32, 32), (40, 176, 176), (40, 352, 352), (640, 512, 512), (1, 4096, 32), (3, 100, 300)]
SLOW_CASES = [(60, 1024, 1024), (8, 2048, 2048), (2, 4096, 4096), (1, 4096, 1024), (1, 8192, 512)]
TSQR_CASES = [(1, 100000, 32), (1, 40000, 256), (1, 20000, 100)]  # tsqr panels (schedule/apple.panel_schedule)


@pytest.fixture(scope="module")
def device():
    from qrgen.run.msl_devices import CudaDevice

    return CudaDevice()


def _every_family(device, batch, m, n, precision=None, gates=(20, 100)):
    """Every stress family (at least `batch` matrices) within the gates; precision: the default schedule's GEMMs
    with these inputs. The worst (factor, orthogonality)."""
    import dataclasses

    from qrgen.problem import Problem
    from qrgen.run import metal_engine
    from qrgen.schedule.files import find
    from qrgen.targets import Target

    schedule = None
    if precision is not None:
        schedule = dataclasses.replace(find(Problem(m, n, batch), Target.parse("apple9"))[0], precision=precision)
    a, labels = mixed(m, n, max(batch, len(FAMILIES)), seed=m + n + batch)
    step = len(a) if m * n <= 1024 * 1024 else 2
    worst = (0.0, 0.0)
    for i in range(0, len(a), step):
        h, tau = metal_engine.geqrf(a[i:i + step], device, schedule)
        result = check(a[i:i + step], h, tau, *gates, device="gpu")
        assert result.ok, f"{batch}x{m}x{n} {precision} {labels[i:i + step]}: {result}"
        worst = tuple(max(w, r) for w, r in zip(worst, result.worst()))
    return worst


@pytest.mark.parametrize("batch,m,n", CASES)
def test_metal_kernels_on_cuda_pass_every_family(device, batch, m, n):
    _every_family(device, batch, m, n)


@pytest.mark.slow
@pytest.mark.parametrize("batch,m,n", SLOW_CASES)
def test_metal_kernels_on_cuda_pass_every_family_large(device, batch, m, n):
    _every_family(device, batch, m, n)


@pytest.mark.slow
@pytest.mark.parametrize("batch,m,n", TSQR_CASES)
def test_metal_tsqr_panels_on_cuda_pass_every_family(device, batch, m, n):
    from qrgen.problem import Problem
    from qrgen.schedule.files import find
    from qrgen.targets import Target

    assert find(Problem(m, n, batch), Target.parse("apple9"))[0].panels[0].variant == "tsqr"
    _every_family(device, batch, m, n)


@pytest.mark.slow
def test_metal_q_of_tsqr_panels_on_cuda(device):
    import numpy as np

    from qrgen.numerics.stress import stress
    from qrgen.run import metal_engine

    a = stress("nearrankdef", 20000, 100, 2, seed=7)
    q, r = metal_engine.qr(a, device)
    q, r, a = (x.astype(np.float64) for x in (q, r, a))
    eps, norm = np.finfo(np.float32).eps, lambda x: np.abs(x).sum(-2).max(-1)  # the 1-norm, as the gates take it
    assert (norm(q @ r - a) <= 20 * 100 * eps * norm(a)).all()
    assert (norm(np.swapaxes(q, 1, 2) @ q - np.eye(100)) <= 100 * 100 * eps).all()


def test_metal_q_on_cuda(device):
    import numpy as np

    from qrgen.numerics.stress import stress
    from qrgen.run import metal_engine

    a = stress("collinear", 300, 200, 3, seed=1)
    q, r = metal_engine.qr(a, device)
    assert np.abs(q @ r - a).max() <= 1e-4 * np.abs(a).max()
    assert np.abs(np.swapaxes(q, 1, 2) @ q - np.eye(200)).max() <= 1e-4


def test_metal_q_functions_and_lstsq_on_cuda(device):
    import numpy as np

    from qrgen.numerics.stress import stress
    from qrgen.run import metal_runtime as mr

    a = stress("rankdef", 500, 300, 4, seed=3)
    h, tau = mr.geqrf(a, device)
    q = mr.householder_product(h, tau, False, device)
    assert np.abs(q @ np.triu(h[:, :300, :]) - a).max() <= 1e-4 * np.abs(a).max()
    c = stress("random", 500, 7, 4, seed=1)
    qtc = mr.ormqr(h, tau, c, "L", True, device)  # (Q^T C)'s first 300 rows are the reduced Q's
    assert np.abs(qtc[:, :300] - np.swapaxes(q, 1, 2) @ c).max() <= 1e-4
    b = stress("random", 500, 3, 4, seed=2)
    a = stress("random", 500, 300, 4, seed=4)
    x, _ = mr.lstsq(a, b, device)
    want = np.stack([np.linalg.lstsq(a[i].astype(np.float64), b[i], rcond=None)[0] for i in range(4)])
    assert np.abs(x - want).max() <= 1e-3 * np.abs(want).max()


# Half inputs (fp32 G), the Apple default from 2048 rows where m <= n (schedule/apple.HALF_FROM): every family within
# the tuner's margin (10, 50). At 1024² they are not (decisions#apple-defaults).
HALF = [(8, 2048, 2048), (2, 4096, 4096), (2, 2048, 3000)]


@pytest.mark.slow
@pytest.mark.parametrize("batch,m,n", HALF)
def test_metal_half_products_on_cuda_pass_every_family_with_margin(device, batch, m, n):
    from qrgen.schedule.model import Precision

    print(_every_family(device, batch, m, n, Precision("fp32", "fp16", "fp16"), gates=(10, 50)))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_metal_reduced_products_on_cuda_as_the_reference_rounds(device, precision):
    """2048², the worst families at 1024²: the kernels' factor residual within 1.5x (+1) of the NumPy reference's
    with the same rounding (bf16 about 25 to 40 there: over the gate, which is why no default takes bf16)."""
    import dataclasses

    import numpy as np

    from qrgen.numerics import reference
    from qrgen.numerics.stress import stress
    from qrgen.problem import Problem
    from qrgen.run import metal_engine
    from qrgen.schedule.files import find
    from qrgen.schedule.model import Precision
    from qrgen.targets import Target

    schedule = dataclasses.replace(find(Problem(2048, 2048, 1), Target.parse("apple9"))[0],
                                   precision=Precision("fp32", precision, precision))
    for i, family in enumerate(("rowscaled", "banded", "random")):
        a = stress(family, 2048, 2048, 1, seed=i)
        got = check(a, *metal_engine.geqrf(a, device, schedule), device="gpu")
        want = check(a, *reference.geqrf(a, schedule, dtype=np.float32))
        print(family, got.worst(), want.worst())
        assert np.isfinite(got.factor).all() and got.worst()[1] <= 100
        assert got.worst()[0] <= 1.5 * want.worst()[0] + 1, f"{family}: {got} against the reference's {want}"
