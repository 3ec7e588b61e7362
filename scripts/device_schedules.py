"""Run on the GPU machine: time points of the tuning space for one shape (same inputs, same run), with the gates
checked on a batch of every stress family.

    python scripts/device_schedules.py BATCH,M,N [KEY=VALUE/KEY=VALUE...] ...

"default" is the default heuristic; every other point overrides qrgen.tune.DEFAULT_PARAMS (the rows family's
base point; "rows" alone is that point), e.g.
    aggregate=128                                  default panels inside aggregates of 128 columns
    rows_head=16/aggregate=256/project=tf32/update=tf32
    family=cols/cols_head=96/slice=4

The gates are checked on a mixed batch of HOSTILE matrices (environment; default min(batch, 10), or 2 above 1024²);
from len(qrgen.testing.FAMILIES) on, every family is in it.
"""
import os
import sys

import cupy
import numpy as np

from qrgen.bench import graph_time_us, median_time_us
from qrgen.check import check
from qrgen.problem import Problem
from qrgen.runtime import Factorizer
from qrgen.testing import mixed
from qrgen.schedule import default_schedule
from qrgen.tune import DEFAULT_PARAMS, schedule_from_params


def parse_point(text: str) -> dict:
    params = dict(DEFAULT_PARAMS)
    for item in filter(None, text.split("/")):
        key, value = item.split("=")
        params[key] = int(value) if value.lstrip("-").isdigit() else (float(value) if "." in value else value)
    return params


def main():
    batch, m, n = (int(x) for x in sys.argv[1].split(","))
    reps = 10
    rng = np.random.default_rng(0)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    count = int(os.environ.get("HOSTILE", 0)) or min(batch, 10 if m * n <= 1 << 20 else 2)
    hostile, _ = mixed(m, n, count, seed=1)
    problem = Problem(m, n, batch)
    for text in ["default"] + sys.argv[2:]:
        try:
            if text == "default":
                sched = default_schedule(problem)
            else:
                sched = schedule_from_params(problem, parse_point("" if text == "rows" else text))
            fac = Factorizer(m, n, sched, "sm_90")
            fac.build()
            h, tau = fac(cupy.asarray(hostile))
            res = check(hostile, h, tau)
            us = median_time_us(fac, inputs, reps, warmup=2)
            graph_us = graph_time_us(fac, inputs, reps)
            f, o = res.worst()
            print(f"{text:>44}: {us:10.1f} us (graph replay {graph_us:10.1f})  factor {f:6.2f} orth {o:6.2f} "
                  f"{'pass' if res.ok else 'FAIL'}"
                  f"  [{sched.describe()}]", flush=True)
        except Exception as exc:  # one bad point must not end the comparison
            print(f"{text:>44}: ERROR {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
