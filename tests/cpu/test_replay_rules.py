"""CPU layer: which calls CUDA-graph replay (qrgen.run.replay) takes and which run eagerly, the one-launch rule
that keeps single launches out of it, and end_capture without the driver library; no GPU needed (the replayed
calls themselves: tests/gpu/test_replay.py)."""
import numpy as np

from qrgen.run import replay
from qrgen.run.registry import factorizer_for
from qrgen.targets import Target


class _Arr:
    def __init__(self, size):
        self.size = size
        self.shape = (size,)
        self.dtype = np.dtype(np.float32)
        self.device = type("Device", (), {"id": 0})()


class _Stream:
    ptr = 0

    def __init__(self, capturing=False):
        self.capturing = capturing

    def is_capturing(self):
        return self.capturing


def test_which_calls_run_eagerly(monkeypatch):
    """Eager (fn called at once, no plan made): no input, past the size limit, while the stream is captured, or
    with QRGEN_REPLAY=0."""
    monkeypatch.delenv("QRGEN_REPLAY", raising=False)
    assert replay.enabled()
    replay.clear()

    def fn(stream, *arrays):
        return ("eager", len(arrays))

    limit = replay.REPLAY_MAX_FLOATS
    assert replay.call(("t",), fn, (_Arr(0),), _Stream()) == ("eager", 1)
    assert replay.call(("t",), fn, (_Arr(limit), _Arr(1)), _Stream()) == ("eager", 2)
    assert replay.call(("t",), fn, (_Arr(5),), _Stream(), max_floats=4) == ("eager", 1)
    assert replay.call(("t",), fn, (_Arr(5),), _Stream(capturing=True)) == ("eager", 1)
    assert not replay.forced()  # by default a graph is kept where it timed faster
    monkeypatch.setenv("QRGEN_REPLAY", "1")
    assert replay.enabled() and replay.forced()
    monkeypatch.setenv("QRGEN_REPLAY", "0")
    assert not replay.enabled() and not replay.forced()
    assert replay.call(("t",), fn, (_Arr(5),), _Stream()) == ("eager", 1)
    assert not replay.PLANS
    # kinds called once do not use up the plans: past REPLAY_PLANS they are forgotten, and a new kind still gets one
    monkeypatch.delenv("QRGEN_REPLAY")
    for i in range(replay.REPLAY_PLANS + 8):
        assert replay.call(("once", i), fn, (_Arr(5),), _Stream()) == ("eager", 1)
    assert len(replay.PLANS) <= replay.REPLAY_PLANS
    assert next(reversed(replay.PLANS))[:2] == ("once", replay.REPLAY_PLANS + 7)
    replay.PLANS.clear()  # (replay.clear() would synchronize a device; none of these plans holds a graph)


def test_one_launch_factorizers():
    """The one-launch rule on real schedules: one lanes or cols panel reading its input is one launch; panels with
    products, tsqr's phases or the power-of-two scaling are not."""
    target = Target("cuda", "sm_90")
    assert factorizer_for(32, 32, 20, target).one_launch
    assert factorizer_for(176, 176, 40, target).one_launch
    assert not factorizer_for(352, 352, 40, target).one_launch
    assert not factorizer_for(100000, 32, 1, target).one_launch


def test_end_capture_without_the_driver_library_is_cupys(monkeypatch):
    """Where libcuda cannot be loaded (no driver), end_capture leaves the capture to CuPy's Stream.end_capture."""
    monkeypatch.setattr(replay, "driver_instantiate", lambda: None)
    stream = _Stream()
    stream.end_capture = lambda: "cupy's graph"
    assert replay.end_capture(stream) == "cupy's graph"


def test_factorizers_never_share_a_plan_key():
    """Replay plans are keyed by a factorizer's serial, which no other factorizer of the process has: an id() is
    reused once its object is gone, and a new factorizer would find the plan decided (eager, say) for the old one."""
    import gc

    from qrgen.run.factorizer import Factorizer

    target = Target("cuda", "sm_90")
    schedule = factorizer_for(352, 352, 40, target).schedule
    seen = set()
    for _ in range(5):
        fac = Factorizer(352, 352, schedule, target)
        assert fac.serial not in seen
        seen.add(fac.serial)
        del fac
        gc.collect()


def test_plans_of_owners_gone_make_room():
    """Past REPLAY_PLANS kinds, those whose owner no longer exists (decided, eager or not, for a factorizer that is
    gone) are forgotten too, so that a new factorizer's kind still gets a plan; an owner alive keeps its plan."""
    import gc
    import weakref

    class Owner:
        pass

    replay.PLANS.clear()
    alive = Owner()
    replay.PLANS[("alive",)] = replay.Plan(calls=2, graph=False, owner=weakref.ref(alive))
    for i in range(replay.REPLAY_PLANS - 1):
        gone = Owner()
        replay.PLANS[("gone", i)] = replay.Plan(calls=2, graph=False, owner=weakref.ref(gone))
        del gone
    gc.collect()
    assert len(replay.PLANS) == replay.REPLAY_PLANS
    assert replay.call(("new",), lambda stream, *a: ("eager",), (_Arr(5),), _Stream(), Owner()) == ("eager",)
    assert ("alive",) in replay.PLANS and next(reversed(replay.PLANS))[0] == "new"
    assert not [k for k in replay.PLANS if k[0] == "gone"]
    replay.PLANS.clear()
