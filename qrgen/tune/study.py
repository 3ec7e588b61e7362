"""The optuna study: its storage and name, the constraint attribute, feasible trials and the result."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..paths import cache_dir
from ..plan.whole import SLICES as WHOLE_SLICES
from ..problem import Problem
from ..schedule.model import PANEL_UPDATES, PRECISIONS, PRODUCT_PRECISIONS, Schedule
from ..targets import Target
from ..version import __version__
from .evaluate import Outcome, TrialFailed
from .space import (
    AGGREGATES,
    ALL_FAMILIES,
    CLUSTER_SLOTS_CHOICES,
    CLUSTERS,
    COLS_CLUSTERS,
    COLS_SLICES,
    COLS_TAIL_WIDTHS,
    COLS_WIDTHS,
    LANES_SLOTS,
    LANES_WIDTHS,
    LOOKAHEADS,
    LOOPS,
    REACHES,
    ROWS_WIDTHS,
    HEAD_SHARES,
    TSQR_THREADS,
    TSQR_TILES,
    TSQR_WIDTHS,
    WHOLE_THREADS,
    default_params,
    schedule_from_params,
)

MIN_GAIN = 0.02  # a tuned point replaces the default only when this much faster (timing noise is about 1%)


# The final round: the fastest few schedules of the study, the default and the schedule file already there are
# measured again, in turn, RUNOFF_ROUNDS times each; the choice is made on those medians. A trial's first time is
# the minimum of many noisy ones and reads low (docs/decisions.md#final-round), and a file tuned in an earlier study
# deserves the same run.
RUNOFF_SIZE = 3


RUNOFF_ROUNDS = 3


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
    interrupted: bool = False  # Ctrl-C ended the search (the final round still ran)


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
             LANES_SLOTS, COLS_WIDTHS, COLS_TAIL_WIDTHS, COLS_SLICES, COLS_CLUSTERS, LOOPS, WHOLE_THREADS,
             WHOLE_SLICES, HEAD_SHARES, AGGREGATES, LOOKAHEADS, REACHES, PRECISIONS, PRODUCT_PRECISIONS, PANEL_UPDATES,
             ALL_FAMILIES, CONSTRAINT]
    return hashlib.sha256(repr(space).encode()).hexdigest()[:8]


def objective_name(multi_objective: bool) -> str:
    return "time+factor" if multi_objective else "time"


def study_name(problem: Problem, target: Target, device: str, multi_objective: bool = False) -> str:
    """One study per shape, batch, target, device and objective, readable (`optuna.get_all_study_names`); the
    search space's digest keeps a changed space from resuming a study it cannot (space_digest). The qrgen version
    is a study attribute, not part of the name: an upgrade resumes the same study."""
    return (f"{problem.m}x{problem.n} b{problem.batch} {target.arch} {device} {objective_name(multi_objective)} "
            f"(space {space_digest()})")


def study_attributes(device: str, multi_objective: bool) -> dict:
    """What a study records of the run that made it (optuna user attributes)."""
    attrs = {"qrgen": __version__, "device": device, "objective": objective_name(multi_objective),
             "space": space_digest()}
    try:
        from ..compile.nvrtc import version

        attrs["nvrtc"] = ".".join(map(str, version()))
    except Exception:  # no NVRTC: a cost-model study
        attrs["nvrtc"] = None
    return attrs


def open_study(name: str, storage: str, multi_objective: bool, sampler, attributes: dict):
    """The study of this name, made if new; a study of that name with another number of objectives is a clear
    error (optuna would fail on the first trial and leave it running)."""
    import optuna

    directions = ["minimize", "minimize"] if multi_objective else ["minimize"]
    try:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:  # no such study yet
        study = optuna.create_study(study_name=name, storage=storage, directions=directions, sampler=sampler)
        for key, value in attributes.items():
            study.set_user_attr(key, value)
        return study
    if len(study.directions) != len(directions):
        raise ValueError(f"the study {name!r} in {storage} has {len(study.directions)} objective(s), this search "
                         f"{len(directions)}: use another --storage or delete that study")
    return study


def fail(trial, reason: str):
    trial.set_user_attr("failure", reason)
    raise TrialFailed(reason)


CONSTRAINT = "constraint"  # user attribute: factor / limit - 1 and orthogonality / limit - 1 (feasible: both <= 0)


def excess(value: float, limit: float) -> float:
    """How far past its limit a measure is, as optuna's constraints take it (<= 0 satisfied; NaN, which optuna
    refuses, as infinitely far)."""
    excess = value / limit - 1
    return excess if excess == excess else float("inf")


def constraints(trial) -> list[float]:
    """The sampler's constraints of a finished trial."""
    return trial.user_attrs.get(CONSTRAINT, [0.0, 0.0])


def feasible(study) -> list:
    """The study's complete trials that passed the gates with the tuning margin (an inaccurate trial is complete,
    with the reason it failed)."""
    import optuna

    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and "failure" not in t.user_attrs]


def count_failed(study, passed: list) -> int:
    """Finished trials that did not pass: failed ones and those that missed the gates."""
    import optuna

    done = (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE)
    return sum(t.state in done for t in study.trials) - len(passed)


def pareto_front(trials: list) -> list:
    """The trials no other trial beats on both objectives (time and factor)."""
    return [t for t in trials if not any(u.values[0] <= t.values[0] and u.values[1] <= t.values[1] and
                                         u.values != t.values for u in trials)]


def outcome_of(trial) -> Outcome:
    return Outcome(trial.user_attrs["time_us"], trial.user_attrs["factor"], trial.user_attrs["orthogonality"])


def result_of(study, problem: Problem, storage: str, multi_objective: bool) -> TuneResult:

    complete = feasible(study)
    failed = count_failed(study, complete)
    if not complete:
        raise RuntimeError(f"no trial of {study.study_name} passed: {failed} failed; see the study in {storage}")
    if multi_objective:
        pareto = pareto_front(complete)
        front = tuple((dict(t.params), outcome_of(t)) for t in pareto)
        best = min(pareto, key=lambda t: t.values[0])
    else:
        front = ()
        best = min(complete, key=lambda t: t.values[0])
    params, outcome = dict(best.params), outcome_of(best)
    defaults = default_params(problem)
    default = next((outcome_of(t) for t in complete if dict(t.params) == defaults), None)
    if default is not None and outcome.time_us > default.time_us * (1 - MIN_GAIN):
        params, outcome = defaults, default  # within the noise of timing: the default stays
    return TuneResult(schedule_from_params(problem, params), params, outcome, len(complete), failed,
                      study.study_name, storage, front, default)
