"""GPU layer, for the architectures that are not here: the schedules qrgen picks for sm_80 (A100), sm_89 (L40,
RTX 40; 99 KB of shared memory a block, so aggregates of 64 columns) and sm_120 (RTX 50; clusters of at most 8),
compiled for this GPU, pass the gates on every stress family; that is those code paths' correctness. And the PTX
path a GPU newer than qrgen knows takes: the driver compiles the kernels."""
import numpy as np
import pytest

from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed
from qrgen.problem import Problem
from qrgen.run.factorizer import Factorizer
from qrgen.run.launch import device_target
from qrgen.schedule.files import find
from qrgen.targets import Target

pytestmark = pytest.mark.gpu

CASES = [(20, 32, 32), (40, 176, 176), (40, 352, 352), (640, 512, 512), (3, 100, 60), (1000, 64, 64)]
SLOW_CASES = [(60, 1024, 1024), (8, 2048, 2048), (2, 4096, 4096), (1, 8192, 512), (1, 4096, 1024), (1, 100000, 32),
              (1, 40000, 256)]


def _every_family(arch, batch, m, n):
    import cupy

    here = device_target(cupy.cuda.Device().id)
    schedule, origin = find(Problem(m, n, batch), Target("cuda", arch))
    fac = Factorizer(m, n, schedule, here)  # the other arch's choices, compiled for this GPU
    a, labels = mixed(m, n, len(FAMILIES), seed=m + n + batch)
    step = len(a) if m * n <= 1024 * 1024 else 2
    for i in range(0, len(a), step):
        h, tau = fac(cupy.asarray(a[i:i + step]))
        result = check(a[i:i + step], h, tau)
        assert result.ok, f"{arch} {batch}x{m}x{n} ({origin}: {schedule.describe()}) {labels[i:i + step]}: {result}"
    return schedule


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_120"])
@pytest.mark.parametrize("batch,m,n", CASES)
def test_other_arch_schedules_pass_every_family(arch, batch, m, n):
    schedule = _every_family(arch, batch, m, n)
    if arch != "sm_120":
        assert not any(p.cluster for p in schedule.panels)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
@pytest.mark.parametrize("batch,m,n", SLOW_CASES)
def test_other_arch_schedules_pass_every_family_large(arch, batch, m, n):
    schedule = _every_family(arch, batch, m, n)
    if arch == "sm_89":
        assert schedule.aggregate <= 64


def test_ptx_for_a_newer_gpu_runs_through_the_driver():
    import cupy

    here = device_target(cupy.cuda.Device().id)
    jit = Target("cuda", here.arch, ptx=True)
    for batch, m, n in ((5, 176, 176), (3, 1024, 1024)):
        schedule, _ = find(Problem(m, n, batch), here)
        a, labels = mixed(m, n, len(FAMILIES), seed=7)
        fac = Factorizer(m, n, schedule, jit)
        assert all(b.cubin.endswith(b"\0") and b".version" in b.cubin for b in fac.build())
        h, tau = fac(cupy.asarray(a))
        result = check(a, h, tau)
        assert result.ok, f"PTX {batch}x{m}x{n}: {result}"
        h2, tau2 = Factorizer(m, n, schedule, here)(cupy.asarray(a))
        assert np.allclose(cupy.asnumpy(h), cupy.asnumpy(h2), rtol=1e-4, atol=1e-5)
