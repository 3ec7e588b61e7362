"""GPU layer: CUDA-graph replay of host-bound calls (qrgen.run.replay): replayed calls give what eager ones give,
call after call, on several streams, without one call's results overwriting another's, within the graphs' memory
bound. (Which calls take it, without a GPU: tests/cpu/test_replay_rules.py.)"""
import numpy as np
import pytest

import qrgen
from gates import q_gates
from qrgen.numerics.check import check
from qrgen.numerics.stress import mixed, stress
from qrgen.run import replay

pytestmark = pytest.mark.gpu


def _plans(kind):
    return [p for k, p in replay.PLANS.items() if k[0] == kind]


@pytest.mark.parametrize("m,n,batch", [(176, 176, 5), (300, 200, 3), (20000, 32, 1)])
def test_replayed_calls_match_eager_ones(monkeypatch, m, n, batch):
    import cupy

    replay.clear()
    inputs = [cupy.asarray(stress(f, m, n, batch, seed=i)) for i, f in enumerate(("random", "rowscaled", "rankdef"))]
    monkeypatch.setenv("QRGEN_REPLAY", "0")
    eager = [qrgen.geqrf(a) for a in inputs]
    eager_qr = [qrgen.qr(a) for a in inputs]
    monkeypatch.setenv("QRGEN_REPLAY", "1")
    got = [qrgen.geqrf(a) for a in inputs + inputs]  # the first call eager, the second captures, then replays
    got_qr = [qrgen.qr(a) for a in inputs + inputs]
    assert all(p.graph for p in _plans("geqrf") + _plans("qr")) and len(_plans("qr")) == 1
    for i, (h, tau) in enumerate(got):  # every result still its own input's: not overwritten by later calls
        eh, etau = eager[i % 3]
        scale = float(cupy.abs(eh).max())
        assert float(cupy.abs(h - eh).max()) <= 1e-5 * scale and float(cupy.abs(tau - etau).max()) <= 1e-5
        assert check(inputs[i % 3].get(), h, tau).ok
    for i, (q, r) in enumerate(got_qr):
        factor, orth = q_gates(inputs[i % 3].get(), q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (factor.max(), orth.max())
        assert float(cupy.abs(q - eager_qr[i % 3][0]).max()) <= 1e-4


def test_replay_keeps_to_its_memory_bound(monkeypatch):
    """A kind whose graph would hold more than HELD_MAX_BYTES of device memory runs eagerly (its capture dropped,
    nothing held), with the right results; under the bound the same kind replays, its memory counted."""
    import cupy

    replay.clear()
    a = cupy.asarray(stress("random", 300, 200, 8, seed=1))  # 1.9 MB in, as much out
    monkeypatch.setattr(replay, "HELD_MAX_BYTES", 1 << 20)
    for _ in range(3):
        h, tau = qrgen.geqrf(a)
        assert check(a.get(), h, tau).ok
    plans = _plans("geqrf")
    assert plans and all(p.graph is False and p.held == 0 and not p.inputs for p in plans)
    monkeypatch.setattr(replay, "HELD_MAX_BYTES", 1 << 30)
    monkeypatch.setenv("QRGEN_REPLAY", "1")  # kept whether or not it timed faster
    replay.clear()
    for _ in range(3):
        h, tau = qrgen.geqrf(a)
        assert check(a.get(), h, tau).ok
    assert _plans("geqrf") and all(p.graph and p.held >= 2 * a.nbytes for p in _plans("geqrf"))
    replay.clear()


@pytest.mark.parametrize("m,n,batch", [(256, 256, 40), (1024, 1024, 2)])
def test_replay_kept_where_it_timed_faster(monkeypatch, m, n, batch):
    """By default a kind keeps its graph only where its replay timed faster than an eager call at the capture (both
    times recorded); either way the calls give the right results."""
    import cupy

    monkeypatch.delenv("QRGEN_REPLAY", raising=False)
    replay.clear()
    a = cupy.asarray(stress("random", m, n, batch, seed=2))
    for _ in range(3):
        h, tau = qrgen.geqrf(a)
        assert check(a.get(), h, tau).ok
    (plan,) = _plans("geqrf")
    eager, replayed = plan.timed
    assert eager > 0 and replayed > 0
    assert bool(plan.graph) == (replayed < eager)
    assert plan.graph or (plan.held == 0 and not plan.inputs)
    replay.clear()


def test_replay_per_stream_and_for_torch():
    """Calls alternating between two streams keep to their own plans; torch tensors on torch's stream replay too."""
    import cupy

    torch = pytest.importorskip("torch")
    replay.clear()
    a, _ = mixed(176, 100, 6, seed=3)  # several launches (a one-launch call takes the fast lane, with no plan)
    b, _ = mixed(176, 100, 6, seed=4)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    results = []
    for i in range(6):
        with streams[i % 2]:
            x = cupy.asarray(a if i % 3 else b)
            results.append((x.get(), *qrgen.geqrf(x)))
    for s in streams:
        s.synchronize()
    assert len(_plans("geqrf")) == 2
    for x, h, tau in results:
        assert check(x, h, tau).ok
    c = stress("random", 176, 176, 6, seed=5)  # lstsq: full rank
    t = torch.from_numpy(c).cuda()
    for _ in range(3):
        q, r = qrgen.qr(t)
        assert isinstance(q, torch.Tensor)
        factor, orth = q_gates(c, q.cpu().numpy(), r.cpu().numpy())
        assert (factor <= 20).all() and (orth <= 100).all()
    x, res = qrgen.lstsq(t, t[..., 0])
    for _ in range(2):
        x2, res2 = qrgen.lstsq(t, t[..., 0])
    assert torch.allclose(x, x2, atol=1e-4) and torch.allclose(res, res2, atol=1e-3)
    expect = np.zeros((6, 176), dtype=np.float32)
    expect[:, 0] = 1.0  # b is a's first column
    assert np.allclose(x2.cpu().numpy(), expect, atol=1e-3)


def test_replayed_q_functions_match_eager_ones(monkeypatch):
    """householder_product and ormqr replay too: three calls on different factorizations, each equal to the eager
    call's result and not overwritten by the next."""
    import cupy

    replay.clear()
    facts = [qrgen.geqrf(cupy.asarray(stress(f, 176, 176, 4, seed=i))) for i, f in enumerate(("random", "banded"))]
    c = cupy.asarray(stress("random", 176, 30, 4, seed=9))
    monkeypatch.setenv("QRGEN_REPLAY", "0")
    eager = [(qrgen.householder_product(h, tau), qrgen.ormqr(h, tau, c, "L", True)) for h, tau in facts]
    monkeypatch.setenv("QRGEN_REPLAY", "1")
    got = [(qrgen.householder_product(h, tau), qrgen.ormqr(h, tau, c, "L", True)) for h, tau in facts * 2]
    assert all(p.graph for p in _plans("householder_product") + _plans("ormqr"))
    for i, (q, qtc) in enumerate(got):
        eq, eqtc = eager[i % 2]
        assert float(cupy.abs(q - eq).max()) <= 1e-5 and float(cupy.abs(qtc - eqtc).max()) <= 1e-4
