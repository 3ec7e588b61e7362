"""Where a schedule's columns go: its aggregates and, for qr's Q, the blocks a keep plan keeps."""
from __future__ import annotations

from .specs import Aggregate, Kept


def aggregates(schedule) -> tuple[Aggregate, ...]:
    """The schedule's aggregates; without aggregation, each panel is its own and nothing follows its last panel.
    With Schedule.reach an aggregate's merged form updates from where the next aggregate ends (a keep plan merges
    every aggregate all the same, for Q)."""
    windows = schedule.windows()
    starts = schedule.starts()
    out = []
    for i, (a0, a1) in enumerate(windows):
        c1 = windows[i + 1][1] if schedule.reach and i + 1 < len(windows) else a1
        panels = [p for p, c in enumerate(starts) if a0 <= c < a1]
        out.append(Aggregate(a0, a1, schedule.m - a0, schedule.n - c1, panels[0], panels[-1], c1))
    return tuple(out)


def kept_blocks(launches, aggs) -> tuple[Kept, ...]:
    """A keep plan's kept blocks in order: its aggregates where it has them, else its panels."""
    spans = ([(a.a0, a.a1 - a.a0, a.rows, "aggregate_wy") for a in aggs]
             or [(L.c0, L.width, L.rows, "panel_wy") for L in launches])
    out, at = [], 0
    for c0, width, rows, wy in spans:
        out.append(Kept(c0, width, rows, at, wy))
        at += width * rows
    return tuple(out)
