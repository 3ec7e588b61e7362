"""The default schedule: a heuristic over the resource model, for shapes with no tuned file. Each rule's evidence
is in docs/decisions.md under the name it cites."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

from ..plan import cols
from ..plan.lanes import wide_code_rows
from ..problem import Problem
from ..targets import CLUSTERS, Target
from .model import Panel, Precision, Schedule
from .panels import (SM90, cluster_lanes_panel, cols_panel, default_panel, lanes_panel, tsqr_panel, wide_lanes_panel,
                     with_loop)

LANES_MAX_BATCH = 264  # lanes panels up to this many matrices (docs/decisions.md#lanes-max-batch)
DEFAULT_AGGREGATE = 128  # columns per aggregate (docs/decisions.md#aggregate-default)
AGGREGATE_FROM = 1024  # min(m, n) from which the heuristic aggregates
CLUSTER_FROM = 512  # rows from which panels run on clusters (docs/decisions.md#cluster-from) ...
ONE_PANEL_CLUSTER_FROM = 2048  # ... a one-panel matrix (n <= 32) only alone and from this many rows
TF32_FROM = 2048  # min(m, n) from which aggregates' products are tf32 (docs/decisions.md#tf32-from)
TF32_PROJECT_FROM = 1024  # min(m, n) from which the projection alone of tf32x3 aggregates is tf32 (#tf32-project-from)
MANY_FROM = 64  # many matrices of MANY_ROWS rows: the tuned 640 x 512² file's recipe (docs/decisions.md#many-matrices)
MANY_ROWS = (384, 512)  # min(m, n) from the first, m up to the second
MANY_WIDTH = 16
MANY_AGGREGATE = 64
FUSED_MAX_ROWS = 4096  # rows up to which the panels' own products are fused (docs/decisions.md#fused-panel-update) ...
FUSED_MAX_SINGLE = 4096 * 1024  # ... except one matrix of more elements than this (cuBLAS there)
# past FUSED_MAX_ROWS, the panels' own products by the rowsplit kernels for this many matrices or more, up to this
# many columns (docs/decisions.md#rowsplit-batches)
SPLIT_MIN_BATCH = 2
SPLIT_MAX_COLS = 512
CLUSTER_ROWS_PER_BLOCK = (256, 512)  # several matrices: rows a cluster block (docs/decisions.md#cluster-from)
CLUSTER_BLOCKS_MAX = 64  # the batch's clusters take at most this many blocks
TSQR_FROM = 8193  # tsqr panels from this many rows, past 16-block clusters (docs/decisions.md#tsqr-default) ...
TSQR_SINGLE_FROM = 16385  # ... for one matrix from this many: past the rows a cluster's rows panel holds
TSQR_ASPECT = 64  # ... and rows a column, for any number of matrices
TSQR_PANEL = {"width": 16, "threads": 256, "tile": 512, "loop": False, "slice": 2}  # cols tiles (plan/tsqr.py)
TSQR_AGGREGATE = 64  # ... aggregated from twice this many columns, the aggregates' products in tf32x3
TSQR_PRECISION = Precision(project="tf32x3", update="tf32x3")  # (docs/decisions.md#tsqr-tf32x3)
LOOKAHEAD_PIECES = 2  # Schedule.lookahead where the side products are fp32-class (docs/decisions.md#lookahead)
LOOKAHEAD_WHOLE = 32  # ... and where they run on tf32/fp16/bf16 tensor cores (one piece)
REACH_MAX_BATCH = 4  # Schedule.reach for lookahead schedules of at most this many matrices (docs/decisions.md#reach)
WHOLE_FROM = 1000  # one kernel per matrix for this many matrices at least (docs/decisions.md#whole-default) ...
WHOLE_ROWS = (33, 64)  # ... of m from the first to the second, 32 <= n <= m
WHOLE_SMALL = 48 * 48  # up to this many entries: 32 threads and panels of 4; above, 64 threads and panels of 8
WIDE_LANES_ROWS = 64  # one lanes panel on one warp for 32 < n <= m up to this many rows (docs/decisions.md#lanes-wide)
# ... its column loop unrolled by two (Panel.loop False), except for at most WIDE_ROLLED_MAX_BATCH matrices (a warp a
# scheduler or fewer: one warp's latency is the time) where the kernel's code is large (plan/lanes.wide_code_rows at
# least WIDE_ROLLED_MIN_CODE: unrolled, a warp alone waits on instruction fetch) (docs/decisions.md#lanes-wide-unroll)
WIDE_ROLLED_MAX_BATCH = 528
WIDE_ROLLED_MIN_CODE = 470
BLOCK_LANES_ROWS = 128  # ... on a warp for each 32 columns for n <= m up to this many, past COLS_MAX_BATCH matrices
COLS_FROM = 128  # the factorization in one cols panel (one block a matrix) from this many columns ...
COLS_MAX_BATCH = 132  # ... for at most this many matrices (one wave on the SMs: docs/decisions.md#cols-default)
COLS_SLICE = 8
COLS_CLUSTER_MAX_BATCH = 66  # up to this many matrices, each on a cluster of 2 blocks (one wave of pairs of SMs) ...
COLS_CLUSTER_SLICE = 4  # ... with warps of 4 columns (docs/decisions.md#cols-cluster)
COLS_AGGREGATE_WIDTHS = (128, 64)  # where one cols panel does not fit: cols panels of the widest of these that fits,
COLS_AGGREGATE_MAX_ROWS = 512  # each its own aggregate, up to this many rows (docs/decisions.md#cols-aggregates-default)
# Taller, up to COLS_TALL_MAX_ROWS rows, from COLS_TALL_MIN_COLS columns and COLS_TALL_MIN_BATCH to COLS_MAX_BATCH
# matrices: cols panels on clusters of two, each the widest of COLS_TALL_WIDTHS that fits its rows, each its own
# aggregate (the later block reusing the earlier one's reflector slots, consumers streaming reflectors past the
# register cap: docs/decisions.md#cols-tall)
COLS_TALL_WIDTHS = (128, 96, 64)
COLS_TALL_MAX_ROWS = 1024
COLS_TALL_MIN_COLS = 512
COLS_TALL_MIN_BATCH = 16
# registers kept free under the cap at 512 threads: the model admits 128 columns at 640 and 768 rows where ptxas spills
COLS_TALL_HEADROOM = 8
# the architectures it was measured on; sm_100's ptxas spills the 96-column panels at 928 and 1,024 rows
COLS_TALL_ARCHS = ("sm_90", "sm_90a")


@dataclass(frozen=True)
class DefaultChoices:
    """What the heuristic picks beside the panels (the tuner's default point states the same)."""
    cluster: int
    aggregate: int
    panel_update: str
    precision: Precision
    loop: bool  # Panel.loop for the warp and rows panels
    lookahead: int  # Schedule.lookahead
    reach: bool = False  # Schedule.reach


def cols_as_measured(schedule, target) -> bool:
    """Whether every cols panel of the schedule runs the kernel default_cols and default_cols_aggregates were
    measured with: consumers holding each reflector's rows (no streams) and each block holding every reflector.
    Streaming and slot reuse are for taller panels (default_cols_tall's, or schedules that ask for them)."""
    from ..plan.layout import aggregates
    from ..plan.planner import panel_outputs, prepares

    aggs = aggregates(schedule)
    for index, (panel, c0) in enumerate(zip(schedule.panels, schedule.starts())):
        if panel.variant != cols.VARIANT:
            continue
        rows = schedule.m - c0
        out = panel_outputs(schedule, index, aggs, target=target)
        prep = prepares(out)
        if (cols.streams(cols.slots(panel, rows), panel.slice, panel.threads)
                or cols.shared_bytes_of(panel.width, cols.slots(panel, rows), prep, t_out=out.t_out)
                > target.limits.shared_bytes):
            return False
    return True


def default_many(problem: Problem) -> bool:
    """Whether the problem takes the recipe for many matrices of 384 to 512 rows (MANY_FROM, MANY_ROWS)."""
    return problem.batch >= MANY_FROM and problem.k >= MANY_ROWS[0] and problem.m <= MANY_ROWS[1]


def default_aggregate(problem: Problem, target: Target = SM90) -> int:
    if default_many(problem):
        return MANY_AGGREGATE
    if problem.k < AGGREGATE_FROM:
        return 0
    if problem.batch >= 2 or default_panel(problem.m, problem.k, target=target).width < 16:
        return DEFAULT_AGGREGATE
    return 0


def default_panel_update(problem: Problem) -> str:
    """"fused" up to FUSED_MAX_ROWS rows (docs/decisions.md#fused-panel-update); past them the rowsplit kernels for
    SPLIT_MIN_BATCH matrices or more of at most SPLIT_MAX_COLS columns (batched cuBLAS sums each matrix's long
    products on few blocks: docs/decisions.md#rowsplit-batches), else cuBLAS."""
    if problem.m > FUSED_MAX_ROWS:
        return "rowsplit" if problem.batch >= SPLIT_MIN_BATCH and problem.n <= SPLIT_MAX_COLS else "cublas"
    if problem.batch == 1 and problem.m * problem.n > FUSED_MAX_SINGLE:
        return "cublas"
    return "fused"


def default_cluster(problem: Problem, target: Target = SM90) -> int:
    """Blocks per cluster of the default's panels (0: none; docs/decisions.md#cluster-from): the target's most
    for one matrix of CLUSTER_FROM rows or more; for several, the most blocks of CLUSTER_ROWS_PER_BLOCK rows such that
    the batch's clusters take at most CLUSTER_BLOCKS_MAX blocks."""
    most = target.limits.cluster_max
    if not target.has(CLUSTERS) or problem.m < CLUSTER_FROM:
        return 0
    if problem.n <= 32 and not (problem.batch == 1 and problem.m >= ONE_PANEL_CLUSTER_FROM):
        return 0
    if problem.batch == 1:
        return most
    most_rows, fewest_rows = CLUSTER_ROWS_PER_BLOCK[1], CLUSTER_ROWS_PER_BLOCK[0]
    fewest = max(2, 1 << (math.ceil(problem.m / most_rows) - 1).bit_length())  # power of two >= m / 512
    blocks = min(most, 1 << (problem.m // fewest_rows).bit_length() - 1)  # power of two <= m / 256
    while blocks >= fewest and problem.batch * blocks > CLUSTER_BLOCKS_MAX:
        blocks //= 2
    return blocks if blocks >= fewest else 0


def default_tsqr(problem: Problem) -> bool:
    """Whether the heuristic gives `problem` tsqr panels."""
    least = TSQR_SINGLE_FROM if problem.batch == 1 else TSQR_FROM
    return problem.m >= max(least, TSQR_ASPECT * problem.n)


def default_precision(problem: Problem, aggregate: int = 0, panel_update: str = "cublas") -> Precision:
    """fp32 everywhere, except the aggregates' products: tf32 from TF32_FROM columns where the panels' own products
    stay fp32 (rowsplit or fused), else tf32x3_precision (docs/decisions.md#tf32-from)."""
    if aggregate and panel_update in ("rowsplit", "fused") and problem.k >= TF32_FROM:
        return Precision(project="tf32", update="tf32")
    if aggregate:
        return tf32x3_precision(problem.k, own_products=panel_update == "cublas")
    return Precision()


def tf32x3_precision(k: int, own_products: bool = False) -> Precision:
    """The aggregates' products in tf32x3, except the projection in tf32 from TF32_PROJECT_FROM columns where no
    panel's own products take the schedule's precisions through cuBLAS (`own_products`: aggregates wider than their
    panels with cuBLAS's panel products) (docs/decisions.md#tf32-project-from)."""
    return Precision(project="tf32" if k >= TF32_PROJECT_FROM and not own_products else "tf32x3", update="tf32x3")


def default_loop(problem: Problem) -> bool:
    """Column loops (Panel.loop) for the warp and rows panels where more matrices than LANES_MAX_BATCH share the
    SMs, whose blocks at different columns then compete for the instruction cache (docs/decisions.md#column-loop)."""
    return problem.batch > LANES_MAX_BATCH


def default_lookahead(problem: Problem, aggregate: int, precision: Precision) -> int:
    """Lookahead for aggregated batches of 2 or more (docs/decisions.md#lookahead)."""
    if not aggregate or problem.batch < 2:
        return 0
    return LOOKAHEAD_PIECES if precision.update in ("fp32", "tf32x3") else LOOKAHEAD_WHOLE


def default_reach(problem: Problem, lookahead: int) -> bool:
    """Schedule.reach for lookahead schedules of few matrices, whose panels leave most SMs to the side stream."""
    return bool(lookahead) and problem.batch <= REACH_MAX_BATCH


def fit_aggregate(aggregate: int, target: Target) -> int:
    """An aggregate no wider than the target's T kernel takes (plan/tmat.max_reflectors: 64 columns where a block
    has 99 KB of shared memory)."""
    from ..plan.tmat import max_reflectors

    return min(aggregate, max_reflectors(target)) if aggregate else 0


def default_choices(problem: Problem, clustered: bool = True, target: Target = SM90) -> DefaultChoices:
    """clustered=False: the heuristic as it would be without clusters."""
    if default_tsqr(problem):
        aggregate = fit_aggregate(TSQR_AGGREGATE if problem.k >= 2 * TSQR_AGGREGATE else 0, target)
        return DefaultChoices(0, aggregate, default_panel_update(problem), TSQR_PRECISION if aggregate else Precision(),
                              TSQR_PANEL["loop"], 0)
    cluster = default_cluster(problem, target) if clustered and not default_many(problem) else 0
    aggregate = fit_aggregate(0 if cluster and problem.batch == 1 else default_aggregate(problem, target), target)
    update = default_panel_update(problem)
    precision = default_precision(problem, aggregate, update)
    lookahead = default_lookahead(problem, aggregate, precision)
    return DefaultChoices(cluster, aggregate, update, precision, default_loop(problem) or default_many(problem),
                          lookahead, default_reach(problem, lookahead))


def default_whole(problem: Problem) -> Panel | None:
    """The default's "whole" panel for the problem (WHOLE_FROM, WHOLE_ROWS), or None where it takes panels."""
    m, n = problem.m, problem.n
    if problem.batch < WHOLE_FROM or not WHOLE_ROWS[0] <= m <= WHOLE_ROWS[1] or not 32 <= n <= m:
        return None
    threads, slice_ = (32, 4) if m * n <= WHOLE_SMALL else (64, 8)
    return Panel(problem.k, "whole", threads, slice=slice_)


def default_wide_lanes(problem: Problem) -> Panel | None:
    """The default's one lanes panel over all n columns (docs/decisions.md#lanes-wide): on one warp (two columns a
    lane) for 32 < n <= m <= WIDE_LANES_ROWS, any batch; on a warp for each 32 columns for WIDE_LANES_ROWS < n <= m <=
    BLOCK_LANES_ROWS past COLS_MAX_BATCH matrices (fewer take cols panels, default_cols, or panels); or None."""
    n, m = problem.n, problem.m
    if 32 < n <= m <= WIDE_LANES_ROWS or (
            WIDE_LANES_ROWS < n <= m <= BLOCK_LANES_ROWS and problem.batch > COLS_MAX_BATCH):
        rolled = problem.batch <= WIDE_ROLLED_MAX_BATCH and wide_code_rows(n, m) >= WIDE_ROLLED_MIN_CODE
        return with_loop(wide_lanes_panel(n), rolled)
    return None


def _cols_shapes(problem: Problem) -> tuple[tuple[int, int], ...]:
    """(slice, blocks) of the default's cols panels in order of preference: a cluster of two blocks with 4 columns a
    warp for at most COLS_CLUSTER_MAX_BATCH matrices, then one block with 8."""
    cluster = ((COLS_CLUSTER_SLICE, 2),) if problem.batch <= COLS_CLUSTER_MAX_BATCH else ()
    return cluster + ((COLS_SLICE, 1),)


def default_cols(problem: Problem, target: Target = SM90) -> Panel | None:
    """The default's one cols panel over all n columns (COLS_FROM, COLS_MAX_BATCH, n <= m): on a cluster of 2 blocks
    a matrix for at most COLS_CLUSTER_MAX_BATCH matrices where the target has clusters and fits it, else on one block
    where that fits; or None."""
    from ..plan.planner import check

    n = problem.n
    if problem.batch > COLS_MAX_BATCH or not COLS_FROM <= n <= problem.m:
        return None
    for slice_, blocks in _cols_shapes(problem):
        try:  # Panel refuses more than 1024 threads, check what the target cannot hold or run
            panel = cols_panel(n, slice_, blocks)
            schedule = Schedule(problem.m, n, (panel,))
            check(schedule, target)
        except ValueError:
            continue
        if cols_as_measured(schedule, target):
            return panel
    return None


def default_cols_aggregates(problem: Problem, target: Target = SM90) -> Schedule | None:
    """Where one cols panel does not fit (default_cols) and m <= COLS_AGGREGATE_MAX_ROWS: cols panels over the k
    columns of the widest of COLS_AGGREGATE_WIDTHS the target fits (the same slices and clusters), each its own
    aggregate, the aggregates' products in tf32x3 (docs/decisions.md#cols-aggregates-default); a wide matrix's
    columns past k take the aggregates' updates. Past COLS_MAX_BATCH matrices only where that width is not the
    widest (their rows too many for it). Or None, also for one matrix that default_cluster puts on clusters (from
    CLUSTER_FROM rows)."""
    from ..plan.planner import check
    from ..plan.tf32x3 import without_idle

    m, n, k = problem.m, problem.n, problem.k
    if not (COLS_FROM <= k and m <= COLS_AGGREGATE_MAX_ROWS):
        return None
    if problem.batch == 1 and default_cluster(problem, target):  # one matrix on the widest clusters instead
        return None
    for slice_, blocks in _cols_shapes(problem):
        for width in COLS_AGGREGATE_WIDTHS:
            try:
                panels = tuple(cols_panel(min(width, k - col), slice_, blocks) for col in range(0, k, width))
                schedule = without_idle(Schedule(m, n, panels, tf32x3_precision(k),
                                                 fit_aggregate(width, target)))
                check(schedule, target)
            except ValueError:
                continue
            if not cols_as_measured(schedule, target):
                continue
            if problem.batch > COLS_MAX_BATCH and width == COLS_AGGREGATE_WIDTHS[0]:
                return None  # past one wave, only panels narrower than the widest gain (on the taller matrices)
            return schedule
    return None


def fitted_cols_schedule(m: int, n: int, slice_: int, blocks: int, precision: Precision,
                         target: Target = SM90) -> Schedule:
    """Cols panels over n columns, each the widest of COLS_TALL_WIDTHS (`slice_` columns a warp, on `blocks` blocks)
    that fits at its rows with COLS_TALL_HEADROOM registers to spare at 512 threads and more, each its own
    aggregate; ValueError where no width fits or the target refuses the schedule."""
    from ..plan import family
    from ..plan.planner import check
    from ..plan.tmat import max_reflectors

    widths = [w for w in COLS_TALL_WIDTHS if w <= max_reflectors(target)]
    panels, col = [], 0
    while col < n:
        rows = m - col
        for width in widths:
            panel = cols_panel(min(width, n - col), slice_, blocks)
            cap = family.register_cap(panel.threads, target.limits)
            cap -= COLS_TALL_HEADROOM if panel.threads >= 512 else 0
            if (panel.blocks == blocks and cols.registers(panel, rows) <= cap
                    and cols.shared_bytes(panel, rows, False, m, n) <= target.limits.shared_bytes):
                break
        else:
            raise ValueError(f"no cols panel of {widths} columns fits {rows} rows on {target.arch}")
        panels.append(panel)
        col += panel.width
    schedule = Schedule(m, n, tuple(panels), precision, tuple(p.width for p in panels))
    check(schedule, target)
    return schedule


def default_cols_tall(problem: Problem, target: Target = SM90) -> Schedule | None:
    """Past COLS_AGGREGATE_MAX_ROWS up to COLS_TALL_MAX_ROWS rows, COLS_TALL_MIN_COLS <= n <= m, COLS_TALL_MIN_BATCH to
    COLS_MAX_BATCH matrices, on COLS_TALL_ARCHS: fitted_cols_schedule with 4 columns a warp on clusters of two, the
    products as tf32x3_precision gives them (docs/decisions.md#cols-tall). Or None."""
    m, n = problem.m, problem.n
    if not (COLS_AGGREGATE_MAX_ROWS < m <= COLS_TALL_MAX_ROWS and COLS_TALL_MIN_COLS <= n <= m
            and COLS_TALL_MIN_BATCH <= problem.batch <= COLS_MAX_BATCH and target.arch in COLS_TALL_ARCHS):
        return None
    try:
        return fitted_cols_schedule(m, n, COLS_CLUSTER_SLICE, 2, tf32x3_precision(problem.k), target)
    except ValueError:
        return None


def default_schedule(problem: Problem, target: Target = SM90) -> Schedule:
    if target.record.heuristic:  # a backend with its own (Metal: schedule/apple.py)
        return importlib.import_module(target.record.heuristic).default_schedule(problem, target)
    one = default_wide_lanes(problem) or default_whole(problem) or default_cols(problem, target)
    if one is not None:
        return Schedule(problem.m, problem.n, (one,))
    aggregated = default_cols_aggregates(problem, target) or default_cols_tall(problem, target)
    if aggregated is not None:
        return aggregated
    choices = default_choices(problem, target=target)
    cluster, aggregate = choices.cluster, choices.aggregate
    many = default_many(problem)
    lanes = problem.batch <= LANES_MAX_BATCH and not cluster and not many
    tsqr = default_tsqr(problem)
    panels: list[Panel] = []
    col = 0
    while col < problem.k:
        end = problem.k if not aggregate else min(problem.k, (col // aggregate + 1) * aggregate)
        rows, width = problem.m - col, min(32, end - col)
        panel = (tsqr_panel(rows, end - col, TSQR_PANEL["width"], TSQR_PANEL["threads"], TSQR_PANEL["tile"],
                            TSQR_PANEL["slice"])
                 if tsqr else None)
        panel = panel or (cluster_lanes_panel(rows, width, cluster, target=target) if cluster else None)
        panel = panel or (lanes_panel(rows, width, "auto", target=target) if lanes else None)
        panel = panel or default_panel(rows, end - col, (MANY_WIDTH,) if many else (32, 16, 8), target)
        panels.append(with_loop(panel, choices.loop))
        col += panel.width
    return Schedule(problem.m, problem.n, tuple(panels), choices.precision, aggregate, choices.panel_update,
                    choices.lookahead, choices.reach)
