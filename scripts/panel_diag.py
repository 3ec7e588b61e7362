"""Run on the GPU machine: where the time of a few schedules goes, without the benchmark's synchronization.

    python scripts/panel_diag.py          # clock, back-to-back GPU time per call, host time per call, stages
    python scripts/panel_diag.py once     # each case once after a warm-up (for ncu --kernel-name regex:qr_)

Each case is BATCH, M, N and a point of the tuning space as scripts/device_schedules.py reads it ("default" for
the default heuristic, "rows" for the rows family's base point).
"""
import sys
import time

import cupy
import numpy as np

from device_schedules import parse_point
from qrgen.problem import Problem
from qrgen.runtime import Factorizer
from qrgen.schedule import default_schedule
from qrgen.tune import schedule_from_params

SPIN = cupy.RawKernel(r'''extern "C" __global__ void spin(long long cycles, long long* out) {
  long long t0 = clock64(); while (clock64() - t0 < cycles) {} if (threadIdx.x == 0) out[blockIdx.x] = clock64() - t0;
}''', "spin")

CASES = [(20, 32, 32, "rows"), (20, 32, 32, "default"), (40, 176, 176, "rows"), (40, 176, 176, "default"),
         (640, 512, 512, "default"), (2, 4096, 4096, "default")]


def clock_mhz(cycles: int = 2_000_000) -> float:
    """The SM clock, from a kernel that spins for a number of cycles, timed with events."""
    out = cupy.zeros(132, dtype=cupy.int64)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    SPIN((132,), (32,), (np.int64(cycles), out))
    stop.record()
    stop.synchronize()
    return cycles / (cupy.cuda.get_elapsed_time(start, stop) * 1e3)


def factorizer(batch: int, m: int, n: int, point: str) -> Factorizer:
    problem = Problem(m, n, batch)
    schedule = default_schedule(problem) if point == "default" else schedule_from_params(
        problem, parse_point("" if point == "rows" else point))
    fac = Factorizer(m, n, schedule, "sm_90")
    fac.build()
    return fac


def main(mode: str) -> None:
    if mode == "once":
        for batch, m, n, point in CASES[:4]:
            fac = factorizer(batch, m, n, point)
            x = cupy.random.standard_normal((batch, m, n), dtype=cupy.float32)
            fac(x)
            fac(x)
        cupy.cuda.runtime.deviceSynchronize()
        return
    print(f"clock when idle: {clock_mhz():.0f} MHz")
    busy = cupy.empty(1 << 26, dtype=cupy.float32)
    for i in range(200):
        busy.fill(i)
    print(f"clock after 200 fills: {clock_mhz():.0f} MHz")
    stream = cupy.cuda.get_current_stream()
    for batch, m, n, point in CASES:
        fac = factorizer(batch, m, n, point)
        x = cupy.random.standard_normal((batch, m, n), dtype=cupy.float32)
        fac.run(x, stream)
        stream.synchronize()
        reps = 50 if batch * m * n < 1 << 26 else 5
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        t0 = time.perf_counter()
        for _ in range(reps):
            fac.run(x, stream)
        host = (time.perf_counter() - t0) / reps * 1e6
        stop.record()
        stop.synchronize()
        gpu = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / reps
        fac.profile(x)
        stages = fac.profile(x)
        totals: dict[str, float] = {}
        for stage, _, a, z in stages:
            totals[stage] = totals.get(stage, 0.0) + cupy.cuda.get_elapsed_time(a, z) * 1e3
        print(f"{batch} x {m}x{n} {point}: back-to-back {gpu:.1f} µs per call, host {host:.1f} µs per call; "
              f"stages (events per launch, host gaps included): { {k: round(v, 1) for k, v in totals.items()} }")
        for binary in fac.binaries:
            print(f"    {binary.name}: {binary.registers} registers, {binary.spill_bytes} bytes spilled")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
