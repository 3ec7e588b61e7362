"""What a factorization keeps between calls on one device, batch and stream: its work buffers (run/buffers.py),
packed launch arguments, and the two streams of a lookahead schedule (or of t_late aggregates)."""
from __future__ import annotations

import contextlib

from ..plan import rowsplit
from ..targets.cuda import GRID_YZ
from .buffers import Sizes, buffer_names, gram_parts, w_parts
from .launch import PackedArgs, sm_count
from .recorded import Direct, Recorded

class Workspace:
    """Buffers the launch sequence needs beside h and tau, kept between calls."""

    def __init__(self, fac, batch: int, device_id: int):
        import cupy

        # The kernels this workspace runs: a cooperative launch's chunk below depends on their occupancy, so a
        # first call's change to the optimized binaries (Factorizer.functions) comes with new workspaces.
        funcs = self.funcs = fac.functions(device_id, batch)
        self.chunk = batch
        for launch in fac.launches:
            if launch.blocks > 1 and not launch.cluster:  # cooperative: every block of the chunk resident
                _, func = funcs[launch.kernel]
                per_pass = max(1, fac.capacity(func, launch.threads, device_id) // launch.blocks)
                self.chunk = min(self.chunk, per_pass)
        if any(L.levels for L in fac.launches) or fac.schedule.panel_update in ("rowsplit", "fused"):
            self.chunk = min(self.chunk, GRID_YZ)  # tsqr and fused launches put the matrices in grid.y
        self.sizes = Sizes.of(fac)
        self.buffers = {name: cupy.empty((self.chunk, self.sizes.floats(name)), dtype=cupy.float32)
                        for name in buffer_names(fac)}
        self.buffers["tmat"] = cupy.empty((self.chunk, self.sizes.gram), dtype=cupy.float32)
        self.sms = sm_count(device_id)
        # G in parts (gram_parts): part q of the chunk's matrices q * chunk * sizes.gram floats into "gram"
        self.gram_parts = gram_parts(fac, self.chunk, self.sms) if "gram" in self.buffers else 1
        if self.gram_parts > 1:
            self.buffers["gram"] = cupy.empty((self.gram_parts * self.chunk, self.sizes.gram), dtype=cupy.float32)
        # W in parts (w_parts) likewise; the engine adds either's parts into the first by a product with ones
        self.w_parts = w_parts(fac, self.chunk, self.sms)
        if self.w_parts > 1:
            self.buffers["w"] = cupy.empty((self.w_parts * self.chunk, self.sizes.w), dtype=cupy.float32)
        self.buffers["ones"] = cupy.ones((max(self.w_parts, self.gram_parts),), dtype=cupy.float32)
        # The rowsplit panel products: partial sums per row block, and a counter per matrix and column tile that the
        # last block of each launch resets (zero between launches).
        split = [L for L in fac.launches if L.nc > 0] if fac.schedule.panel_update == "rowsplit" else []
        self.buffers["rowsplit_parts"] = cupy.empty((self.chunk, max([rowsplit.split_rows(L.rows, L.nc, self.chunk, self.sms)[0]
                                                             * L.width * L.nc for L in split] + [1])),
                                          dtype=cupy.float32)
        self.counters = cupy.zeros((self.chunk * max([-(-L.nc // 32) for L in split] + [1]),), dtype=cupy.uint32)
        max_blocks = max(L.blocks for L in fac.launches)
        self.exchange = cupy.empty((self.chunk, 2 * max_blocks * 64), dtype=cupy.float32)
        self.flags = cupy.zeros((self.chunk,), dtype=cupy.uint32)
        self.amax = cupy.zeros((self.chunk,), dtype=cupy.uint32)  # Schedule.scaled: each matrix's max |a| (bits)
        self.multi_block = any(L.blocks > 1 and not L.cluster for L in fac.launches)  # flags to clear per call
        self.ptrs = {name: b.data.ptr for name, b in self.buffers.items()}
        self.strides = {"h": fac.m * fac.n, "tmat": self.sizes.gram,
                        **{name: self.sizes.floats(name) for name in buffer_names(fac)}}
        self.panel_args: dict[int, PackedArgs] = {}  # per panel, its packed launch arguments
        self.tsqr_args: dict[int, list] = {}  # per tsqr panel, (tiles, packed arguments) per phase
        self.packed: dict[str, PackedArgs] = {}  # per signature, the other kernels' (CudaEngine.launch)
        self.streams = Streams() if fac.schedule.lookahead or fac.plan.t_late else None
        self.recorded: dict[tuple, Recorded] = {}  # per kind of call, its operations (run/recorded.py)


HIGH_PRIORITY = -1000  # CUDA clamps a stream priority to the device's range: this is its highest


class Streams:
    """The two streams of a lookahead schedule (the panels' chain at the highest priority, so that their blocks go
    first as the side stream's GEMM blocks retire), or of t_late aggregates (G and T on the main one, beside the
    projection on the side one), and the events that order them with each other and with the caller's stream.
    Events are recorded again for every fork and join: a wait takes the latest record."""

    def __init__(self):
        import cupy

        self.main = cupy.cuda.Stream(non_blocking=True, priority=HIGH_PRIORITY)
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.forked, self.joined, self.started, self.done, self.marked = (
            cupy.cuda.Event(block=False, disable_timing=True) for _ in range(5))
        self.pending = False  # side-stream work queued since the last join

    @contextlib.contextmanager
    def from_stream(self, caller):
        """Run the body on the main lane (CuPy's current stream inside), after the caller's queued work; the caller's
        stream then waits for both lanes."""
        self.started.record(caller)
        self.main.wait_event(self.started)
        try:
            with self.main:
                yield
        finally:  # also when a launch failed midway: the caller's later work still waits for what was queued
            if self.pending:  # (a join without a fork would wait on the side stream's work of another call)
                self.join(Direct())
            self.done.record(self.main)
            caller.wait_event(self.done)

    def fork(self, sink):
        sink.record(self.forked.ptr, self.main.ptr)
        sink.wait(self.side.ptr, self.forked.ptr)
        self.pending = True

    def join(self, sink):
        sink.record(self.joined.ptr, self.side.ptr)
        sink.wait(self.main.ptr, self.joined.ptr)
        self.pending = False

    def mark(self, sink):
        """A point in the side stream's queue that wait_mark makes the main stream wait for (the latest mark)."""
        sink.record(self.marked.ptr, self.side.ptr)

    def wait_mark(self, sink):
        sink.wait(self.main.ptr, self.marked.ptr)
