"""Run on the GPU machine: host time per call (no synchronization, back to back) of qrgen.geqrf and qrgen.qr on
CuPy and torch inputs, contiguous (the fast lane where the shape is one launch) and transposed views (the general
path), and with --profile cProfile's top functions by own time for each.

    python scripts/host_overhead.py 20,32,32 40,176,176 --profile"""
import cProfile
import pstats
import sys
import time

import cupy

import qrgen


def per_call_us(fn, calls: int) -> tuple[float, float]:
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
    profile = "--profile" in sys.argv
    cases = [arg for arg in sys.argv[1:] if not arg.startswith("--")] or ["20,32,32"]
    try:
        import torch
    except ImportError:
        torch = None
    # The floor of a call that allocates two outputs and launches one kernel from Python
    noop = cupy.RawKernel('extern "C" __global__ void noop(float* a, float* b) {}', "noop")

    def floor():
        x, y = cupy.empty((20, 32, 32), dtype=cupy.float32), cupy.empty((20, 32), dtype=cupy.float32)
        noop((20,), (128,), (x, y))

    host, _ = per_call_us(floor, 2000)
    print(f"floor (two cupy.empty and one RawKernel launch): host {host:.1f} us per call", flush=True)
    for case in cases:
        batch, m, n = (int(x) for x in case.split(","))
        a = cupy.random.standard_normal((batch, m, n), dtype=cupy.float32)
        inputs = [("cupy", a), ("cupy strided (general path)", a.transpose(0, 2, 1))]
        if torch:
            t = torch.as_tensor(a, device="cuda")
            inputs += [("torch", t), ("torch strided (general path)", t.transpose(1, 2))]
        for kind, x in inputs:
            for name, fn in (("geqrf", lambda: qrgen.geqrf(x)), ("qr", lambda: qrgen.qr(x))):
                host, total = per_call_us(fn, 2000)
                print(f"{batch} x {m}x{n} {name} {kind}: host {host:.1f} us per call, host+device {total:.1f} us "
                      f"per call (back to back)", flush=True)
                if profile:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(500):
                        fn()
                    prof.disable()
                    cupy.cuda.runtime.deviceSynchronize()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
