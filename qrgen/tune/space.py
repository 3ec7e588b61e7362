"""The search space: the tuner's parameters (panel widths in two phases, the panel kernel family and its
choices, aggregates, lookahead, reach, how the panels' own products run, each stage's precision), the schedule a
point stands for (schedule_from_params), the default heuristic's point, and the early variations tried first."""
from __future__ import annotations

import dataclasses
import math

from ..plan.planner import check
from ..plan.tf32x3 import without_idle as without_idle_tf32x3
from ..plan.whole import SLICES as WHOLE_SLICES
from ..problem import Problem
from ..schedule.heuristic import (
    COLS_AGGREGATE_WIDTHS,
    LANES_MAX_BATCH,
    MANY_WIDTH,
    TF32_FROM,
    TF32_PROJECT_FROM,
    TSQR_PANEL,
    default_choices,
    default_cols,
    default_cols_aggregates,
    default_cols_tall,
    default_many,
    default_reach,
    default_tsqr,
    default_whole,
    default_wide_lanes,
    fitted_cols_schedule,
)
from ..schedule.model import (
    PANEL_UPDATES,
    PRECISIONS,
    PRODUCT_PRECISIONS,
    STAGES,
    Panel,
    Precision,
    Schedule,
    loop_applies,
)
from ..schedule.panels import (
    CLUSTER_LANE_SLOTS,
    CLUSTER_SLOTS,
    cluster_panel,
    cols_panel,
    default_panel,
    lanes_panel,
    tsqr_panel,
    wide_lanes_panel,
    with_loop,
)
from ..targets import Target

MAX_CLUSTER = 16  # the most blocks per cluster the space tries (sm_90's non-portable most)
ROWS_WIDTHS = ("auto", 8, 16, 32)


# past 32 the matrix's last panel (plan/lanes.py): up to 64 on one warp, two columns a lane, past 64 a warp for each 32
LANES_WIDTHS = (8, 16, 32, 64, 128)


CLUSTER_TRIALS_MAX_BATCH = 16  # early cluster trials while 8-block clusters of every matrix fit on the 132 SMs


CLUSTER_SLOTS_CHOICES = (1, 2, 4)  # most rows per thread of a cluster panel (schedule.cluster_panel)


CLUSTERS = (0, 2, 4, 8, 16)  # rows panels: 0 one block per matrix (or flag-exchanging blocks where one cannot hold it)


WIDE_CLUSTER_MAX_BATCH = 4  # an early lanes trial on clusters of 16 (schedule.MAX_CLUSTER) for this many matrices


LANES_SLOTS = ("auto", 4, 8, 16, 24, 32, 48, 64)  # rows per warp the lanes panels aim for


# "all": every column left, one panel where it fits; "tall": every panel the widest that fits its rows, each its own
# aggregate (schedule.heuristic.fitted_cols_schedule; the point's aggregate and lookahead are then not used)
COLS_WIDTHS = (32, 48, 64, 96, 128, "all", "tall")


COLS_TAIL_WIDTHS = COLS_WIDTHS[:-1]  # "tall" fits the whole matrix's panels: a head's choice only


COLS_SLICES = (2, 4, 8)
# cols panels: 0 one block a matrix, else its warps on a cluster of that many blocks (docs/decisions.md#cols-clusters)
COLS_CLUSTERS = (0, 2, 4)


LOOPS = (False, True)  # Panel.loop of the warp and rows panels


HEAD_SHARES = (0.25, 0.5, 0.75, 1.0)


AGGREGATES = (0, 64, 128, 256)


LOOKAHEADS = (0, 2, 32)  # Schedule.lookahead (waves per side piece; 0 off), with aggregates


REACHES = (False, True)  # Schedule.reach, with lookahead


# Panel kernel families searched (docs/decisions.md#tune-families).
ALL_FAMILIES = ("rows", "cols", "lanes", "tsqr", "whole")


FAMILIES = ALL_FAMILIES


# whole: the factorization in one kernel per matrix (fp32, no aggregates), with its threads and panel width, and its
# column loop; rejected by the resource model where the matrix does not fit in shared memory.
WHOLE_THREADS = (32, 64, 128, 256)


WHOLE_VARIATIONS = ((32, 4), (64, 8), (128, 8))  # tried early where a whole kernel fits and min(m, n) <= 128


# tsqr panels (trees of tiles, for tall panels of few matrices) where a panel has at least two tiles of rows; the
# other panels as the default heuristic's. Warm start: 16 columns on 256 threads, tiles of 512 rows, column loop
# (docs/decisions.md#tsqr-warm).
TSQR_WIDTHS = (8, 16, 32)


TSQR_THREADS = (64, 128, 256)


TSQR_TILES = (256, 512, 1024)


TSQR_SLICES = (0, 2, 4)  # 0: tiles factored as rows panels; else as cols panels, warps of at least this many columns


TSQR_WARM = {"tsqr_head": TSQR_PANEL["width"], "tsqr_threads": TSQR_PANEL["threads"], "tsqr_tile": TSQR_PANEL["tile"],
             "loop": TSQR_PANEL["loop"], "tsqr_slice": TSQR_PANEL["slice"]}


TSQR_WARM_ROWS = 4096  # matrices of at least this many rows and at most CLUSTER_TRIALS_MAX_BATCH of them


DEFAULT_PARAMS = {"family": "rows", "head_share": 1.0, "rows_head": "auto", "cluster": 0, "aggregate": 0,
                  "gram": "fp32", "project": "fp32", "update": "fp32", "panel_update": "cublas", "loop": False}


def default_params(problem: Problem, clustered: bool = True) -> dict:
    """The point of the space that is the default heuristic (schedule.default_schedule): the tuner's first trial.
    clustered=False: the heuristic without clusters (and without one kernel a matrix: default_whole, default_cols)."""
    base = {k: v for k, v in DEFAULT_PARAMS.items() if k not in ("rows_head", "cluster", "loop")}  # (cols: no loop)
    wide = default_wide_lanes(problem) if clustered else None
    if wide is not None:
        return {**{k: v for k, v in base.items() if k != "panel_update"}, "family": "lanes",
                "lanes_head": 64 if wide.threads == 32 else 128, "lane_slots": "auto", "lanes_cluster": 0,
                "loop": False}
    whole = default_whole(problem) if clustered else None
    if whole is not None:
        return _whole_params(whole.threads, whole.slice)
    cols = default_cols(problem) if clustered else None
    if cols is not None:
        return {**base, "family": "cols", "cols_head": "all", "slice": cols.slice,
                "cols_cluster": cols.blocks if cols.cluster else 0}
    aggregated = default_cols_aggregates(problem) if clustered else None
    if aggregated is not None:
        head = aggregated.panels[0]
        return {**base, "family": "cols", "cols_head": head.width, "slice": head.slice,
                "cols_cluster": head.blocks if head.cluster else 0, "aggregate": aggregated.aggregate, "lookahead": 0,
                **precision_params(dataclasses.asdict(aggregated.precision))}
    tall = default_cols_tall(problem) if clustered else None
    if tall is not None:
        head = tall.panels[0]
        return {**base, "family": "cols", "cols_head": "tall", "slice": head.slice, "cols_cluster": head.blocks,
                "aggregate": 0, **precision_params(dataclasses.asdict(tall.precision))}
    c = default_choices(problem, clustered)
    params = {**DEFAULT_PARAMS, "aggregate": c.aggregate, "panel_update": c.panel_update, "cluster": c.cluster,
              "loop": c.loop, **({"lookahead": c.lookahead} if c.aggregate else {}),
              **({"reach": c.reach} if c.lookahead else {}),
              "gram": c.precision.gram, "project": c.precision.project, "update": c.precision.update}
    if default_tsqr(problem):
        params.update(family="tsqr", **TSQR_WARM)
        del params["rows_head"], params["cluster"]
    elif c.cluster:  # lanes panels on clusters where they fit, rows panels on clusters elsewhere (cluster_lanes_panel)
        params.update(family="lanes", lanes_head=32, lane_slots=CLUSTER_LANE_SLOTS, lanes_cluster=c.cluster)
        del params["rows_head"], params["cluster"]
    elif default_many(problem):
        params.update(rows_head=MANY_WIDTH)
    elif problem.batch <= LANES_MAX_BATCH:
        params.update(family="lanes", lanes_head=32, lane_slots="auto", lanes_cluster=0)
        del params["rows_head"], params["cluster"]
    return params


def _whole_params(threads: int, slice_: int, loop: bool = False) -> dict:
    return {**DEFAULT_PARAMS, "family": "whole", "whole_threads": threads, "whole_slice": slice_, "loop": loop}


def schedule_from_params(problem: Problem, params: dict, target: Target = Target()) -> Schedule:
    """The schedule a point of the space stands for; ValueError where the resource model rejects it (the target's
    check: plan/planner.check)."""
    k = problem.k
    if params["family"] == "whole":
        schedule = Schedule(problem.m, problem.n, (Panel(k, "whole", params["whole_threads"],
                                                         slice=params["whole_slice"], loop=params.get("loop", False)),))
        check(schedule, target)
        return schedule
    if params["family"] == "cols" and params.get("cols_head") == "tall":
        return fitted_cols_schedule(problem.m, problem.n, params["slice"], params.get("cols_cluster", 0) or 1,
                                    Precision(params["gram"], params["project"], params["update"]), target)
    head_cols = k if params["head_share"] >= 1.0 else max(1, round(k * params["head_share"]))
    family = params["family"]
    aggregate = params.get("aggregate", 0)
    panels: list[Panel] = []
    col = 0
    while col < k:
        phase = "head" if col < head_cols else "tail"
        # No panel straddles an aggregate: the columns left before the next boundary bound its width.
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        rows, remaining = problem.m - col, end - col
        if family == "rows" and params.get("cluster", 0):  # a cluster of blocks per panel, where registers allow
            width = min(32 if params[f"rows_{phase}"] == "auto" else params[f"rows_{phase}"], remaining)
            slots = params.get("cluster_slots", CLUSTER_SLOTS)
            panel = cluster_panel(rows, width, params["cluster"], slots) or default_panel(rows, remaining)
        elif family == "rows":
            width = params[f"rows_{phase}"]
            panel = default_panel(rows, remaining) if width == "auto" else default_panel(rows, remaining, (width,))
        elif family == "lanes" and min(params[f"lanes_{phase}"], remaining) > 32:  # (on no cluster: lanes_cluster)
            panel = wide_lanes_panel(min(params[f"lanes_{phase}"], remaining))
        elif family == "lanes":  # lanes panels where one block holds the rows, else the default heuristic's
            width = min(params[f"lanes_{phase}"], remaining)
            blocks = params.get("lanes_cluster", 0) or 1
            panel = (lanes_panel(rows, width, params["lane_slots"], blocks)
                     or (cluster_panel(rows, width, blocks) if blocks > 1 else None) or default_panel(rows, remaining))
        elif family == "tsqr":
            panel = (tsqr_panel(rows, remaining, params[f"tsqr_{phase}"], params["tsqr_threads"], params["tsqr_tile"],
                                params.get("tsqr_slice", 0))
                     or default_panel(rows, remaining))
        elif family == "cols":
            if params[f"cols_{phase}"] == "tall":  # a point from before COLS_TAIL_WIDTHS
                raise ValueError("cols panels take \"tall\" for the head only (every panel of the matrix fitted)")
            width = remaining if params[f"cols_{phase}"] == "all" else min(params[f"cols_{phase}"], remaining)
            panel = cols_panel(width, params["slice"], params.get("cols_cluster", 0) or 1)
        else:
            raise ValueError(f"family must be one of {ALL_FAMILIES}, got {family!r}")
        panels.append(with_loop(panel, params.get("loop", False)))
        col += panel.width
    precision = Precision(params["gram"], params["project"], params["update"])
    lookahead = params.get("lookahead", 0) if aggregate else 0
    schedule = without_idle_tf32x3(Schedule(problem.m, problem.n, tuple(panels), precision, aggregate,
                                            params.get("panel_update", "cublas"), lookahead,
                                            bool(lookahead) and params.get("reach", False)))
    check(schedule, target)
    return schedule


def sample(trial, problem: Problem, families: tuple[str, ...] = FAMILIES) -> dict:
    family = trial.suggest_categorical("family", families)
    if family == "whole":
        return _whole_params(trial.suggest_categorical("whole_threads", WHOLE_THREADS),
                             trial.suggest_categorical("whole_slice", WHOLE_SLICES),
                             trial.suggest_categorical("loop", LOOPS))
    params = {"family": family, "head_share": trial.suggest_categorical("head_share", HEAD_SHARES)}
    phases = ("head",) if params["head_share"] >= 1.0 else ("head", "tail")
    for phase in phases:
        if params["family"] == "rows":
            params[f"rows_{phase}"] = trial.suggest_categorical(f"rows_{phase}", ROWS_WIDTHS)
        elif params["family"] == "lanes":
            params[f"lanes_{phase}"] = trial.suggest_categorical(f"lanes_{phase}", LANES_WIDTHS)
        elif params["family"] == "tsqr":
            params[f"tsqr_{phase}"] = trial.suggest_categorical(f"tsqr_{phase}", TSQR_WIDTHS)
        else:
            params[f"cols_{phase}"] = trial.suggest_categorical(
                f"cols_{phase}", COLS_WIDTHS if phase == "head" else COLS_TAIL_WIDTHS)
    if params["family"] == "cols":
        params["slice"] = trial.suggest_categorical("slice", COLS_SLICES)
        params["cols_cluster"] = trial.suggest_categorical("cols_cluster", COLS_CLUSTERS)
    if params["family"] == "rows":
        params["cluster"] = trial.suggest_categorical("cluster", CLUSTERS)
        if params["cluster"]:
            params["cluster_slots"] = trial.suggest_categorical("cluster_slots", CLUSTER_SLOTS_CHOICES)
    if params["family"] == "tsqr":
        params["tsqr_threads"] = trial.suggest_categorical("tsqr_threads", TSQR_THREADS)
        params["tsqr_tile"] = trial.suggest_categorical("tsqr_tile", TSQR_TILES)
        params["tsqr_slice"] = trial.suggest_categorical("tsqr_slice", TSQR_SLICES)
    if params["family"] in ("rows", "lanes", "tsqr"):  # lanes: its rows panels where lanes do not fit
        params["loop"] = trial.suggest_categorical("loop", LOOPS)
    if params["family"] == "lanes":
        params["lane_slots"] = trial.suggest_categorical("lane_slots", LANES_SLOTS)
        params["lanes_cluster"] = trial.suggest_categorical("lanes_cluster", CLUSTERS)
    params["aggregate"] = trial.suggest_categorical("aggregate", AGGREGATES)
    if params["aggregate"]:
        params["lookahead"] = trial.suggest_categorical("lookahead", LOOKAHEADS)
        if params["lookahead"]:
            params["reach"] = trial.suggest_categorical("reach", REACHES)
    # panels wider than 32 columns take no other panel update: cols panels that all are wider do not sample it, nor
    # do wide lanes panels (one a matrix: no products; the schedule's default, "cublas")
    wide = params["family"] == "cols" and all(params[f"cols_{phase}"] != 32 for phase in phases)
    if not (params["family"] == "lanes" and all(params[f"lanes_{phase}"] > 32 for phase in phases)):
        params["panel_update"] = "cublas" if wide else trial.suggest_categorical("panel_update", PANEL_UPDATES)
    for stage in ("gram", "project", "update"):
        params[stage] = trial.suggest_categorical(stage, PRECISIONS if stage == "gram" else PRODUCT_PRECISIONS)
    return params


def precision_params(params: dict) -> dict:
    return {stage: params[stage] for stage in ("gram", "project", "update")}


def variations(problem: Problem) -> list[dict]:
    """Points near the default worth measuring early. With aggregates of TF32_FROM columns or more, their products
    (long sums) in the other precision of fp32 and tf32, the panels' own products fp32 (split or fused): the NumPy
    reference with tf32 rounding gave worst factors 9.1 at 1024² and 4.9 at 2048², the H200 4.66 at 8 x 2048² (gate
    20, tuning margin 10); from TF32_PROJECT_FROM columns with tf32x3 updates, the projection in the other of tf32x3
    and tf32 (docs/decisions.md#tf32-project-from). Where the default is one kernel a matrix (whole, cols, a wide
    lanes panel), the default without it. For up to 16 matrices, rows panels on clusters of 8 and of 4 blocks (the
    default's aggregates and precisions), then clusters of 8 with fewer rows per thread, then lanes panels on
    clusters of 8 (16 and 32 rows per warp; for up to WIDE_CLUSTER_MAX_BATCH matrices also on clusters of 16); where
    the default has clusters, the default without them; where it has warp or rows panels, the other column loop;
    with aggregates, the other lookaheads (and with its lookahead, the other reach)."""
    params = default_params(problem)
    found = []
    one_kernel = params["family"] in ("whole", "cols") or params.get("lanes_head", 0) > 32
    if one_kernel:  # the default without its one kernel a matrix (and the other whole ones)
        found.append(default_params(problem, clustered=False))
    if problem.k <= 128:
        found += [_whole_params(t, s) for t, s in WHOLE_VARIATIONS
                  if (t, s) != (params.get("whole_threads"), params.get("whole_slice"))]
    if params["aggregate"] and problem.k >= TF32_FROM:
        other = "fp32" if params["project"] == "tf32" else "tf32"
        found.append({**params, "project": other, "update": other})
    elif params["aggregate"] and problem.k >= TF32_PROJECT_FROM and params["update"] == "tf32x3":
        found.append({**params, "project": "tf32x3" if params["project"] == "tf32" else "tf32"})
    if problem.batch <= CLUSTER_TRIALS_MAX_BATCH:
        shared = ("aggregate", "panel_update", *STAGES) + (("lookahead",) if "lookahead" in params else ())
        rows = {**DEFAULT_PARAMS, **{key: params[key] for key in shared if key in params}}
        found += [{**rows, "cluster": c, "cluster_slots": CLUSTER_SLOTS} for c in (8, 4) if c != params.get("cluster")]
        found += [{**rows, "cluster": 8, "cluster_slots": slots} for slots in CLUSTER_SLOTS_CHOICES
                  if slots != CLUSTER_SLOTS]
        lanes = {key: rows[key] for key in ("head_share", *shared)}
        wide = ((16, MAX_CLUSTER),) if problem.batch <= WIDE_CLUSTER_MAX_BATCH else ()
        found += [{**lanes, "family": "lanes", "lanes_head": 32, "lane_slots": slots, "lanes_cluster": blocks,
                   "loop": False} for slots, blocks in ((16, 8), (32, 8)) + wide]
        if problem.m >= TSQR_WARM_ROWS:
            found += [{**lanes, "family": "tsqr", **TSQR_WARM, "tsqr_slice": cut} for cut in TSQR_SLICES[:2]]
    if params.get("lanes_cluster"):  # the default's clusters: the default without them
        found.append(default_params(problem, clustered=False))
    if _has_loop_choice(problem, params):
        found.append({**params, "loop": not params["loop"]})
    if "lookahead" in params:
        found += [{**params, "lookahead": v} for v in LOOKAHEADS if v != params["lookahead"]]
        if params["lookahead"]:
            found.append({**params, "reach": not params.get("reach", False)})
    found += _aggregate_variations(problem, params)
    return [_with_reach(problem, p) for p in found]


def _with_reach(problem: Problem, params: dict) -> dict:
    """params naming reach exactly where the sampler asks for it (with a lookahead): the default's where unset."""
    params = {key: value for key, value in params.items() if key != "reach" or params.get("lookahead")}
    if params.get("lookahead") and "reach" not in params:
        params["reach"] = default_reach(problem, params["lookahead"])
    return params


def _aggregate_variations(problem: Problem, params: dict) -> list[dict]:
    """The default with the neighbouring aggregate sizes (half and twice its own; 64 and 128 where it has none, from
    256 columns), with lookahead 2: points sampled trials had missed (docs/decisions.md#aggregate-variations). A cols
    default whose panels are each their own aggregate: its panels and aggregates at the other widths of
    COLS_AGGREGATE_WIDTHS."""
    own = params["aggregate"]
    if params["family"] == "cols" and params.get("cols_head") == "tall":  # each its own aggregate: uniform widths
        return [{**params, "cols_head": a, "aggregate": a} for a in COLS_AGGREGATE_WIDTHS if a < problem.k]
    if params["family"] == "cols" and own:  # cols panels each its own aggregate: the other widths
        return [{**params, "cols_head": a, "aggregate": a} for a in COLS_AGGREGATE_WIDTHS if a != own and a < problem.k]
    if own:
        sizes = [a for a in (own // 2, own * 2) if a in AGGREGATES and a < problem.k]
    else:
        sizes = [a for a in (64, 128) if problem.k >= 256]
    return [{**params, "aggregate": a, "lookahead": 2} for a in sizes]


def _has_loop_choice(problem: Problem, params: dict) -> bool:
    """Whether the point's schedule has a panel for which Panel.loop is a choice (model.loop_applies)."""
    try:
        return any(loop_applies(p) for p in schedule_from_params(problem, params).panels)
    except ValueError:
        return False
