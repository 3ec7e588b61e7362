"""Run on the GPU machine: a committed schedule against variants of its own tuned parameters, eager and CUDA-graph
medians, three rounds in turn, the gates on a batch of every stress family.

    python scripts/schedule_variants.py 640x512x512 aggregate=64,lookahead=0 family=lanes,lanes_cluster=2 ...

Each variant is the file's provenance parameters (schedules/sm_90/<m>x<n>_b<batch>.json) with KEY=VALUE overrides,
built by qrgen.tune.schedule_from_params.
"""
import json
import sys
from pathlib import Path

import cupy
import numpy as np

from qrgen.bench import graph_time_us, median_time_us
from qrgen.check import check
from qrgen.problem import Problem
from qrgen.runtime import Factorizer
from qrgen.schedule import load
from qrgen.testing import mixed
from qrgen.tune import schedule_from_params


def value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(case: str, variants: list[str]) -> None:
    batch, m, n = (int(v) for v in case.split("x"))
    path = Path(f"schedules/sm_90/{m}x{n}_b{batch}.json")
    committed, provenance = load(path)
    facs = {"committed": Factorizer(m, n, committed, "sm_90")}
    for spec in variants:
        params = dict(provenance["params"])
        params.update({k: value(v) for k, v in (kv.split("=") for kv in spec.split(","))})
        facs[spec] = Factorizer(m, n, schedule_from_params(Problem(m, n, batch), params), "sm_90")
    rng = np.random.default_rng(0)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    hostile = cupy.asarray(mixed(m, n, min(batch, 64), seed=5)[0])
    for name, fac in facs.items():
        report = check(hostile, *fac(hostile))
        print(f"{case} {name}: {fac.schedule.describe()}; factor {report.factor.max():.2f}, orthogonality "
              f"{report.orthogonality.max():.2f}", flush=True)
    times = {name: [] for name in facs}
    for _ in range(3):
        for name, fac in facs.items():
            times[name].append((median_time_us(fac, inputs, 10), graph_time_us(fac, inputs, 10)))
    for name, runs in times.items():
        print(f"{case} {name}: eager " + " / ".join(f"{e:,.1f}" for e, _ in runs) + " µs; graph "
              + " / ".join(f"{g:,.1f}" for _, g in runs) + " µs", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
