"""Where a schedule's columns go: its aggregates and, for qr's Q, the blocks a keep plan keeps."""
from __future__ import annotations

from .specs import Aggregate, Kept


def aggregates(schedule) -> tuple[Aggregate, ...]:
    """The schedule's aggregates; without aggregation, each panel is its own and nothing follows its last panel.
    With Schedule.reach an aggregate's merged form updates from where the next aggregate ends (a keep plan merges
    every aggregate all the same, for Q)."""
    if not schedule.aggregate:
        return ()
    k, size = min(schedule.m, schedule.n), schedule.aggregate
    starts = schedule.starts()
    out = []
    for a0 in range(0, k, size):
        a1 = min(a0 + size, k)
        c1 = min(a1 + size, k) if schedule.reach and a1 < k else a1
        panels = [i for i, c in enumerate(starts) if a0 <= c < a1]
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
