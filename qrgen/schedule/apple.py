"""The default schedule on Apple GPUs (the Metal backend): a matrix that fits a threadgroup's memory in one kernel
(a "whole" panel); else rows panels on one threadgroup, the widest panel of at most 32 columns whose rows fit the
registers of a threadgroup, and aggregates of 4 panels for wide matrices. No
schedule has been tuned on an Apple GPU: this is a heuristic from the limits in qrgen/targets/metal.py alone, and
the place tuned files would take over (schedules/<family>/, as for CUDA) once an Apple GPU can run the tuner
(docs/decisions.md#apple-defaults)."""
from __future__ import annotations

from ..plan import rows
from ..plan.family import THREADS, register_cap
from .model import Panel, Schedule

WHOLE_SLICE = 8  # a whole Panel's slice, which Metal's whole kernel does not use (it factors column by column)
WHOLE_MAX_THREADS = 256

WIDTHS = (32, 16, 8, 4, 2, 1)
SLOTS_PREFERRED = 4  # rows per thread: the fewest threads that hold the panel in this many rows each, where they fit
AGGREGATE_PANELS = 4
AGGREGATE_MIN_K = 128  # narrower matrices update everything from each panel


def _fit(width: int, m: int, limits) -> int | None:
    """Threads for a rows panel of `width` columns over m rows: the fewest of THREADS with at most SLOTS_PREFERRED rows a
    thread whose registers fit, else the fewest that fit at all; None where none does."""
    fits = [t for t in THREADS if t <= limits.threads_per_block and t >= width
            and rows.registers(Panel(width, "rows", t), m) <= register_cap(t, limits)]
    preferred = [t for t in fits if -(-m // t) <= SLOTS_PREFERRED]
    return (preferred or fits or [None])[0]


def whole_schedule(problem, target) -> Schedule | None:
    """One threadgroup per matrix, the matrix in threadgroup memory, where it fits (plan/msl.check); else None."""
    from ..plan.planner import check

    threads = next((t for t in THREADS if t >= max(problem.m, problem.n)), THREADS[-1])
    threads = min(WHOLE_MAX_THREADS, threads)
    schedule = Schedule(problem.m, problem.n, (Panel(problem.k, "whole", threads, slice=WHOLE_SLICE),))
    try:
        check(schedule, target)
    except ValueError:
        return None
    return schedule


def default_schedule(problem, target) -> Schedule:
    return whole_schedule(problem, target) or rows_schedule(problem, target)


def rows_schedule(problem, target) -> Schedule:
    """Rows panels (and aggregates): the schedule of matrices too large for one threadgroup's memory, and of qr's Q
    for any (a whole kernel keeps no reflectors)."""
    m, k = problem.m, problem.k
    limits = target.limits
    for width in WIDTHS:
        width = min(width, k)
        threads = _fit(width, m, limits)
        if threads is not None:
            break
    else:
        raise ValueError(f"{m} rows do not fit one threadgroup's registers on {target.arch}, even in panels of one "
                         f"column; Metal has no TSQR panels yet")
    aggregate = AGGREGATE_PANELS * width if k >= AGGREGATE_MIN_K and k > AGGREGATE_PANELS * width else 0
    panels = [Panel(min(width, k - c), "rows", threads) for c in range(0, k, width)]
    return Schedule(problem.m, problem.n, tuple(panels), aggregate=aggregate)
