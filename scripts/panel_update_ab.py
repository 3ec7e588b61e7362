"""Run on the GPU machine: each case's schedule (its committed file, else the default) against the same schedule
with another panel_update (how the panels' own products run), the same inputs, graph-replay and eager medians in
two rounds in turn, the gates on a batch of every stress family first.

    python scripts/panel_update_ab.py 60x1024x1024 640x512x512 [--with fused,cublas]
"""
import argparse
import dataclasses

import cupy
import numpy as np

from qrgen import runtime
from qrgen.bench import graph_time_us, median_time_us
from qrgen.check import check
from qrgen.schedule import PANEL_UPDATES
from qrgen.testing import mixed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="BATCHxMxN, such as 60x1024x1024")
    ap.add_argument("--with", dest="others", default="fused", help=f"comma-separated, of {PANEL_UPDATES}")
    args = ap.parse_args()
    others = args.others.split(",")
    if not set(others) <= set(PANEL_UPDATES):
        raise SystemExit(f"--with takes {PANEL_UPDATES}, got {others}")
    for case in args.cases:
        batch, m, n = (int(v) for v in case.split("x"))
        base = runtime.factorizer_for(m, n, batch, "sm_90")
        facs = {f"schedule ({base.schedule.panel_update})": base}
        for other in others:
            if other != base.schedule.panel_update:
                schedule = dataclasses.replace(base.schedule, panel_update=other)
                facs[other] = runtime.Factorizer(m, n, schedule, "sm_90")
        rng = np.random.default_rng(0)
        inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
        hostile, _ = mixed(m, n, min(batch, 10 if m * n <= 1 << 20 else 4), seed=1)
        for name, fac in facs.items():
            fac.build()
            h, tau = fac(cupy.asarray(hostile))
            result = check(hostile, h, tau)
            f, o = result.worst()
            print(f"{case} {name}: factor {f:.2f} orthogonality {o:.2f} {'pass' if result.ok else 'FAIL'}", flush=True)
        for rnd in range(2):
            for name, fac in facs.items():
                graph = graph_time_us(fac, inputs, 10)
                eager = median_time_us(fac, inputs, 10, warmup=2)
                print(f"{case} round {rnd} {name:>18}: graph {graph:10.1f} eager {eager:10.1f} µs", flush=True)


if __name__ == "__main__":
    main()
