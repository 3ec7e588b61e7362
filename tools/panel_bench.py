"""One panel kernel alone on the GPU: an M x N matrix factored by one panel of N columns (nothing right of it), its
graph-replay time and time per column, with the gates on a batch of every stress family.

    python3 tools/panel_bench.py 60x1024x32:rows,threads=256,loop=1 60x512x32:lanes,slots=32
    python3 tools/panel_bench.py 8x2048x32:lanes,slots=16,blocks=8 1x40000x32:tsqr,threads=256,tile=512

A case is BATCHxMxN:VARIANT[,KEY=VALUE...], N <= M the panel's width, VARIANT a panel family (warp, rows, cols,
lanes, tsqr, whole) and the keys Panel's fields threads, blocks, cluster (0 or 1; default 1 where blocks > 1 for
lanes and rows), loop (0 or 1), slice and tile. A lanes panel without threads= is the one
qrgen.schedule.panels.lanes_panel builds for about slots=S rows a warp (default auto) on `blocks` blocks.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

from qrgen.bench import graph_time_us
from qrgen.plan.family import PANEL_VARIANTS
from qrgen.run.factorizer import Factorizer
from qrgen.schedule.model import Panel, Schedule
from qrgen.schedule.panels import lanes_panel
from tools import cases

FIELDS = {"threads": int, "blocks": int, "cluster": cases.flag, "loop": cases.flag, "slice": int, "tile": int,
          "slots": lambda v: v if v == "auto" else int(v)}


def panel_of(case) -> Panel:
    """The case's panel (ValueError where its fields are not a panel, or no lanes panel holds the rows)."""
    variant, _, options = case.options.partition(",")
    if variant not in PANEL_VARIANTS:
        raise ValueError(f"the options start with a panel variant, one of {PANEL_VARIANTS}; got {variant!r}")
    fields = cases.overrides(options, FIELDS)
    width = min(case.m, case.n)
    blocks = fields.get("blocks", 1)
    if variant == "lanes" and "threads" not in fields:
        panel = lanes_panel(case.m, width, fields.get("slots", "auto"), blocks)
        if panel is None:
            raise ValueError(f"no lanes panel holds {case.m} rows on {blocks} block(s)")
        return panel
    if "slots" in fields:
        raise ValueError("slots= applies to lanes panels without threads=")
    fields.setdefault("cluster", blocks > 1 and variant in ("lanes", "rows"))
    return Panel(width, variant, **fields)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("cases", nargs="+", type=cases.case_with_options, metavar="BATCHxMxN:VARIANT[,KEY=VALUE...]")
    ap.add_argument("--reps", type=int, default=30, help="graph replays timed (default 30)")
    args = ap.parse_args()
    target = cases.target()
    for case in args.cases:
        try:
            panel = panel_of(case)
            fac = Factorizer(case.m, case.n, Schedule(case.m, case.n, (panel,)), target)
        except ValueError as exc:
            print(f"{case}: does not fit ({exc})", flush=True)
            continue
        t = graph_time_us(fac, cases.random_inputs(case.batch, case.m, case.n, seed=1), args.reps)
        result = cases.gates(fac, case.batch, seed=3)
        print(f"{str(case):<40} {panel.threads:>4} threads x {panel.blocks}: {t:8.1f} µs "
              f"({t / panel.width:5.2f} µs a column); {result}", flush=True)


if __name__ == "__main__":
    main()
