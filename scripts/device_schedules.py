"""Run on the GPU machine: time alternative schedules for one shape (same inputs, same run).

    python scripts/device_schedules.py BATCH,M,N [WIDTH:THREADS:BLOCKS[:prec] | cols:WIDTH:SLICE[:prec]] ...
"""
import sys

import cupy
import numpy as np

from qrgen.bench import median_time_us
from qrgen.check import check
from qrgen.runtime import Factorizer
from qrgen.schedule import Panel, Precision, Schedule, default_schedule
from qrgen.problem import Problem


def uniform(m, n, width, threads, blocks=1, variant="rows", prec=Precision(), slice_=0):
    k = min(m, n)
    widths = [width] * (k // width) + ([k % width] if k % width else [])
    if variant == "cols":
        return Schedule(m, n, tuple(Panel(w, "cols", 32 * -(-w // slice_), 1, slice_) for w in widths), prec)
    return Schedule(m, n, tuple(Panel(w, variant, threads, blocks) for w in widths), prec)


def main():
    batch, m, n = (int(x) for x in sys.argv[1].split(","))
    rng = np.random.default_rng(0)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    variants = {"default": default_schedule(Problem(m, n, batch))}
    for spec in sys.argv[2:]:
        if spec.startswith("cols:"):  # cols:WIDTH:SLICE[:precision]
            _, w, c, *p = spec.split(":")
            prec = Precision(p[0], p[0], p[0]) if p else Precision()
            variants[spec] = uniform(m, n, int(w), 0, 1, "cols", prec, int(c))
            continue
        w, t, b, *p = spec.split(":")  # WIDTH:THREADS:BLOCKS[:precision]
        prec = Precision(p[0], p[0], p[0]) if p else Precision()
        variants[spec] = uniform(m, n, int(w), int(t), int(b), "warp" if int(t) == 32 else "rows", prec)
    for name, sched in variants.items():
        fac = Factorizer(m, n, sched, "sm_90")
        fac.build()
        h, tau = fac(inputs[0])
        res = check(inputs[0][:1], h[:1], tau[:1])
        us = median_time_us(fac, inputs, 5, warmup=1)
        print(f"{name:>16}: {us:10.1f} us  {res}", flush=True)


if __name__ == "__main__":
    main()
