"""Run on the GPU machine: time alternative schedules for one shape (same inputs, same run)."""
import sys

import cupy
import numpy as np

from qrgen.bench import median_time_us
from qrgen.check import check
from qrgen.runtime import Factorizer, _Array, _run
from qrgen.schedule import Panel, Precision, Schedule, default_schedule
from qrgen.problem import Problem


def uniform(m, n, width, threads, blocks=1, variant="rows", prec=Precision()):
    k = min(m, n)
    widths = [width] * (k // width) + ([k % width] if k % width else [])
    return Schedule(m, n, tuple(Panel(w, variant, threads, blocks) for w in widths), prec)


def main():
    batch, m, n = (int(x) for x in sys.argv[1].split(","))
    rng = np.random.default_rng(0)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    variants = {"default": default_schedule(Problem(m, n, batch))}
    for spec in sys.argv[2:]:
        w, t, b, *p = spec.split(":")
        prec = Precision(p[0], p[0], p[0]) if p else Precision()
        variants[spec] = uniform(m, n, int(w), int(t), int(b), "warp" if int(t) == 32 else "rows", prec)
    for name, sched in variants.items():
        fac = Factorizer(m, n, sched, "sm_90")
        fac.build()
        call = lambda x: _run(fac, _Array(x, "cupy", None, lambda y: y))  # noqa: E731
        h, tau = call(inputs[0])
        res = check(inputs[0][:1], h[:1], tau[:1])
        us = median_time_us(call, inputs, 5, warmup=1)
        print(f"{name:>16}: {us:10.1f} us  graph={'yes' if not fac.graph_error else fac.graph_error[:80]}  {res}",
              flush=True)


if __name__ == "__main__":
    main()
