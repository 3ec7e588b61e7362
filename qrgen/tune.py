"""Schedule search with optuna: the fastest schedule of a shape whose results pass the gates with margin.

The space: panel widths in two phases (a head of the columns and the rest, each with its own width), the panel
kernel family (warp/rows chosen per panel by the register model; lanes with its rows per warp; tsqr with its threads
and rows per tile; cols with its column slice; rows and lanes panels on one block or on a cluster of 2 to 8 blocks;
warp, rows and tsqr panels with their column loop unrolled or not; whole, the factorization in one kernel per matrix
with its threads and panel width), the aggregate size, how the panels' own products
run (cuBLAS, the split kernels or the fused kernel)
and the input precision of each trailing-update stage. Points the resource model rejects never compile. The
objective is the median time measured on the GPU (CUDA-graph replays), or
without a GPU the cost model's estimate; the constraint is that a batch of
every stress family at that shape passes the gates with margin (factor <= 10, orthogonality <= 50), checked on
the GPU, or without one by the NumPy reference in float32 with the schedule's rounding. A trial that fails
(rejected, compile error, launch failure, inaccurate) is recorded with its reason and the study goes on.
Studies live in optuna's RDB storage (SQLite in the cache directory by default) and resume where they stopped.
"""
from __future__ import annotations

import datetime
import hashlib
import math
import platform
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import __version__
from .codegen import without_idle_tf32x3
from .compile import cache_dir
from .problem import Problem, Target
from .schedule import (CLUSTER_LANE_SLOTS, CLUSTER_SLOTS, LANES_MAX_BATCH, LOOP_VARIANTS, MANY_WIDTH, MAX_CLUSTER,
                       PANEL_UPDATES, PRECISIONS, PRODUCT_PRECISIONS, SCHEDULE_DIR, TSQR_PANEL, WHOLE_SLICES, Panel,
                       Precision, Schedule, STAGES, cluster_panel, default_choices, default_many, default_panel,
                       default_reach, default_tsqr, default_whole, lanes_panel, load, save, schedule_path, tsqr_panel,
                       with_loop)

ROWS_WIDTHS = ("auto", 8, 16, 32)
LANES_WIDTHS = (8, 16, 32)
MIN_GAIN = 0.02  # a tuned point replaces the default only when this much faster (timing noise is about 1%)
# The final round: the fastest few schedules of the study, the default and the schedule file already there are
# measured again, in turn, RUNOFF_ROUNDS times each; the choice is made on those medians. A trial's first time is
# the minimum of many noisy ones (the best of 40 trials reads low: 5,109 µs at 60 x 1024² that timed 5,609 beside
# the committed schedule, BENCHMARKS.md, ninth session), and a file tuned in an earlier study deserves the same run.
RUNOFF_SIZE = 3
RUNOFF_ROUNDS = 3
CLUSTER_TRIALS_MAX_BATCH = 16  # early cluster trials while 8-block clusters of every matrix fit on the 132 SMs
CLUSTER_SLOTS_CHOICES = (1, 2, 4)  # most rows per thread of a cluster panel (schedule.cluster_panel)
CLUSTERS = (0, 2, 4, 8, 16)  # rows panels: 0 one block per matrix (or flag-exchanging blocks where one cannot hold it)
WIDE_CLUSTER_MAX_BATCH = 4  # an early lanes trial on clusters of 16 (schedule.MAX_CLUSTER) for this many matrices
LANES_SLOTS = ("auto", 4, 8, 16, 24, 32, 48, 64)  # rows per warp the lanes panels aim for
COLS_WIDTHS = (32, 48, 64, 96, 128)
COLS_SLICES = (2, 4, 8)
LOOPS = (False, True)  # Panel.loop of the warp and rows panels
SPLITS = (0.25, 0.5, 0.75, 1.0)
AGGREGATES = (0, 64, 128, 256)
LOOKAHEADS = (0, 2, 32)  # Schedule.lookahead (waves per side piece; 0 off), with aggregates
REACHES = (False, True)  # Schedule.reach, with lookahead
# Panel kernel families searched by default. "cols" ran correct on the GPU but slower than lanes and rows at every
# shape timed (BENCHMARKS.md, 2026-11-30): opt in with --with-cols.
FAMILIES = ("rows", "lanes", "tsqr", "whole")
ALL_FAMILIES = ("rows", "cols", "lanes", "tsqr", "whole")
# whole: the factorization in one kernel per matrix (fp32, no aggregates), with its threads and panel width, and its
# column loop; rejected by the resource model where the matrix does not fit in shared memory.
WHOLE_THREADS = (32, 64, 128, 256)
WHOLE_VARIATIONS = ((32, 4), (64, 8), (128, 8))  # tried early where a whole kernel fits and min(m, n) <= 128
# tsqr panels (trees of tiles, for tall panels of few matrices) where a panel has at least two tiles of rows; the
# other panels as the default heuristic's. Warm start: 16 columns on 256 threads, tiles of 512 rows, column loop
# (the best of the variants measured on the H200 at 1 x 100000x32 and 1 x 40000x256, BENCHMARKS.md, 13th session).
TSQR_WIDTHS = (8, 16, 32)
TSQR_THREADS = (64, 128, 256)
TSQR_TILES = (256, 512, 1024)
TSQR_WARM = {"tsqr_head": TSQR_PANEL["width"], "tsqr_threads": TSQR_PANEL["threads"], "tsqr_tile": TSQR_PANEL["tile"],
             "loop": TSQR_PANEL["loop"]}
TSQR_WARM_ROWS = 4096  # matrices of at least this many rows and at most CLUSTER_TRIALS_MAX_BATCH of them
TUNE_FACTOR_GATE = 10.0
TUNE_ORTHOGONALITY_GATE = 50.0
DEFAULT_PARAMS = {"family": "rows", "split": 1.0, "rows_head": "auto", "cluster": 0, "aggregate": 0,
                  "gram": "fp32", "project": "fp32", "update": "fp32", "panel_update": "cublas", "loop": False}


def default_params(problem: Problem, clustered: bool = True) -> dict:
    """The point of the space that is the default heuristic (schedule.default_schedule): the tuner's first trial.
    clustered=False: the heuristic without clusters (and without a whole kernel: default_whole)."""
    whole = default_whole(problem) if clustered else None
    if whole is not None:
        return _whole_params(whole.threads, whole.slice)
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


class TrialFailed(Exception):
    """A trial that produced no usable result; its message is the recorded reason."""


@dataclass(frozen=True)
class Outcome:
    time_us: float
    factor: float
    orthogonality: float

    @property
    def accurate(self) -> bool:
        return self.factor <= TUNE_FACTOR_GATE and self.orthogonality <= TUNE_ORTHOGONALITY_GATE


@dataclass(frozen=True)
class TuneResult:
    schedule: Schedule
    params: dict
    outcome: Outcome
    complete: int
    failed: int
    study_name: str
    storage: str
    pareto: tuple = ()  # (params, Outcome) of the Pareto front, multi-objective only
    default: Outcome | None = None  # the default schedule's trial in this study (None: not run or it failed)
    # The final round (single objective): each candidate's label ("trial N", "default", "existing file") and its
    # median time there; kept: the existing file stays (no candidate was MIN_GAIN faster), so nothing is written.
    final_round: tuple = ()
    kept: bool = False


# ---------------------------------------------------------------------------------------------------------------
# The space


def schedule_from_params(problem: Problem, params: dict) -> Schedule:
    """The schedule a point of the space stands for; ValueError where the resource model rejects it."""
    k = problem.k
    if params["family"] == "whole":
        return Schedule(problem.m, problem.n, (Panel(k, "whole", params["whole_threads"], slice=params["whole_slice"],
                                                     loop=params.get("loop", False)),))
    head_cols = k if params["split"] >= 1.0 else max(1, round(k * params["split"]))
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
        elif family == "lanes":  # lanes panels where one block holds the rows, else the default heuristic's
            width = min(params[f"lanes_{phase}"], remaining)
            blocks = params.get("lanes_cluster", 0) or 1
            panel = (lanes_panel(rows, width, params["lane_slots"], blocks)
                     or (cluster_panel(rows, width, blocks) if blocks > 1 else None) or default_panel(rows, remaining))
        elif family == "tsqr":
            panel = (tsqr_panel(rows, remaining, params[f"tsqr_{phase}"], params["tsqr_threads"], params["tsqr_tile"])
                     or default_panel(rows, remaining))
        elif family == "cols":
            width = min(params[f"cols_{phase}"], remaining)
            slice_ = max((c for c in COLS_SLICES if c <= min(params["slice"], width)), default=COLS_SLICES[0])
            panel = Panel(width, "cols", 32 * math.ceil(width / slice_), 1, slice_)
        else:
            raise ValueError(f"family must be one of {ALL_FAMILIES}, got {family!r}")
        panels.append(with_loop(panel, params.get("loop", False)))
        col += panel.width
    precision = Precision(params["gram"], params["project"], params["update"])
    lookahead = params.get("lookahead", 0) if aggregate else 0
    return without_idle_tf32x3(Schedule(problem.m, problem.n, tuple(panels), precision, aggregate,
                                        params.get("panel_update", "cublas"), lookahead,
                                        bool(lookahead) and params.get("reach", False)))


def sample(trial, problem: Problem, families: tuple[str, ...] = FAMILIES) -> dict:
    family = trial.suggest_categorical("family", families)
    if family == "whole":
        return _whole_params(trial.suggest_categorical("whole_threads", WHOLE_THREADS),
                             trial.suggest_categorical("whole_slice", WHOLE_SLICES),
                             trial.suggest_categorical("loop", LOOPS))
    params = {"family": family, "split": trial.suggest_categorical("split", SPLITS)}
    phases = ("head",) if params["split"] >= 1.0 else ("head", "tail")
    for phase in phases:
        if params["family"] == "rows":
            params[f"rows_{phase}"] = trial.suggest_categorical(f"rows_{phase}", ROWS_WIDTHS)
        elif params["family"] == "lanes":
            params[f"lanes_{phase}"] = trial.suggest_categorical(f"lanes_{phase}", LANES_WIDTHS)
        elif params["family"] == "tsqr":
            params[f"tsqr_{phase}"] = trial.suggest_categorical(f"tsqr_{phase}", TSQR_WIDTHS)
        else:
            params[f"cols_{phase}"] = trial.suggest_categorical(f"cols_{phase}", COLS_WIDTHS)
    if params["family"] == "cols":
        params["slice"] = trial.suggest_categorical("slice", COLS_SLICES)
    if params["family"] == "rows":
        params["cluster"] = trial.suggest_categorical("cluster", CLUSTERS)
        if params["cluster"]:
            params["cluster_slots"] = trial.suggest_categorical("cluster_slots", CLUSTER_SLOTS_CHOICES)
    if params["family"] == "tsqr":
        params["tsqr_threads"] = trial.suggest_categorical("tsqr_threads", TSQR_THREADS)
        params["tsqr_tile"] = trial.suggest_categorical("tsqr_tile", TSQR_TILES)
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
    params["panel_update"] = trial.suggest_categorical("panel_update", PANEL_UPDATES)
    for stage in ("gram", "project", "update"):
        params[stage] = trial.suggest_categorical(stage, PRECISIONS if stage == "gram" else PRODUCT_PRECISIONS)
    return params


# ---------------------------------------------------------------------------------------------------------------
# Evaluators: a schedule -> Outcome, or TrialFailed


class ModelEvaluator:
    """No GPU: time from the cost model; accuracy from the NumPy reference in float32, with the schedule's rounding,
    on one matrix of every stress family at the shape. Shapes past `proxy` rows or columns are judged on a proxy
    of at most proxy x proxy built from the same parameters; the gates scale with n, so a proxy is stricter than
    the real shape for the lower precisions (2048 and 4096 are judged at 1024)."""

    name = "cost model (no GPU)"

    def __init__(self, problem: Problem, proxy: int = 1024, batch: int = 1):
        self.problem = problem
        self.proxy = Problem(min(problem.m, proxy), min(problem.n, proxy), batch)
        self.batch = batch
        self._accuracy: dict[tuple, tuple[float, float]] = {}

    def __call__(self, schedule: Schedule, params: dict) -> Outcome:
        from .costmodel import estimate

        time_us = estimate(schedule, self.problem).total_us
        factor, orth = self.accuracy(schedule, params)
        return Outcome(time_us, factor, orth)

    def accuracy(self, schedule: Schedule, params: dict) -> tuple[float, float]:
        from . import reference
        from .check import check
        from .testing import FAMILIES, stress

        if (self.proxy.m, self.proxy.n) == (self.problem.m, self.problem.n):
            proxy_schedule = schedule
        else:
            try:
                proxy_schedule = schedule_from_params(self.proxy, params)
            except ValueError:  # the proxy cannot take these panels: judge the precision on default panels
                proxy_schedule = schedule_from_params(self.proxy, {**DEFAULT_PARAMS, **_precision_params(params)})
        key = (proxy_schedule.panels, proxy_schedule.precision)
        if key not in self._accuracy:
            worst_f = worst_o = 0.0
            for i, family in enumerate(FAMILIES):
                a = stress(family, self.proxy.m, self.proxy.n, self.batch, seed=i)
                h, tau = reference.geqrf(a, proxy_schedule, dtype=np.float32)
                f, o = check(a, h, tau).worst()
                worst_f, worst_o = max(worst_f, f), max(worst_o, o)
            self._accuracy[key] = (worst_f, worst_o)
        return self._accuracy[key]


def _precision_params(params: dict) -> dict:
    return {stage: params[stage] for stage in ("gram", "project", "update")}


class GPUEvaluator:
    """On the GPU: the schedule's kernels compiled (cached), timed on random batches (events, L2 flushed, median)
    as CUDA-graph replays, so that the host's per-call cost (tens of µs of Python, the same for every schedule)
    does not drown the differences between small schedules, and the gates checked on a batch of every stress
    family. Where a call cannot be captured the eager call is timed instead."""

    def __init__(self, problem: Problem, target: Target, reps: int = 10):
        import cupy

        self.problem, self.target, self.reps = problem, target, reps
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        rng = np.random.default_rng(0)
        shape = (problem.batch, problem.m, problem.n)
        self.inputs = [cupy.asarray(rng.standard_normal(shape, dtype=np.float32)) for _ in range(2)]
        self._hostile = None  # the gates' batch of every stress family, on the GPU once made
        self._accuracy: dict[Schedule, tuple[float, float]] = {}  # checked once per schedule (the final round times
        # its candidates again, not their results)
        self._compiling: dict = {}  # schedule -> Future of its kernels' compilation (prepare)
        self._pool = None

    def prepare(self, schedules: list) -> None:
        """Compile the kernels of trials to come in the background (into the disk cache) while the GPU measures
        the current one."""
        from concurrent.futures import ThreadPoolExecutor

        from .codegen import render_all
        from .compile import compile_many

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qrgen-tune-compile")
        for schedule in schedules:
            if schedule not in self._compiling:
                self._compiling[schedule] = self._pool.submit(
                    lambda sch: compile_many([(r.name, r.source) for r in render_all(sch, self.target.arch)],
                                             self.target.arch), schedule)

    def __call__(self, schedule: Schedule, params: dict) -> Outcome:
        import cupy

        from .bench import graph_time_us, median_time_us
        from .check import check
        from .runtime import Factorizer
        from .testing import mixed

        fac = Factorizer(self.problem.m, self.problem.n, schedule, self.target.arch)
        try:
            pending = self._compiling.pop(schedule, None)
            if pending is not None:
                pending.result()  # its errors are this trial's
            fac.build()
        except RuntimeError as exc:
            raise TrialFailed(f"compile error: {str(exc)[:300]}") from None
        try:
            stream = cupy.cuda.get_current_stream()
            try:
                time_us = graph_time_us(fac, self.inputs, self.reps)
            except cupy.cuda.runtime.CUDARuntimeError:
                raise
            except Exception:  # not capturable: the eager call
                time_us = median_time_us(lambda x: fac.run(x, stream), self.inputs, self.reps, warmup=2)
            if schedule not in self._accuracy:
                if self._hostile is None:  # made once per study: NumPy takes seconds for large matrices
                    a, _ = mixed(self.problem.m, self.problem.n, max(10, min(self.problem.batch, 32)), seed=1)
                    self._hostile = cupy.asarray(a)
                h, tau = fac.run(self._hostile, stream)
                self._accuracy[schedule] = check(self._hostile, h, tau).worst()  # float64 on the GPU
            f, o = self._accuracy[schedule]
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise TrialFailed(f"launch failure: {exc}") from None
        return Outcome(time_us, f, o)


# ---------------------------------------------------------------------------------------------------------------
# The search


def default_storage() -> str:
    path = cache_dir() / "tune.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def space_digest() -> str:
    """A short digest of the search space's choices: optuna refuses to resume a study whose categorical choices
    changed, so a study is named after the space it samples (a changed space starts a new study). CONSTRAINT is in
    it too: studies from before inaccurate trials were kept as infeasible hold them as failures, and their complete
    trials carry no constraint values (the sampler would rank them below every new one)."""
    space = [ROWS_WIDTHS, LANES_WIDTHS, TSQR_WIDTHS, TSQR_THREADS, TSQR_TILES, CLUSTER_SLOTS_CHOICES, CLUSTERS,
             LANES_SLOTS, COLS_WIDTHS, COLS_SLICES, LOOPS, WHOLE_THREADS, WHOLE_SLICES,
             SPLITS, AGGREGATES, LOOKAHEADS, REACHES, PRECISIONS, PRODUCT_PRECISIONS, PANEL_UPDATES, ALL_FAMILIES,
             CONSTRAINT]
    return hashlib.sha256(repr(space).encode()).hexdigest()[:8]


def study_name(problem: Problem, target: Target, device: str) -> str:
    return (f"qrgen-{__version__}|space-{space_digest()}|{target.arch}|{device}|{problem.m}x{problem.n}"
            f"|b{problem.batch}")


def _variations(problem: Problem) -> list[dict]:
    """Points near the default worth measuring early. With aggregates of 2048 columns or more, their products (long
    sums) in the other precision of fp32 and tf32, the panels' own products fp32 (split or fused): the NumPy
    reference with tf32 rounding gave worst factors 9.1 at 1024² and 4.9 at 2048², the H200 4.66 at 8 x 2048² (gate
    20, tuning margin 10). For up to 16 matrices, rows panels on clusters of 8 and of 4 blocks (the default's
    aggregates and precisions), then clusters of 8 with fewer rows per thread, then lanes panels on clusters of 8
    (16 and 32 rows per warp; for up to WIDE_CLUSTER_MAX_BATCH matrices also on clusters of 16); where the default
    has clusters, the default without them; where it has warp or rows panels, the other column loop; with
    aggregates, the other lookaheads (and with its lookahead, the other reach)."""
    params = default_params(problem)
    found = []
    if params["family"] == "whole":  # the default without it, and the other whole kernels
        found.append(default_params(problem, clustered=False))
    if problem.k <= 128:
        found += [_whole_params(t, s) for t, s in WHOLE_VARIATIONS
                  if (t, s) != (params.get("whole_threads"), params.get("whole_slice"))]
    if params["aggregate"] and problem.k >= 2048:
        other = "fp32" if params["project"] == "tf32" else "tf32"
        found.append({**params, "project": other, "update": other})
    if problem.batch <= CLUSTER_TRIALS_MAX_BATCH:
        shared = ("aggregate", "panel_update", *STAGES) + (("lookahead",) if "lookahead" in params else ())
        rows = {**DEFAULT_PARAMS, **{key: params[key] for key in shared}}
        found += [{**rows, "cluster": c, "cluster_slots": CLUSTER_SLOTS} for c in (8, 4) if c != params.get("cluster")]
        found += [{**rows, "cluster": 8, "cluster_slots": slots} for slots in CLUSTER_SLOTS_CHOICES
                  if slots != CLUSTER_SLOTS]
        lanes = {key: rows[key] for key in ("split", *shared)}
        wide = ((16, MAX_CLUSTER),) if problem.batch <= WIDE_CLUSTER_MAX_BATCH else ()
        found += [{**lanes, "family": "lanes", "lanes_head": 32, "lane_slots": slots, "lanes_cluster": blocks,
                   "loop": False} for slots, blocks in ((16, 8), (32, 8)) + wide]
        if problem.m >= TSQR_WARM_ROWS:
            found.append({**lanes, "family": "tsqr", **TSQR_WARM})
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
    256 columns), with lookahead 2: by hand, 640 x 512² ran 5.3% faster with aggregates of 64 and lookahead 2 than
    without aggregates, which 76 sampled trials had not found (BENCHMARKS.md, eleventh session)."""
    own = params["aggregate"]
    if own:
        sizes = [a for a in (own // 2, own * 2) if a in AGGREGATES and a < problem.k]
    else:
        sizes = [a for a in (64, 128) if problem.k >= 256]
    return [{**params, "aggregate": a, "lookahead": 2} for a in sizes]


def _has_loop_choice(problem: Problem, params: dict) -> bool:
    """Whether the point's schedule has warp or rows panels, for which Panel.loop is a choice."""
    try:
        return any(p.variant in LOOP_VARIANTS for p in schedule_from_params(problem, params).panels)
    except ValueError:
        return False


def _neighbour_params(problem: Problem, target: Target, root: Path | None) -> list[dict]:
    """Parameters of tuned schedules of the same shape (other batches), then the nearest shapes, as warm starts."""
    folder = Path(root or SCHEDULE_DIR) / target.arch
    found = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            schedule, prov = load(path)
        except (ValueError, OSError):
            continue
        params = prov.get("params")
        if params and params.get("aggregate") and "lookahead" not in params:  # tuned before lookahead existed
            params = {**params, "lookahead": schedule.lookahead}
        if params:
            distance = abs(math.log((schedule.m * schedule.n) / (problem.m * problem.n)))
            found.append((distance, params))
    found.sort(key=lambda item: item[0])
    return [params for _, params in found[:3]]


def tune(problem: Problem, target: Target, trials: int, evaluator=None, storage: str | None = None,
         multi_objective: bool = False, seed: int = 0, schedule_root: Path | None = None, log=print,
         families: tuple[str, ...] = FAMILIES, time_limit: float | None = None) -> TuneResult:
    """Run up to `trials` trials (no new one starts after `time_limit` seconds) and return the best so far; with one
    objective, chosen in a final round against the default and the schedule file already in `schedule_root`."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failed trials are reported by the progress line
    if evaluator is None:
        evaluator = _default_evaluator(problem, target)
    storage = storage or default_storage()
    name = study_name(problem, target, getattr(evaluator, "name", type(evaluator).__name__))
    if families != FAMILIES:
        name += "|" + "+".join(families)
    with warnings.catch_warnings():  # multivariate and group are marked experimental; they suit this space
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                             warn_independent_sampling=False, constraints_func=_constraints)
    directions = ["minimize", "minimize"] if multi_objective else ["minimize"]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions, sampler=sampler,
                                load_if_exists=True)
    if all(t.state == optuna.trial.TrialState.WAITING for t in study.trials):  # a new study: warm starts
        study.enqueue_trial(default_params(problem), skip_if_exists=True)
        for params in _variations(problem):
            study.enqueue_trial(params, skip_if_exists=True)
        for params in _neighbour_params(problem, target, schedule_root):
            if params.get("family") in families:
                study.enqueue_trial(params, skip_if_exists=True)

    measured: dict[Schedule, Outcome] = {}  # points of the space that give the same schedule are measured once

    def evaluate(trial, params, schedule, reason):
        """The trial's objective value(s); TrialFailed (after recording why) where it has none."""
        if schedule is None:
            return _fail(trial, reason)
        outcome = measured.get(schedule) or evaluator(schedule, params)
        measured[schedule] = outcome
        trial.set_user_attr("time_us", outcome.time_us)
        trial.set_user_attr("factor", outcome.factor)
        trial.set_user_attr("orthogonality", outcome.orthogonality)
        # An inaccurate trial keeps its time, marked infeasible (the sampler learns where the gates fail; a failed
        # trial would teach it nothing), and is never chosen.
        trial.set_user_attr(CONSTRAINT, [_excess(outcome.factor, TUNE_FACTOR_GATE),
                                         _excess(outcome.orthogonality, TUNE_ORTHOGONALITY_GATE)])
        if not outcome.accurate:
            trial.set_user_attr("failure", f"inaccurate: factor {outcome.factor:.3g} (limit {TUNE_FACTOR_GATE:g}), "
                                           f"orthogonality {outcome.orthogonality:.3g} (limit "
                                           f"{TUNE_ORTHOGONALITY_GATE:g})")
        return [outcome.time_us, outcome.factor] if multi_objective else outcome.time_us

    def ask():
        trial = study.ask()
        params = sample(trial, problem, families)
        try:
            return trial, params, schedule_from_params(problem, params), None
        except ValueError as exc:
            return trial, params, None, f"rejected by the resource model: {exc}"

    start = time.perf_counter()
    failed_state = optuna.trial.TrialState.FAIL
    # One trial ahead: where the evaluator can compile in the background (GPUEvaluator.prepare), the next trial's
    # kernels compile while the GPU measures this one. The sampler then decides without the last result.
    prepare = getattr(evaluator, "prepare", None)
    queue: list = []  # asked, not yet told
    done = 0

    def may_start() -> bool:  # the first trial always runs; after time_limit no new one starts
        return time_limit is None or (done == 0 and not queue) or time.perf_counter() - start <= time_limit

    try:
        while done < trials:
            while len(queue) < (2 if prepare else 1) and done + len(queue) < trials and may_start():
                queue.append(ask())
            if not queue:
                log(f"time limit of {time_limit:g} s reached after {done} trial(s)")
                break
            if prepare:
                prepare([schedule for _, _, schedule, _ in queue[1:]
                         if schedule is not None and schedule not in measured])
            trial, params, schedule, reason = queue[0]
            try:
                values = evaluate(trial, params, schedule, reason)
                state = trial.user_attrs.get("failure", "ok")
            except TrialFailed as exc:
                values, state = None, str(exc)
            queue.pop(0)
            study.tell(trial, values, state=optuna.trial.TrialState.COMPLETE if values is not None else failed_state)
            done += 1
            passed = feasible(study)
            failed = _failed(study, passed)
            best = min((t.values[0] for t in passed), default=float("nan"))
            log(f"[{done}/{trials}] trial {trial.number}: {state[:90]}; best {best:,.1f} µs; "
                f"{failed} failed; {time.perf_counter() - start:.0f} s")
    except KeyboardInterrupt:
        for trial, *_ in queue:  # the trial being measured and the one asked ahead
            trial.set_user_attr("failure", "interrupted")
            study.tell(trial, state=failed_state)
        log(f"interrupted: the study keeps its {len(study.trials)} trials in {storage} (run again to resume)")
        return _result(study, problem, storage, multi_objective)
    result = _result(study, problem, storage, multi_objective)
    if multi_objective:
        return result
    return final_round(result, study, problem, evaluator, _existing(problem, target, schedule_root), log)


def _existing(problem: Problem, target: Target, root: Path | None) -> tuple[Schedule, dict] | None:
    """The schedule file a tuned result would replace and its search parameters (provenance), where there is one
    that loads for this problem and names them (the cost model judges accuracy on a proxy built from them)."""
    path = schedule_path(problem, target, root)
    try:
        schedule, prov = load(path)
    except (ValueError, OSError, KeyError):
        return None
    params = prov.get("params")
    return (schedule, params) if params and (schedule.m, schedule.n) == (problem.m, problem.n) else None


def final_round(result: TuneResult, study, problem: Problem, evaluator, existing: tuple[Schedule, dict] | None,
                log=print) -> TuneResult:
    """Measure the study's RUNOFF_SIZE fastest schedules, the default and `existing` again, in turn, RUNOFF_ROUNDS
    times each, and choose on the medians: the fastest, unless it is not MIN_GAIN faster than the existing file
    (kept: result.kept) or, without one, than the default. A candidate that fails or misses the gates there
    drops out."""
    import optuna

    complete = sorted(feasible(study), key=lambda t: t.values[0])
    defaults = default_params(problem)
    candidates: dict[Schedule, tuple[str, dict]] = {}
    for t in complete:
        params = dict(t.params)
        try:
            schedule = schedule_from_params(problem, params)
        except ValueError:
            continue
        if schedule not in candidates and (len(candidates) < RUNOFF_SIZE or params == defaults):
            candidates[schedule] = ("default" if params == defaults else f"trial {t.number}", params)
    file_schedule = None
    if existing is not None:
        file_schedule, params = existing
        label, params = candidates.get(file_schedule, ("", params))
        candidates[file_schedule] = ("existing file" + (f" ({label})" if label else ""), params)
    if len(candidates) < 2:
        return result
    log(f"final round: {', '.join(label for label, _ in candidates.values())}, {RUNOFF_ROUNDS} times each")
    times: dict[Schedule, list[float]] = {s: [] for s in candidates}
    outcomes: dict[Schedule, Outcome] = {}
    for _ in range(RUNOFF_ROUNDS):
        for schedule in list(times):
            try:
                outcome = evaluator(schedule, candidates[schedule][1])
            except (TrialFailed, KeyError, ValueError) as exc:  # also an older file's parameters the model refuses
                log(f"final round: {candidates[schedule][0]} dropped: {exc}")
                del times[schedule]
                continue
            if not outcome.accurate:
                log(f"final round: {candidates[schedule][0]} dropped: factor {outcome.factor:.3g}, orthogonality "
                    f"{outcome.orthogonality:.3g}")
                del times[schedule]
                continue
            times[schedule].append(outcome.time_us)
            outcomes[schedule] = outcome
    if not times:
        return result
    median = {s: float(np.median(v)) for s, v in times.items()}
    best = min(median, key=median.get)
    baseline = file_schedule if file_schedule in median else next(
        (s for s in median if candidates[s][1] == defaults), None)
    if baseline is not None and median[best] > median[baseline] * (1 - MIN_GAIN):
        best = baseline
    summary = tuple((candidates[s][0], median[s]) for s in sorted(median, key=median.get))
    log(f"final round (median of {RUNOFF_ROUNDS}): " + "; ".join(f"{label} {t:,.1f} µs" for label, t in summary))
    out = Outcome(median[best], outcomes[best].factor, outcomes[best].orthogonality)
    default = next((Outcome(median[s], outcomes[s].factor, outcomes[s].orthogonality) for s in median
                    if candidates[s][1] == defaults), result.default)
    kept = file_schedule is not None and best == file_schedule
    return TuneResult(best, candidates[best][1], out, result.complete, result.failed, result.study_name,
                      result.storage, result.pareto, default, summary, kept)


def _fail(trial, reason: str):
    trial.set_user_attr("failure", reason)
    raise TrialFailed(reason)


CONSTRAINT = "constraint"  # user attribute: factor / limit - 1 and orthogonality / limit - 1 (feasible: both <= 0)


def _excess(value: float, limit: float) -> float:
    """How far past its limit a measure is, as optuna's constraints take it (<= 0 satisfied; NaN, which optuna
    refuses, as infinitely far)."""
    excess = value / limit - 1
    return excess if excess == excess else float("inf")


def _constraints(trial) -> list[float]:
    """The sampler's constraints of a finished trial."""
    return trial.user_attrs.get(CONSTRAINT, [0.0, 0.0])


def feasible(study) -> list:
    """The study's complete trials that passed the gates with the tuning margin (an inaccurate trial is complete,
    with the reason it failed)."""
    import optuna

    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and "failure" not in t.user_attrs]


def _failed(study, passed: list) -> int:
    """Finished trials that did not pass: failed ones and those that missed the gates."""
    import optuna

    done = (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE)
    return sum(t.state in done for t in study.trials) - len(passed)


def _front(trials: list) -> list:
    """The trials no other trial beats on both objectives (time and factor)."""
    return [t for t in trials if not any(u.values[0] <= t.values[0] and u.values[1] <= t.values[1] and
                                         u.values != t.values for u in trials)]


def _default_evaluator(problem: Problem, target: Target):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return GPUEvaluator(problem, target)
    except Exception:  # no driver or no device: search over the cost model
        pass
    return ModelEvaluator(problem)


def _outcome(trial) -> Outcome:
    return Outcome(trial.user_attrs["time_us"], trial.user_attrs["factor"], trial.user_attrs["orthogonality"])


def _result(study, problem: Problem, storage: str, multi_objective: bool) -> TuneResult:
    import optuna

    complete = feasible(study)
    failed = _failed(study, complete)
    if not complete:
        raise RuntimeError(f"no trial of {study.study_name} passed: {failed} failed; see the study in {storage}")
    if multi_objective:
        pareto = _front(complete)
        front = tuple((dict(t.params), _outcome(t)) for t in pareto)
        best = min(pareto, key=lambda t: t.values[0])
    else:
        front = ()
        best = min(complete, key=lambda t: t.values[0])
    params, outcome = dict(best.params), _outcome(best)
    defaults = default_params(problem)
    default = next((_outcome(t) for t in complete if dict(t.params) == defaults), None)
    if default is not None and outcome.time_us > default.time_us * (1 - MIN_GAIN):
        params, outcome = defaults, default  # within the noise of timing: the default stays
    return TuneResult(schedule_from_params(problem, params), params, outcome, len(complete), failed,
                      study.study_name, storage, front, default)


def provenance(result: TuneResult, evaluator_name: str) -> dict:
    from .compile import nvrtc_version

    info = {"origin": f"qrgen tune ({evaluator_name})", "qrgen": __version__,
            "date": datetime.date.today().isoformat(), "device": evaluator_name,
            "trials_complete": result.complete, "trials_failed": result.failed,
            "time_us": round(result.outcome.time_us, 2), "factor": round(result.outcome.factor, 4),
            "orthogonality": round(result.outcome.orthogonality, 4), "params": result.params,
            "default_time_us": None if result.default is None else round(result.default.time_us, 2),
            "study": result.study_name, "host": platform.node()}
    if result.default is not None and result.outcome == result.default:
        info["choice"] = f"the default: no trial was {MIN_GAIN:.0%} faster"
    if result.final_round:
        info["final_round_us"] = {label: round(t, 2) for label, t in result.final_round}
    try:
        info["nvrtc"] = ".".join(map(str, nvrtc_version()))
    except Exception:
        pass
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            info["driver"] = cupy.cuda.runtime.driverGetVersion()
            info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception:
        pass
    return info


def tune_and_save(problem: Problem, target: Target, trials: int, storage: str | None = None,
                  multi_objective: bool = False, schedule_root: Path | None = None, seed: int = 0,
                  evaluator=None, log=print, families: tuple[str, ...] = FAMILIES,
                  time_limit: float | None = None) -> tuple[TuneResult, Path]:
    evaluator = evaluator or _default_evaluator(problem, target)
    log(f"searching {trials} trial(s) for {problem.m}x{problem.n}, batch {problem.batch}, {target.arch} "
        f"with {getattr(evaluator, 'name', 'GPU')}")
    result = tune(problem, target, trials, evaluator, storage, multi_objective, seed, schedule_root, log, families,
                  time_limit)
    if result.kept:
        path = schedule_path(problem, target, schedule_root)
        log(f"kept {path}: no schedule of the study was {MIN_GAIN:.0%} faster than it in the final round")
        return result, path
    path = save(result.schedule, problem, target, provenance(result, getattr(evaluator, "name", "GPU")),
                root=schedule_root)
    log(f"best: {result.outcome.time_us:,.1f} µs, factor {result.outcome.factor:.3g}, orthogonality "
        f"{result.outcome.orthogonality:.3g}: {result.schedule.describe()}")
    if result.default is not None:  # measured in this study, so in the same run as the best (or an earlier one)
        log(f"default schedule: {result.default.time_us:,.1f} µs; tuned: {result.outcome.time_us:,.1f} µs "
            f"({result.default.time_us / result.outcome.time_us:.2f}x)")
    for params, outcome in result.pareto:
        log(f"  Pareto: {outcome.time_us:,.1f} µs, factor {outcome.factor:.3g}: {params}")
    log(f"wrote {path}")
    return result, path
