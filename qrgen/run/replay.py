"""CUDA-graph replay of host-bound calls: a call of a small shape, or of a few large matrices, queues many launches,
and the host's time to queue them (Python, CuPy, the driver) exceeds the GPU's time to run them.
From the second call of one kind (function, shapes, device, stream) on, such a call copies its inputs into buffers
of its own, replays a CUDA graph captured once from the same launch sequence on those buffers, and copies the
graph's outputs into new arrays for the caller: three to five host operations instead of dozens (or hundreds), for
two copies of the data. Where the GPU, not the host, bounds a call, those copies cost more than they save: at the
capture a replayed call and an eager one are timed on the GPU, each in a stream of calls (_replay_faster), and the
kind keeps its graph only where the replay was the faster (QRGEN_REPLAY=1: always).

The graphs' buffers hold at most HELD_MAX_BYTES of device memory in all (a kind whose capture would pass it runs
eagerly). The graph's temporaries and outputs come from a memory pool of its own, so that nothing allocated after
the capture can take memory the graph still writes; what outlives a graph (the workspace kept for its stream, a
cuBLAS handle's) is made by one eager run before the capture, from the caller's allocator. A plan serves one stream
(replays on it are ordered by the stream; the lock keeps each call's copy-in, replay and copy-out together). Calls
made while the caller's stream is being captured (the caller's own graph) run eagerly, as do calls on a first
call's quick kernels (compile/background.py) and all calls with QRGEN_REPLAY=0 in the environment.

Graphs here (and the benchmark's) are instantiated with node priorities (`end_capture`), as torch.cuda.CUDAGraph
instantiates its own: a lookahead schedule queues its panels' chain on a stream of the highest priority, and a graph
instantiated without them (CuPy's Stream.end_capture) replays every kernel at the priority of the stream it is
launched into, so the side lane's GEMMs take SMs the next panel waits for.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import weakref
from dataclasses import dataclass

from .arrays import device_copy

# Inputs up to this many floats (32 MiB) replay, where the copies in and out cost the GPU less than the host's
# launches would (docs/decisions.md#replay-limits) ...
REPLAY_MAX_FLOATS = 1 << 23
# ... and geqrf up to this many (128 MiB), whose large calls on few matrices queue hundreds of launches
GEQRF_MAX_FLOATS = 1 << 25
REPLAY_PLANS = 32  # kinds tracked at most (a graph holds a copy of its buffers); past them calls run eagerly, once
# the kinds called once and those whose owner is gone are forgotten
HELD_MAX_BYTES = 1 << 30  # device memory the graphs' own buffers may hold in all; a capture past it is dropped
_ENV = "QRGEN_REPLAY"


def enabled() -> bool:
    return os.environ.get(_ENV, "") != "0"


def forced() -> bool:
    """QRGEN_REPLAY=1: every kind that can be replayed keeps its graph, whether or not its replay timed faster."""
    return os.environ.get(_ENV, "") == "1"


@dataclass
class Plan:
    """What replay keeps for one kind of call: its calls so far, and its graph once captured."""
    calls: int = 0
    graph: object = None  # a Graph (or CuPy's) once captured; None before, False if the capture failed
    inputs: tuple = ()
    outputs: tuple = ()
    keep: tuple = ()  # what the graph's memory and launches need alive: the pool, the capture stream, fn's owner
    held: int = 0  # bytes of device memory the graph's inputs and pool hold
    timed: tuple = ()  # (eager µs, replayed µs) as _replay_faster measured them at the capture
    owner: object = None  # a weak reference to the call's owner (a kind whose owner is gone is never called again)


PLANS: dict[tuple, Plan] = {}  # by kind (call's key with the shapes, device and stream)
_LOCK = threading.Lock()


def call(key: tuple, fn, arrays: tuple, stream, owner=None, max_floats: int = REPLAY_MAX_FLOATS) -> tuple:
    """fn(stream, *arrays) -> tuple of CuPy arrays (queued on `stream`, CuPy's current stream here), by replay
    where the arrays hold 1 to max_floats floats (else eagerly). `key` names what fn does (its function and
    configuration); the arrays' shapes, the device and the stream are added to it. `owner`: what fn's launches
    need alive (a runtime.Factorizer), kept with the graph."""
    if (not (enabled() and 0 < sum(a.size for a in arrays) <= max_floats) or stream.is_capturing()
            or getattr(owner, "provisional", False)):  # a first call's quick kernels are not worth a graph
        return fn(stream, *arrays)
    key = key + tuple((a.shape, a.dtype.str) for a in arrays) + (arrays[0].device.id, stream.ptr)
    with _LOCK:
        plan = PLANS.get(key)
        if plan is None:
            if len(PLANS) >= REPLAY_PLANS:  # forget the kinds called once so far (a tuner's trials, say) and
                for k in [k for k, p in PLANS.items() if p.graph is None or _gone(p)]:  # those of owners gone
                    del PLANS[k]
            if len(PLANS) < REPLAY_PLANS:
                plan = PLANS[key] = Plan(owner=None if owner is None else weakref.ref(owner))
        if plan is not None:
            plan.calls += 1
            if plan.graph is None and plan.calls >= 2:  # a kind called once is not worth a graph
                _capture(plan, fn, arrays, owner)
                if plan.graph and not forced() and not _replay_faster(plan, fn):
                    _drop(plan)
            if plan.graph:
                return _replay(plan, arrays, stream)
    return fn(stream, *arrays)


def _gone(plan: Plan) -> bool:
    """Whether the plan's owner no longer exists (its kind, keyed by the owner's serial, cannot come again)."""
    return plan.owner is not None and plan.owner() is None


def _replay(plan: Plan, arrays: tuple, stream) -> tuple:
    """One replayed call on `stream`: the arrays copied into the graph's inputs, the graph, its outputs copied into
    new arrays."""
    for static, a in zip(plan.inputs, arrays):
        device_copy(a, stream, static)
    plan.graph.launch(stream)
    return tuple(device_copy(o, stream) for o in plan.outputs)


def _capture(plan: Plan, fn, arrays: tuple, owner) -> None:
    """Capture fn on buffers of the plan's own; plan.graph stays False where the capture fails (the calls then
    run eagerly)."""
    import cupy

    pool = cupy.cuda.MemoryPool()
    side = cupy.cuda.Stream(non_blocking=True)  # the legacy default stream cannot be captured
    plan.graph, plan.keep = False, (pool, side, owner)  # the stream stays alive: workspaces are kept by its address
    with side:
        with cupy.cuda.using_allocator(pool.malloc):  # the graph's static inputs: its own memory, whatever the
            inputs = tuple(cupy.zeros(a.shape, dtype=a.dtype) for a in arrays)  # caller's allocator (torch's)
        # Once eagerly, outside the graph and its pool: what outlives the graph (the workspace kept for this stream
        # and a cuBLAS handle's workspace, both from CuPy's own pool, loaded kernels) is made and zeroed here.
        fn(side, *inputs)
        side.synchronize()
        try:
            with cupy.cuda.using_allocator(pool.malloc):  # the graph's temporaries and outputs
                side.begin_capture()
                try:
                    outputs = fn(side, *inputs)
                finally:
                    graph = end_capture(side)
        except Exception:  # a launch sequence that cannot be captured runs eagerly (fn raises again if it is wrong)
            return
    held = pool.total_bytes()  # the static inputs, temporaries and outputs
    if held + sum(p.held for p in PLANS.values()) > HELD_MAX_BYTES:  # this kind runs eagerly; its memory goes
        plan.keep = ()
        return
    plan.graph, plan.inputs, plan.outputs, plan.held = graph, inputs, tuple(outputs), held


def _replay_faster(plan: Plan, fn) -> bool:
    """Whether a replayed call (its copies in and out around the graph) took the GPU less time than an eager call.
    Each is timed as the second of two back to back on the capture's stream, so that the host queues it while the
    first runs, as in a stream of calls: the eager call's time holds the host's queueing only where the host is the
    slower. The faster of two such timings each; the inputs are copies of the graph's own (zeros)."""
    import cupy

    side = plan.keep[1]

    def timed(run) -> float:
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        run()
        start.record(side)
        run()
        stop.record(side)
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) * 1e3

    with side:
        sources = tuple(cupy.zeros_like(a) for a in plan.inputs)
        eager = min(timed(lambda: fn(side, *sources)) for _ in range(2))
        replay = min(timed(lambda: _replay(plan, sources, side)) for _ in range(2))
    plan.timed = (eager, replay)
    return replay < eager


def _drop(plan: Plan) -> None:
    """The kind runs eagerly from now on; its graph and the memory it held go."""
    plan.graph, plan.inputs, plan.outputs, plan.keep, plan.held = False, (), (), (), 0


def clear() -> None:
    """Drop every plan (after synchronizing the device, so no replay in flight loses its memory)."""
    import cupy

    with _LOCK:
        if PLANS:
            cupy.cuda.runtime.deviceSynchronize()
        PLANS.clear()


# Graphs are instantiated with node priorities, as torch.cuda.CUDAGraph does (docs/decisions.md#graph-node-priorities)
_USE_NODE_PRIORITY = 8  # cudaGraphInstantiateFlagUseNodePriority


@functools.cache
def driver_instantiate():
    """The CUDA driver's entry point that instantiates a graph with flags (runtime and driver graph handles are the
    same objects; CuPy's runtime module has no such call), or None."""
    try:
        instantiate = ctypes.CDLL("libcuda.so.1").cuGraphInstantiateWithFlags
    except (OSError, AttributeError):
        return None
    instantiate.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong)
    instantiate.restype = ctypes.c_int
    return instantiate


class Graph:
    """An executable CUDA graph instantiated with node priorities; launch(stream) like cupy.cuda.Graph's (through
    CuPy's runtime binding, which costs the host less than a ctypes call)."""

    def __init__(self, graph: int):
        import cupy

        handle = ctypes.c_void_p()
        status = driver_instantiate()(ctypes.byref(handle), graph, _USE_NODE_PRIORITY)
        cupy.cuda.runtime.graphDestroy(graph)  # the executable graph no longer needs it
        if status:
            raise RuntimeError(f"cuGraphInstantiateWithFlags failed with CUDA error {status}")
        self._exec = handle.value
        self._launch, self._destroy = cupy.cuda.runtime.graphLaunch, cupy.cuda.runtime.graphExecDestroy

    def launch(self, stream=None) -> None:
        import cupy

        self._launch(self._exec, (cupy.cuda.get_current_stream() if stream is None else stream).ptr)

    def __del__(self, is_finalizing=sys.is_finalizing):
        # at interpreter exit the process's graphs go with its CUDA context, and CuPy's modules may be gone already
        # (as may this module's globals, sys among them: hence the bound is_finalizing)
        if getattr(self, "_exec", None) and not is_finalizing():
            self._destroy(self._exec)


def end_capture(stream):
    """End `stream`'s capture (begun with stream.begin_capture()) into a graph whose kernels keep the priorities of
    the streams they were captured from; CuPy's own graph where the driver library cannot be loaded."""
    if driver_instantiate() is None:
        return stream.end_capture()
    import cupy

    return Graph(cupy.cuda.runtime.streamEndCapture(stream.ptr))
