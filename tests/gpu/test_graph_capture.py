"""GPU layer: calls captured in the caller's CUDA graph and replayed on new data, and a lookahead schedule's two
streams ordered between the caller's work (eagerly and captured, with node priorities or CuPy's instantiation)."""
import pytest

import qrgen
from gates import q_gates
from gpu_cases import aggregated_schedule
from qrgen.numerics.check import check
from qrgen.numerics.stress import mixed, stress
from qrgen.run.factorizer import Factorizer
from qrgen.run.replay import Graph, end_capture
from qrgen.targets import Target

pytestmark = pytest.mark.gpu


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
        factor, orth = q_gates(second, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (factor.max(), orth.max())


@pytest.mark.parametrize("node_priority", [False, True])
@pytest.mark.parametrize("reach", [False, True])
def test_lookahead_on_the_callers_stream_and_in_a_graph(reach, node_priority):
    """A lookahead schedule runs on its own two streams between events on the caller's: queued after the caller's
    earlier work (here a fill it must not overtake), finished before the caller's later work, and capturable: a
    graph replayed on new data gives what an eager call on that data gives (with reach, the side lane's marks
    inside the capture too), instantiated by CuPy or with node priorities (run.replay.end_capture)."""
    import cupy

    schedule = aggregated_schedule(1024, 1024, 32, 128, "rowsplit", lookahead=2, reach=reach)
    fac = Factorizer(1024, 1024, schedule, Target("cuda", "sm_90"))
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
