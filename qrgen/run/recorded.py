"""Where the CUDA engine's operations go: queued as they come (Direct), or recorded once (Recorder) into a list that
later calls replay with their own pointers (Recorded).

A call's launch sequence depends on its factorizer, workspace, batch and stream, never on its data: only the
addresses of h, tau, the input and Q change from call to call. The engine therefore runs once per workspace and kind
of call against symbolic addresses (SYMBOLS, far above any device address), the Recorder keeping each operation with
its arguments packed; a call then patches the symbolic arguments with its own addresses and queues the operations,
with none of the launch sequence's Python (run/sequence.drive, the products' routing) between the driver calls
(docs/decisions.md#recorded-launches)."""
from __future__ import annotations

import ctypes
import threading

from . import cublas
from .launch import driver_launch, queue_kernel

SYMBOLS = ("h", "tau", "src", "q")  # the per-call addresses, in the order of a call's bases
_SHIFT = 58  # symbol j's address is (j + 1) << _SHIFT plus an offset: above any device address (49 bits)
_MASK = (1 << _SHIFT) - 1


def symbolic(name: str) -> int:
    """The address that stands for a call's `name` (one of SYMBOLS) while recording."""
    return (SYMBOLS.index(name) + 1) << _SHIFT


def symbol_of(value: int) -> tuple[int, int] | None:
    """(symbol index, offset) of a symbolic address, None for any other value."""
    j = (value >> _SHIFT) - 1
    return (j, value & _MASK) if 0 <= j < len(SYMBOLS) else None


class Direct:
    """Queues each operation as it comes."""

    kernel = staticmethod(queue_kernel)

    def __init__(self):
        import cupy

        self.runtime = cupy.cuda.runtime

    def memset(self, ptr: int, nbytes: int, stream: int) -> None:
        self.runtime.memsetAsync(ptr, 0, nbytes, stream)

    def gemm(self, *args, **kwargs) -> None:
        cublas.gemm(*args, **kwargs)

    def record(self, event: int, stream: int) -> None:
        self.runtime.eventRecord(event, stream)

    def wait(self, stream: int, event: int) -> None:
        self.runtime.streamWaitEvent(stream, event, 0)


class Recorder:
    """Keeps each operation (Direct's) instead of queueing it; finish() gives the Recorded list."""

    def __init__(self):
        import cupy

        self.driver, self.runtime = cupy.cuda.driver, cupy.cuda.runtime
        self.ops: list = []
        self.waits = False  # whether the list orders two streams (a lookahead's fork and join)

    def kernel(self, func_ptr, grid, threads, shared, stream, args, cooperative=False):
        packed = args.copy()  # the values now; the engine rewrites its own for the next launch
        patches = tuple((i, *s) for i, v in enumerate(packed.values)
                        if isinstance(v, ctypes.c_uint64) and (s := symbol_of(v.value)) is not None)
        launch, extra = driver_launch(cooperative, self.driver)
        fixed = (func_ptr, *grid, threads, 1, 1, shared, stream, packed.address, *extra)

        def run(bases):  # (packed: kept alive by this closure, as the driver reads its pointers)
            for i, j, offset in patches:
                packed.values[i].value = bases[j] + offset
            launch(*fixed)
        self.ops.append(run)

    def memset(self, ptr, nbytes, stream):
        memset, where = self.runtime.memsetAsync, symbol_of(ptr)
        if where is None:
            self.ops.append(lambda bases: memset(ptr, 0, nbytes, stream))
        else:
            j, offset = where
            self.ops.append(lambda bases: memset(bases[j] + offset, 0, nbytes, stream))

    def gemm(self, device_id, stream_ptr, trans_a, trans_b, rows, cols, depth, alpha, a_ptr, lda, sa, b_ptr, ldb, sb,
             beta, c_ptr, ldc, sc, batch, precision, slot=0, sm_target=0):
        where = [symbol_of(p) for p in (a_ptr, b_ptr, c_ptr)]
        fixed = [a_ptr, b_ptr, c_ptr]

        def run(bases):
            a, b, c = (p if s is None else bases[s[0]] + s[1] for p, s in zip(fixed, where))
            cublas.gemm(device_id, stream_ptr, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb,
                        beta, c, ldc, sc, batch, precision, slot=slot, sm_target=sm_target)
        self.ops.append(run)

    def record(self, event, stream):
        record = self.runtime.eventRecord
        self.ops.append(lambda bases: record(event, stream))

    def wait(self, stream, event):
        wait = self.runtime.streamWaitEvent
        self.waits = True
        self.ops.append(lambda bases: wait(stream, event, 0))

    def finish(self) -> "Recorded":
        return Recorded(tuple(self.ops), self.waits)


class Recorded:
    """A call's operations, recorded once; run(bases) queues them with a call's addresses (bases: one per SYMBOLS
    entry, 0 for one the call does not have)."""

    def __init__(self, ops: tuple, waits: bool):
        self.ops, self.waits = ops, waits
        self.lock = threading.Lock()  # the packed values are the list's own: one call patches them at a time

    def __len__(self) -> int:
        return len(self.ops)

    def run(self, bases: tuple) -> None:
        with self.lock:
            for op in self.ops:
                op(bases)
