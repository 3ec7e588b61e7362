"""Run on the GPU machine: each case's schedule (its committed file, else the default) against the same schedule
with some of its fields replaced, the same inputs, graph-replay and eager medians in two rounds in turn, the gates
on a batch of every stress family first.

    python scripts/schedule_ab.py 60x1024x1024 640x512x512 --variant panel_update=cublas --variant aggregate=64

A variant is comma-separated FIELD=VALUE pairs of qrgen.schedule.Schedule's fields aggregate, lookahead,
panel_update and reach (0 or 1); a stage's precision (gram, project, update: fp32, tf32x3, tf32, bf16, fp16);
file=PATH (a schedule file's schedule for the same m x n in place of the case's, the other fields applied to it);
width=W (every wider panel split into panels of W columns, the same kernel variant); one_warp_tail=1
(qrgen.schedule.one_warp_tail: panels of at most 32 rows on one warp); or cluster=B[,slots=S][,every=1]
(qrgen.schedule.with_cluster: the cluster panels, with every=1 also the one-block lanes and rows panels, on
clusters of B blocks, lanes panels of about S rows per warp where they fit); or whole=S[,threads=T][,loop=1] (the
whole factorization in one kernel per matrix, panels of S columns inside it on T threads, 256 unless given: a
Panel of variant "whole", fp32, nothing else); loop=0 or 1 without whole sets every warp, rows and tsqr panel's column
loop (qrgen.schedule.with_loop). It applies to every case (a case
whose schedule rejects it says why and goes on).
"""
import argparse
import dataclasses
from pathlib import Path

import cupy
import numpy as np

from qrgen import runtime
from qrgen.bench import graph_time_us, median_time_us, profile_case
from qrgen.check import check
from qrgen.schedule import CLUSTER_LANE_SLOTS, Panel, Schedule, load, one_warp_tail, with_cluster, with_loop
from qrgen.testing import mixed

FIELDS = {"aggregate": int, "lookahead": int, "panel_update": str, "reach": lambda v: bool(int(v)),
          "gram": str, "project": str, "update": str, "file": str, "width": int,
          "one_warp_tail": int, "cluster": int, "slots": int, "every": lambda v: bool(int(v)),
          "whole": int, "threads": int, "loop": lambda v: bool(int(v))}


def split_panels(panels, width: int) -> tuple:
    """Each panel wider than `width` as panels of `width` columns (the last one narrower), the same kernel variant."""
    return tuple(dataclasses.replace(p, width=min(width, p.width - c))
                 for p in panels for c in range(0, p.width, width))


def parse(text: str) -> dict:
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in FIELDS or not value:
            raise SystemExit(f"a variant is FIELD=VALUE pairs with FIELD in {sorted(FIELDS)}, got {item!r}")
        out[key] = FIELDS[key](value)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="BATCHxMxN, such as 60x1024x1024")
    ap.add_argument("--variant", action="append", default=[], help="FIELD=VALUE[,FIELD=VALUE...] (repeatable)")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile every schedule's kernels into the cache and stop (no GPU needed: to fill a cache "
                         "that the GPU machine then reads)")
    ap.add_argument("--profile", action="store_true",
                    help="also each schedule's GPU time by stage (qrgen.bench.profile_case), after the rounds")
    args = ap.parse_args()
    variants = [(text, parse(text)) for text in args.variant]
    for case in args.cases:
        batch, m, n = (int(v) for v in case.split("x"))
        base = runtime.factorizer_for(m, n, batch, "sm_90")
        facs = {"schedule": base}
        for text, fields in variants:
            try:
                fields = dict(fields)
                tail, blocks = fields.pop("one_warp_tail", 0), fields.pop("cluster", 0)
                slots, every = fields.pop("slots", CLUSTER_LANE_SLOTS), fields.pop("every", False)
                stages = {k: fields.pop(k) for k in ("gram", "project", "update") if k in fields}
                width = fields.pop("width", 0)
                whole, threads, loop = fields.pop("whole", 0), fields.pop("threads", 256), fields.pop("loop", None)
                start = load(Path(fields.pop("file")))[0] if "file" in fields else base.schedule
                schedule = dataclasses.replace(start, **fields)
                if width:
                    schedule = dataclasses.replace(schedule, panels=split_panels(schedule.panels, width))
                if loop is not None and not whole:
                    schedule = dataclasses.replace(schedule, panels=tuple(with_loop(p, loop) for p in schedule.panels))
                schedule = dataclasses.replace(schedule, precision=dataclasses.replace(schedule.precision, **stages))
                schedule = one_warp_tail(schedule) if tail else schedule
                schedule = with_cluster(schedule, blocks, slots=slots, every=every) if blocks else schedule
                if whole:
                    schedule = Schedule(m, n, (Panel(min(m, n), "whole", threads, slice=whole, loop=bool(loop)),))
                facs[text] = runtime.Factorizer(m, n, schedule, "sm_90")
            except ValueError as exc:
                print(f"{case} {text}: rejected ({exc})", flush=True)
        if args.compile_only:
            for name, fac in facs.items():
                spills = sum(b.spill_bytes for b in fac.build())
                print(f"{case} {name}: {len(fac.binaries)} kernels compiled, {spills} bytes of spill", flush=True)
            continue
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
                print(f"{case} round {rnd} {name:>28}: graph {graph:10.1f} eager {eager:10.1f} µs", flush=True)
        for name, fac in facs.items() if args.profile else ():
            print(f"{case} {name}:\n{profile_case(batch, m, n, fac=fac)}", flush=True)


if __name__ == "__main__":
    main()
