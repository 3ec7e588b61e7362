"""GPU layer: a first call with an empty cache runs on quick binaries (qrgen.compile.background) that pass the gates
on every stress family, changes to the optimized binaries once they are in, captures no replay graph of the quick
ones, and inside a caller's capture waits for the optimized ones, so that the caller's graph holds those."""
import numpy as np
import pytest

from qrgen.compile import background
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed
from qrgen.problem import Problem
from qrgen.run import replay
from qrgen.run.factorizer import Factorizer
from qrgen.run.launch import device_target
from qrgen.schedule.files import find

pytestmark = pytest.mark.gpu

# a wide lanes panel (one warp a matrix), lanes (one block), rows with aggregates, tsqr, rows on clusters
CASES = [(2 * len(FAMILIES), 64, 64), (len(FAMILIES), 176, 176), (len(FAMILIES), 1024, 1024),
         (1, 20000, 100), (1, 8192, 512), (len(FAMILIES), 300, 200)]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("QRGEN_FIRST_CALL", "quick")


def fresh(m: int, n: int, batch: int) -> Factorizer:
    import cupy

    here = device_target(cupy.cuda.Device().id)
    schedule, _ = find(Problem(m, n, batch), here)
    return Factorizer(m, n, schedule, here)


class HeldJob(background.Job):
    """A second tier that is not done until the test says so."""
    release = False

    def done(self) -> bool:
        return HeldJob.release and super().done()


@pytest.mark.parametrize("batch,m,n", CASES)
def test_quick_then_optimized_binaries_pass_the_gates(empty_cache, batch, m, n):
    import cupy

    host = mixed(m, n, batch, seed=5)[0] if batch > 1 else np.random.default_rng(5).standard_normal(
        (1, m, n), dtype=np.float32)
    a = cupy.asarray(host)
    fac = fresh(m, n, batch)
    h, tau = fac(a)
    assert fac.binaries and all(b.quick for b in fac.binaries)
    assert check(host, h, tau).ok
    fac.finish()
    assert not fac.provisional and not any(b.quick for b in fac.binaries)
    h2, tau2 = fac(a)
    assert check(host, h2, tau2).ok


def test_no_replay_graph_of_quick_binaries(empty_cache, monkeypatch):
    import cupy

    monkeypatch.setattr(background, "Job", HeldJob)
    monkeypatch.setenv("QRGEN_REPLAY", "1")  # a graph kept once the optimized kernels are in, timed faster or not
    HeldJob.release = False
    replay.clear()  # room for this factorizer's plan (earlier tests' decided plans stay: replay.REPLAY_PLANS)
    host, _ = mixed(1024, 1024, 3, seed=6)
    a = cupy.asarray(host)
    fac = fresh(1024, 1024, 3)
    assert len(fac.launches) > 1  # a kind that replays from its second call
    for _ in range(3):
        h, tau = fac(a)
    assert fac.provisional
    assert not [p for key, p in replay.PLANS.items() if key[1] == fac.serial and p.graph]
    HeldJob.release = True
    fac.finish()
    for _ in range(3):
        h2, tau2 = fac(a)
    assert [p for key, p in replay.PLANS.items() if key[1] == fac.serial and p.graph]  # now it does
    assert check(host, h, tau).ok and check(host, h2, tau2).ok
    replay.clear()


def test_a_capture_during_the_quick_tier_holds_the_optimized_kernels(empty_cache, monkeypatch):
    import cupy

    monkeypatch.setattr(background, "Job", HeldJob)
    HeldJob.release = False
    host, _ = mixed(176, 176, len(FAMILIES), seed=7)
    a = cupy.asarray(host)
    fac = fresh(176, 176, len(FAMILIES))
    stream = cupy.cuda.Stream(non_blocking=True)
    static = a.copy()
    with stream:
        fac(a)  # eager, quick, on the stream captured next (its workspace kept for that stream)
    assert fac.provisional
    HeldJob.release = True  # the capture waits for the job (it would otherwise wait forever)
    with stream:
        stream.begin_capture()
        h, tau = fac(static)
        graph = stream.end_capture()
    assert not fac.provisional and not any(b.quick for b in fac.binaries)
    fresh_host, _ = mixed(176, 176, len(FAMILIES), seed=8)
    static[...] = cupy.asarray(fresh_host)
    cupy.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    h_eager, tau_eager = fac(static)
    assert check(fresh_host, h, tau).ok
    assert bool((h == h_eager).all()) and bool((tau == tau_eager).all())  # the graph runs the optimized kernels


def test_a_torch_capture_during_the_quick_tier(empty_cache, monkeypatch):
    torch = pytest.importorskip("torch")
    import qrgen.torch  # noqa: F401  the custom ops

    monkeypatch.setattr(background, "Job", HeldJob)
    HeldJob.release = False
    host, _ = mixed(352, 352, len(FAMILIES), seed=9)
    fac = fresh(352, 352, len(FAMILIES))
    static = torch.from_numpy(host).cuda()
    fac(static)  # eager, quick
    assert fac.provisional
    HeldJob.release = True
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # capture_error_mode "global"
        h, tau = fac(static)
    assert not fac.provisional
    fresh_host, _ = mixed(352, 352, len(FAMILIES), seed=10)
    static.copy_(torch.from_numpy(fresh_host))
    graph.replay()
    torch.cuda.synchronize()
    assert check(fresh_host, h.cpu().numpy(), tau.cpu().numpy()).ok
    h_eager, tau_eager = fac(static)
    assert torch.equal(h, h_eager) and torch.equal(tau, tau_eager)
