"""Where a lookahead schedule's two streams overlap, on the GPU: one call of the case's schedule driven through an
engine that records a CUDA event after every launch on the stream that launch went to (the panels, the T kernel
and the main stream's products on the main stream; the side pieces on the side stream), then each launch as an
interval from the later of its stream's previous end and (after a fork, a join or a wait for a mark) the other
stream's, and how long the panels ran while side-stream products ran beside them.

    python3 tools/lanes_timeline.py 60x1024x1024 [--list] [--variant panel_update=fused]

--list also prints every launch (stream, what, start and end in µs from the call's start). Times include what an
event after every launch costs (a few µs of GPU time each at most); the second call is timed (the first warms up).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import cupy

from qrgen.problem import Problem
from qrgen.run.cuda_engine import CudaEngine
from qrgen.run.factorizer import Factorizer
from qrgen.run.recorded import Direct
from qrgen.run.sequence import drive
from qrgen.run.workspace import Workspace
from qrgen.schedule.files import find
from tools import cases


class Marked:
    """An engine passing every operation to a CudaEngine and recording, after each, an event on the stream it went
    to: marks holds (stream, label, event) in the order they were queued."""

    def __init__(self, engine: CudaEngine):
        self.engine, self.marks = engine, []
        self.sizes, self.nb, self.sms = engine.sizes, engine.nb, engine.sms

    def _mark(self, stream: str, label: str) -> None:
        event = cupy.cuda.Event()
        event.record(self.engine.streams.side if stream == "side" else cupy.cuda.get_current_stream())
        self.marks.append((stream, label, event))

    def zero(self, name):
        self.engine.zero(name)

    def panel(self, index, launch, epoch, v, z):
        self.engine.panel(index, launch, epoch, v, z)
        self._mark("main", f"panel {index} ({launch.width} columns at {launch.c0})")

    def tmat(self, agg, side=False):
        self.engine.tmat(agg, side)
        self._mark("side" if side else "main", f"T of columns {agg.a0}-{agg.a1}")

    def scale(self, phase):
        self.engine.scale(phase)
        self._mark("main", f"scale {phase}")

    def gemm(self, stage, *args, side=False, **kwargs):
        self.engine.gemm(stage, *args, side=side, **kwargs)
        self._mark("side" if side else "main", f"{stage} {args[2]}x{args[3]}x{args[4]}")

    def fused(self, *args):
        self.engine.fused(*args)
        width, rows, nc = args[6], args[7], args[9]
        self._mark("main", f"fused {width}x{nc}x{rows}")

    def fork(self):
        self._mark("main", "fork")
        self.engine.fork()

    def join(self):
        self.engine.join()
        self._mark("main", "join")

    def mark(self):
        self.engine.mark()

    def wait_mark(self):
        self.engine.wait_mark()
        self._mark("main", "wait for mark")


def timed_call(fac, a) -> tuple:
    """(start event, marks) of one call on a (one chunk), driven through Marked on the schedule's two streams."""
    device = a.device.id
    funcs = fac.functions(device)
    ws = Workspace(fac, a.shape[0], device)
    if ws.chunk < a.shape[0]:
        raise SystemExit(f"the batch runs in chunks of {ws.chunk}: time a batch of at most that")
    h, tau = a.copy(), cupy.empty((a.shape[0], fac.k), dtype=cupy.float32)
    start = cupy.cuda.Event()
    start.record()
    with ws.streams.from_stream(cupy.cuda.get_current_stream()):
        if ws.multi_block:
            ws.flags.fill(0)
        engine = Marked(CudaEngine(fac, ws, funcs, h.shape[0], h.data.ptr, tau.data.ptr, None, None, device, Direct(),
                                    ws.streams))
        drive(fac, engine)
    cupy.cuda.Device().synchronize()
    return start, engine.marks


def intervals_union(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b) -> float:
    """Total length of the intersection of two unions of intervals."""
    return sum(max(0.0, min(e, u) - max(s, t)) for s, e in a for t, u in b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=cases.EDITS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", type=cases.case, metavar="BATCHxMxN", help="such as 60x1024x1024")
    ap.add_argument("--list", action="store_true", help="also every launch, with its start and end")
    ap.add_argument("--variant", metavar="FIELD=VALUE[,...]", help="the case's schedule with these fields replaced")
    args = ap.parse_args()
    try:
        edits = cases.overrides(args.variant or "", cases.EDITS)
    except ValueError as exc:
        ap.error(str(exc))
    case, target = args.case, cases.target()
    schedule, _ = find(Problem(case.m, case.n, case.batch), target)
    fac = Factorizer(case.m, case.n, cases.edited(schedule, edits, target), target)
    if not fac.schedule.lookahead:
        raise SystemExit(f"{case}'s schedule has no lookahead: one stream")
    (a,) = cases.random_inputs(case.batch, case.m, case.n, count=1)
    timed_call(fac, a)
    start, marks = timed_call(fac, a)

    ends = {"main": 0.0, "side": 0.0}
    fork_at = 0.0
    spans = {"panel": [], "side": [], "main other": []}
    for stream, label, event in marks:
        end = cupy.cuda.get_elapsed_time(start, event) * 1e3
        begin = ends[stream]
        if stream == "side":
            begin = max(begin, fork_at)  # the side stream waits for the latest fork
        if label == "fork":
            fork_at = end
        if label in ("join", "wait for mark"):
            begin = end
        ends[stream] = end
        kind = "side" if stream == "side" else ("panel" if label.startswith("panel") else "main other")
        if label not in ("fork", "join", "wait for mark"):
            spans[kind].append((begin, end))
        if args.list:
            print(f"{stream:<5} {label:<40} {begin:10.1f} {end:10.1f} µs")
    total = max(ends.values())
    panels, side, other = (intervals_union(spans[k]) for k in ("panel", "side", "main other"))

    def length(u):
        return sum(e - s for s, e in u)

    print(f"{case}: {total:,.1f} µs; panels {length(panels):,.1f} µs, the main stream's other launches "
          f"{length(other):,.1f}, side-stream products {length(side):,.1f}; panels running beside side-stream "
          f"products {overlap(panels, side):,.1f} µs")


if __name__ == "__main__":
    main()
