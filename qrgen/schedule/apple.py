"""The default schedule on Apple GPUs (the Metal backend): a matrix that fits a threadgroup's memory in one kernel
(a "whole" panel); else rows panels on one threadgroup, the widest panel of at most 32 columns whose rows fit the
registers of a threadgroup; where not even TSQR_WIDTH columns fit, tsqr panels of TSQR_WIDTH columns (tiles of
TSQR_TILE rows, a threadgroup each) for as long as they do not, then rows panels of that width; aggregates of 4
panels for wide matrices; the trailing products' inputs in half (G's in float) for matrices of at least HALF_FROM
rows and no more rows than columns, fp32 elsewhere. No schedule has been tuned on an Apple GPU: this is a heuristic from the limits in
qrgen/targets/metal.py alone, and the place tuned files would take over (schedules/<family>/, as for CUDA) once an
Apple GPU can run the tuner (docs/decisions.md#apple-defaults)."""
from __future__ import annotations

from ..plan import rows
from ..plan.family import THREADS, register_cap
from .model import Panel, Precision, Schedule
from .panels import tsqr_panel

WHOLE_SLICE = 8  # a whole Panel's slice, which Metal's whole kernel does not use (it factors column by column)
WHOLE_MAX_THREADS = 256

WIDTHS = (32, 16, 8, 4, 2, 1)
SLOTS_PREFERRED = 4  # rows per thread: the fewest threads that hold the panel in this many rows each, where they fit
AGGREGATE_PANELS = 4
AGGREGATE_MIN_K = 128  # narrower matrices update everything from each panel
# tsqr panels: the widest whose tile of a row a thread fits the register budget (plan/tsqr.registers) on the most
# threads whose register cap allows that
TSQR_WIDTH = 16
TSQR_THREADS = 256
TSQR_TILE = 256
# half inputs where every stress family keeps the tuner's margin (docs/decisions.md#apple-defaults)
HALF = Precision("fp32", "fp16", "fp16")
HALF_FROM = 2048


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
    return whole_schedule(problem, target) or panel_schedule(problem, target)


def panel_schedule(problem, target) -> Schedule:
    """Rows and tsqr panels (and aggregates): the schedule of matrices too large for one threadgroup's memory, and of
    qr's Q for any (a whole kernel keeps no reflectors)."""
    m, k = problem.m, problem.k
    limits = target.limits
    # the widest rows panel that fits; TSQR_WIDTH where not even that does (tsqr panels take those rows)
    width = next(min(w, k) for w in WIDTHS if w <= TSQR_WIDTH or _fit(min(w, k), m, limits))
    aggregate = AGGREGATE_PANELS * width if k >= AGGREGATE_MIN_K and k > AGGREGATE_PANELS * width else 0
    panels = []
    threads = _fit(width, m, limits)  # the rows panels' (None while tsqr panels take the rows)
    for c in range(0, k, width):
        w, rows_left = min(width, k - c), m - c
        threads = threads or _fit(w, rows_left, limits)
        panel = Panel(w, "rows", threads) if threads else tsqr_panel(rows_left, w, w, TSQR_THREADS, TSQR_TILE)
        if panel is None:
            raise ValueError(f"{rows_left} rows fit neither one threadgroup's registers on {target.arch} in a rows "
                             f"panel of {w} columns nor two tsqr tiles of {TSQR_TILE} rows")
        panels.append(panel)
    precision = HALF if HALF_FROM <= m <= problem.n else Precision()
    return Schedule(problem.m, problem.n, tuple(panels), precision=precision, aggregate=aggregate)
