"""Run on the GPU machine: host time per qrgen.geqrf call (no synchronization) for a small case."""
import sys
import time

import cupy

import qrgen

batch, m, n = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "20,32,32").split(","))
a = cupy.random.standard_normal((batch, m, n), dtype=cupy.float32)
for _ in range(20):
    qrgen.geqrf(a)
cupy.cuda.runtime.deviceSynchronize()
calls = 2000
start = time.perf_counter()
for _ in range(calls):
    qrgen.geqrf(a)
host = (time.perf_counter() - start) / calls * 1e6
cupy.cuda.runtime.deviceSynchronize()
total = (time.perf_counter() - start) / calls * 1e6
print(f"{batch} x {m}x{n}: host {host:.1f} us per call, host+device {total:.1f} us per call (back to back)")
