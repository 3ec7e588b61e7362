"""Host time per call on the GPU: qrgen.geqrf and qrgen.qr back to back with no synchronization, on CuPy and torch
inputs, contiguous (the fast path where the shape is one launch) and transposed views (the general path), beside the
floor of a call that allocates two outputs and launches one kernel from Python; with --profile cProfile's top
functions by own time for each.
Calls back to back: past the launch queue's depth the host waits for the GPU, so for a call the GPU bounds the
host figure is the GPU's pace, not the host's own time (that needs the GPU idle before each call).

    python3 tools/host_overhead.py 20x32x32 40x176x176 [--profile] [--calls 2000]
    python3 tools/host_overhead.py 60x1024x1024 40x176x176 --queued

--queued asks whether the host adds to a call at all: for geqrf on CuPy and torch inputs, a spin kernel of about
20 ms, the L2 flush, then the call, so the host queues the whole call while the GPU is busy; the host's time to
queue it, the call's GPU time from an event after the flush, and the eager time (the flush, then the call, the host
issuing as it goes), medians of 15. Where the queued GPU time equals the eager time, the host adds nothing; an
eager call's time past its graph replay is then the GPU's, between a stream's launches.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import cProfile
import pstats
import statistics
import time

import cupy
import numpy as np

import qrgen
from qrgen.bench import FLUSH_BYTES
from tools import cases


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(host µs a call, host and device µs a call) of `calls` calls back to back after 20 of warm-up."""
    for _ in range(20):
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    cupy.cuda.runtime.deviceSynchronize()
    return host, (time.perf_counter() - start) / calls * 1e6


SPIN = r'''extern "C" __global__ void spin(long long n) { long long t = clock64(); while (clock64() - t < n); }'''


def queued_us(fn, inputs: list, reps: int = 15) -> tuple[float, float, float]:
    """(host µs to queue fn(x), GPU µs of it fully queued, eager µs) as medians (the module's --queued)."""
    spin = cupy.RawKernel(SPIN, "spin")
    flush = cupy.empty(FLUSH_BYTES // 4, dtype=cupy.float32)  # the L2 flush qrgen bench writes
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for x in inputs:
        fn(x)
    cupy.cuda.runtime.deviceSynchronize()
    host, queued, eager = [], [], []
    for i in range(reps):
        x = inputs[i % len(inputs)]
        spin((1,), (1,), (np.int64(40_000_000),))  # about 20 ms at 2 GHz
        flush.fill(i)
        start.record()
        t0 = time.perf_counter()
        out = fn(x)
        host.append((time.perf_counter() - t0) * 1e6)
        stop.record()
        stop.synchronize()
        queued.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
        del out
        flush.fill(i + 1)
        start.record()
        out = fn(x)
        stop.record()
        stop.synchronize()
        eager.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
        del out
    return statistics.median(host), statistics.median(queued), statistics.median(eager)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", type=cases.case, default=[cases.case("20x32x32")], metavar="BATCHxMxN",
                    help="default 20x32x32")
    ap.add_argument("--calls", type=int, default=2000, help="calls timed a measurement (default 2000)")
    ap.add_argument("--profile", action="store_true", help="also cProfile's top functions of 500 calls each")
    ap.add_argument("--queued", action="store_true",
                    help="instead: geqrf's host time to queue a call with the GPU busy, its GPU time so queued and "
                         "its eager time, on CuPy and torch inputs")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    if args.queued:
        for case in args.cases:
            sets = [cupy.random.standard_normal((case.batch, case.m, case.n), dtype=cupy.float32) for _ in range(2)]
            kinds = [("cupy", sets)] + ([("torch", [torch.as_tensor(x, device="cuda") for x in sets])] if torch else [])
            for kind, inputs in kinds:
                host, queued, eager = queued_us(qrgen.geqrf, inputs)
                print(f"{case.batch} x {case.m}x{case.n} geqrf {kind}: host {host:.1f} us to queue the call, GPU "
                      f"{queued:.1f} us fully queued, eager {eager:.1f} us", flush=True)
        return
    noop = cupy.RawKernel('extern "C" __global__ void noop(float* a, float* b) {}', "noop")

    def floor():
        x, y = cupy.empty((20, 32, 32), dtype=cupy.float32), cupy.empty((20, 32), dtype=cupy.float32)
        noop((20,), (128,), (x, y))

    host, _ = per_call_us(floor, args.calls)
    print(f"floor (two cupy.empty and one RawKernel launch): host {host:.1f} us per call", flush=True)
    for case in args.cases:
        a = cupy.random.standard_normal((case.batch, case.m, case.n), dtype=cupy.float32)
        inputs = [("cupy", a), ("cupy strided (general path)", a.transpose(0, 2, 1))]
        if torch:
            t = torch.as_tensor(a, device="cuda")
            inputs += [("torch", t), ("torch strided (general path)", t.transpose(1, 2))]
        for kind, x in inputs:
            rows, cols = x.shape[-2:]
            for name, fn in (("geqrf", lambda: qrgen.geqrf(x)), ("qr", lambda: qrgen.qr(x))):
                host, total = per_call_us(fn, args.calls)
                print(f"{case.batch} x {rows}x{cols} {name} {kind}: host {host:.1f} us per call, host+device "
                      f"{total:.1f} us per call (back to back)", flush=True)
                if args.profile:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(500):
                        fn()
                    prof.disable()
                    cupy.cuda.runtime.deviceSynchronize()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
