"""qrgen tune: the search loop (warm starts, early variations, trials), the final comparison against the
existing file, provenance, and writing the schedule file."""
from __future__ import annotations

import datetime
import math
import platform
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..paths import schedule_roots
from ..problem import Problem
from ..schedule.files import TUNER_FIELDS, load, lookup, save, tuner_params
from ..schedule.model import Schedule
from ..targets import Target
from ..version import __version__
from .evaluate import (
    TUNE_FACTOR_GATE,
    TUNE_ORTHOGONALITY_GATE,
    Outcome,
    TrialFailed,
    default_evaluator,
)
from .space import FAMILIES, default_params, sample, schedule_from_params, variations
from .study import (
    CONSTRAINT,
    MIN_GAIN,
    RUNOFF_ROUNDS,
    RUNOFF_SIZE,
    TuneResult,
    constraints,
    count_failed,
    default_storage,
    excess,
    fail,
    feasible,
    open_study,
    pareto_front,
    result_of,
    study_attributes,
    study_name,
)


def _neighbour_params(problem: Problem, target: Target, root: Path | None) -> list[dict]:
    """Parameters of tuned schedules of the same shape (other batches), then the nearest shapes, as warm starts."""
    found = []
    folders = [folder / target.arch for folder in schedule_roots(root)]
    for path in [p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.json"))]:
        try:
            schedule, prov = load(path)
        except (ValueError, OSError):
            continue
        params = tuner_params(prov)  # a stale point (the file amended since) is no warm start
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
    """Run up to `trials` trials (no new one starts after `time_limit` seconds, none after Ctrl-C) and return the
    choice of a final round among the study's best (with two objectives, of its Pareto front), the default and the
    schedule file that serves the problem now (lookup in `schedule_root`, else the user's and the shipped folders)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failed trials are reported by the progress line
    if evaluator is None:
        evaluator = default_evaluator(problem, target)
    storage = storage or default_storage()
    device = getattr(evaluator, "name", type(evaluator).__name__)
    name = study_name(problem, target, device, multi_objective)
    if families != FAMILIES:
        name += " " + "+".join(families)
    with warnings.catch_warnings():  # multivariate and group are marked experimental; they suit this space
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                             warn_independent_sampling=False, constraints_func=constraints)
    study = open_study(name, storage, multi_objective, sampler, study_attributes(device, multi_objective))
    if all(t.state == optuna.trial.TrialState.WAITING for t in study.trials):  # a new study: warm starts
        study.enqueue_trial(default_params(problem), skip_if_exists=True)
        for params in variations(problem):
            study.enqueue_trial(params, skip_if_exists=True)
        for params in _neighbour_params(problem, target, schedule_root):
            if params.get("family") in families:
                study.enqueue_trial(params, skip_if_exists=True)

    measured: dict[Schedule, Outcome] = {}  # points of the space that give the same schedule are measured once

    def evaluate(trial, params, schedule, reason):
        """The trial's objective value(s); TrialFailed (after recording why) where it has none."""
        if schedule is None:
            return fail(trial, reason)
        outcome = measured.get(schedule) or evaluator(schedule, params)
        measured[schedule] = outcome
        trial.set_user_attr("time_us", outcome.time_us)
        trial.set_user_attr("factor", outcome.factor)
        trial.set_user_attr("orthogonality", outcome.orthogonality)
        # An inaccurate trial keeps its time, marked infeasible (the sampler learns where the gates fail; a failed
        # trial would teach it nothing), and is never chosen.
        trial.set_user_attr(CONSTRAINT, [excess(outcome.factor, TUNE_FACTOR_GATE),
                                         excess(outcome.orthogonality, TUNE_ORTHOGONALITY_GATE)])
        if not outcome.accurate:
            trial.set_user_attr("failure", f"inaccurate: factor {outcome.factor:.3g} (limit {TUNE_FACTOR_GATE:g}), "
                                           f"orthogonality {outcome.orthogonality:.3g} (limit "
                                           f"{TUNE_ORTHOGONALITY_GATE:g})")
        return [outcome.time_us, outcome.factor] if multi_objective else outcome.time_us

    def ask():
        trial = study.ask()
        params = sample(trial, problem, families)
        try:
            return trial, params, schedule_from_params(problem, params, target), None
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
            failed = count_failed(study, passed)
            best = min((t.values[0] for t in passed), default=float("nan"))
            log(f"[{done}/{trials}] trial {trial.number}: {state[:90]}; best {best:,.1f} µs; "
                f"{failed} failed; {time.perf_counter() - start:.0f} s")
    except KeyboardInterrupt:
        for trial, *_ in queue:  # the trial being measured and the one asked ahead
            trial.set_user_attr("failure", "interrupted")
            study.tell(trial, state=failed_state)
        log(f"interrupted: the study keeps its {len(study.trials)} trials in {storage} (run again to resume); "
            f"the final round follows (Ctrl-C again: nothing is written)")
        interrupted = True
    else:
        interrupted = False
    result = result_of(study, problem, storage, multi_objective)
    result = final_round(result, study, problem, evaluator, _existing(problem, target, schedule_root), log)
    return replace(result, interrupted=interrupted)


def _existing(problem: Problem, target: Target, root: Path | None) -> tuple[Schedule, dict] | None:
    """The schedule file that serves this problem now (schedule.files.lookup) and its search parameters, where one
    loads: the tuner's point where it still describes the file, else only the file's precisions (the cost model
    judges accuracy on a proxy built from them)."""
    path = lookup(problem, target, root)
    if path is None:
        return None
    try:
        schedule, prov = load(path)
    except (ValueError, OSError, KeyError):
        return None
    if (schedule.m, schedule.n) != (problem.m, problem.n):
        return None
    p = schedule.precision
    return schedule, tuner_params(prov) or {"gram": p.gram, "project": p.project, "update": p.update}


def final_round(result: TuneResult, study, problem: Problem, evaluator, existing: tuple[Schedule, dict] | None,
                log=print) -> TuneResult:
    """Measure the study's RUNOFF_SIZE fastest schedules, the default and `existing` again, in turn, RUNOFF_ROUNDS
    times each, and choose on the medians: the fastest, unless it is not MIN_GAIN faster than the existing file
    (kept: result.kept) or, without one, than the default. A candidate that fails or misses the gates there
    drops out."""

    # Multi-objective: the candidates come from the Pareto front (fastest first); the choice is still on time.
    complete = feasible(study)
    complete = sorted(pareto_front(complete) if len(study.directions) > 1 else complete, key=lambda t: t.values[0])
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
    return replace(result, schedule=best, params=candidates[best][1], outcome=out, default=default,
                   final_round=summary, kept=kept)


def provenance(result: TuneResult, evaluator_name: str) -> dict:
    from ..compile.nvrtc import version as nvrtc_version

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
    # format 2 (schedule/files.py): the tuner's point and its study under "tuner", stale once the file is amended
    info["tuner"] = {**{k: info.pop(k) for k in TUNER_FIELDS if k in info}, "stale": False}
    return info


def tune_and_save(problem: Problem, target: Target, trials: int, storage: str | None = None,
                  multi_objective: bool = False, schedule_root: Path | None = None, seed: int = 0,
                  evaluator=None, log=print, families: tuple[str, ...] = FAMILIES,
                  time_limit: float | None = None) -> tuple[TuneResult, Path]:
    evaluator = evaluator or default_evaluator(problem, target)
    log(f"searching {trials} trial(s) for {problem.m}x{problem.n}, batch {problem.batch}, {target.arch} "
        f"with {getattr(evaluator, 'name', 'GPU')}")
    result = tune(problem, target, trials, evaluator, storage, multi_objective, seed, schedule_root, log, families,
                  time_limit)
    if result.kept:
        path = lookup(problem, target, schedule_root)
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
