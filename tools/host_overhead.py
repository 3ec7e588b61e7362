"""Host time per call on the GPU: qrgen.geqrf and qrgen.qr back to back with no synchronization, on CuPy and torch
inputs, contiguous (the fast path where the shape is one launch) and transposed views (the general path), beside the
floor of a call that allocates two outputs and launches one kernel from Python; with --profile cProfile's top
functions by own time for each.
Calls back to back: past the launch queue's depth the host waits for the GPU, so for a call the GPU bounds the
host figure is the GPU's pace, not the host's own time (that needs the GPU idle before each call).

    python3 tools/host_overhead.py 20x32x32 40x176x176 [--profile] [--calls 2000]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import cProfile
import pstats
import time

import cupy

import qrgen
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", type=cases.case, default=[cases.case("20x32x32")], metavar="BATCHxMxN",
                    help="default 20x32x32")
    ap.add_argument("--calls", type=int, default=2000, help="calls timed a measurement (default 2000)")
    ap.add_argument("--profile", action="store_true", help="also cProfile's top functions of 500 calls each")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
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
