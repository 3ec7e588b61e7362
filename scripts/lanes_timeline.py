"""Run on the GPU machine: where a lookahead schedule's two lanes overlap. One eager call of the shape's schedule with
a CUDA event recorded after every launch on the stream that launch went to (panels, the T kernel and the main
lane's products on the main lane; the side pieces on the side lane), then each launch as an interval from the later
of its lane's previous end and (after a fork or join) the other lane's, and how long the panels ran while side-lane
products ran beside them.

    python scripts/lanes_timeline.py 60x1024x1024 [--list] [--panel-update fused]

--list also prints every launch (lane, what, start and end in µs from the call's start). Times include what an
event after every launch costs (a few µs of GPU time each at most); the second call is timed (the first builds).
"""
import argparse
import dataclasses
import os

import cupy
import numpy as np

from qrgen import runtime
from qrgen.schedule import PANEL_UPDATES


def intervals_union(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b):
    """Total length of the intersection of two unions of intervals."""
    total = 0.0
    for s, e in a:
        for t, u in b:
            total += max(0.0, min(e, u) - max(s, t))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="BATCHxMxN, such as 60x1024x1024")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--panel-update", choices=PANEL_UPDATES, help="the schedule's, with this panel_update instead")
    args = ap.parse_args()
    # Launch by launch: a call that qrgen.replay would replay as one CUDA graph has no events between its launches
    # (eventElapsedTime failed on 8 x 2048², whose eager calls replay).
    os.environ["QRGEN_REPLAY"] = "0"
    batch, m, n = (int(v) for v in args.case.split("x"))
    fac = runtime.factorizer_for(m, n, batch, "sm_90")
    if args.panel_update:
        fac = runtime.Factorizer(m, n, dataclasses.replace(fac.schedule, panel_update=args.panel_update), "sm_90")
    if not fac.schedule.lookahead:
        raise SystemExit(f"{args.case}'s schedule has no lookahead: one lane")
    a = cupy.asarray(np.random.default_rng(0).standard_normal((batch, m, n), dtype=np.float32))
    fac(a)
    cupy.cuda.Device().synchronize()

    marks = []  # (lane, label, event): after each launch, in the order they were queued
    engine = runtime._CupyEngine
    orig = {name: getattr(engine, name) for name in ("panel", "tmat", "gemm", "fused", "fork", "join")}

    def mark(self, lane, label):
        event = cupy.cuda.Event()
        event.record(self.lanes.side if lane == "side" else cupy.cuda.get_current_stream())
        marks.append((lane, label, event))

    def panel(self, index, L, *rest):
        orig["panel"](self, index, L, *rest)
        mark(self, "main", f"panel {index} ({L.width} columns at {L.c0})")

    def tmat(self, agg, side=False):
        orig["tmat"](self, agg, side)
        mark(self, "side" if side and self.lanes is not None else "main", f"T of columns {agg.a0}-{agg.a1}")

    def gemm(self, stage, *rest, side=False, **kw):
        orig["gemm"](self, stage, *rest, side=side, **kw)
        mark(self, "side" if side and self.lanes is not None else "main", f"{stage} {rest[2]}x{rest[3]}x{rest[4]}")

    def fused(self, *args):
        orig["fused"](self, *args)
        width, rows, nc = args[6], args[7], args[9]
        mark(self, "main", f"fused {width}x{nc}x{rows}")

    def fork(self):
        mark(self, "main", "fork")
        orig["fork"](self)

    def join(self):
        orig["join"](self)
        mark(self, "main", "join")

    for name, fn in (("panel", panel), ("tmat", tmat), ("gemm", gemm), ("fused", fused), ("fork", fork),
                     ("join", join)):
        setattr(engine, name, fn)
    try:
        start = cupy.cuda.Event()
        start.record()
        fac(a)
        cupy.cuda.Device().synchronize()
    finally:
        for name, fn in orig.items():
            setattr(engine, name, fn)

    ends = {"main": 0.0, "side": 0.0}
    fork_at = 0.0
    spans = {"panel": [], "side": [], "main other": []}
    for lane, label, event in marks:
        end = cupy.cuda.get_elapsed_time(start, event) * 1e3
        begin = ends[lane]
        if lane == "side":
            begin = max(begin, fork_at)  # the side lane waits for the latest fork
        if label == "fork":
            fork_at = end
        if label == "join":
            begin = end
        ends[lane] = end
        kind = "side" if lane == "side" else ("panel" if label.startswith("panel") else "main other")
        if label not in ("fork", "join"):
            spans[kind].append((begin, end))
        if args.list:
            print(f"{lane:<5} {label:<40} {begin:10.1f} {end:10.1f} µs")
    total = max(ends.values())
    panels, side, other = (intervals_union(spans[k]) for k in ("panel", "side", "main other"))
    length = lambda u: sum(e - s for s, e in u)  # noqa: E731
    print(f"{args.case}: {total:,.1f} µs; panels {length(panels):,.1f} µs, the main lane's other launches "
          f"{length(other):,.1f}, side-lane products {length(side):,.1f}; panels running beside side-lane products "
          f"{overlap(panels, side):,.1f} µs")


if __name__ == "__main__":
    main()
