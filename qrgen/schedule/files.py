"""Schedule files: schedules/<arch>/<m>x<n>_b<batch>.json, the decisions (Schedule.to_json) beside the batch, the
target and a provenance record, in a versioned format.

Format 2 (FORMAT): {"format": 2, "m", "n", "batch", "backend", "arch", the schedule's fields, "provenance":
{"origin": how the file was found ("qrgen tune (<device>)", "default", "by hand"), "date", "qrgen", "device", ...,
"tuner": the tuner's point and its study (params, study, trials, times) where a search found it, with "stale": true
once the file is amended, "amendments": [{"date", "change", "replaced"}] in order}}. Format 1 files (no "format")
are read and converted: their prose "amended" becomes one amendment and marks the tuner point stale.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from ..paths import schedule_roots, user_schedule_dir
from ..problem import Problem
from ..targets import Target
from .model import Precision, Schedule

FORMAT = 2
TUNER_FIELDS = ("params", "study", "trials_complete", "trials_failed", "time_us", "factor", "orthogonality",
                "default_time_us", "final_round_us", "choice")
PRECISION_CHOICES = (None, "fp32")


# A file tuned for batch B serves the batches b with B / BATCH_REACH <= b <= B * BATCH_REACH where no file for b
# itself exists (the nearest such B by ratio; the larger on a tie): a schedule is correct for any batch, and its
# choices (panel kinds, clusters, aggregates) follow the batch's parallelism, which changes little within a
# quarter (docs/decisions.md#batch-reach).
BATCH_REACH = 1.25


def schedule_path(problem: Problem, target: Target, root: Path | None = None) -> Path:
    """Where a schedule for exactly this problem is written: under `root`, else the user's schedule folder."""
    return Path(root or user_schedule_dir()) / target.arch / f"{problem.m}x{problem.n}_b{problem.batch}.json"


def lookup(problem: Problem, target: Target, root: Path | None = None) -> Path | None:
    """The schedule file that serves this problem: in each folder of schedule_roots(root), in order, the file for
    exactly this batch, else the one for the nearest batch within BATCH_REACH; None where no folder has one."""
    for folder in schedule_roots(root):
        exact = schedule_path(problem, target, folder)
        if exact.is_file():
            return exact
        arch = folder / target.arch
        near, prefix = [], f"{problem.m}x{problem.n}_b"
        for path in arch.glob(f"{prefix}*.json") if arch.is_dir() else ():
            digits = path.stem[len(prefix):]
            batch = int(digits) if digits.isdigit() else 0
            if batch and batch / BATCH_REACH <= problem.batch <= batch * BATCH_REACH:
                near.append((abs(math.log(batch / problem.batch)), -batch, path))
        if near:
            return min(near)[2]
    return None


def to_document(schedule: Schedule, problem: Problem, target: Target, provenance: dict | None = None) -> dict:
    data = {"format": FORMAT, **schedule.to_json(), "batch": problem.batch, "backend": target.backend,
            "arch": target.arch}
    data["provenance"] = provenance or {}
    return data


def write(path: Path, data: dict) -> Path:
    """Write a document atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def save(schedule: Schedule, problem: Problem, target: Target, provenance: dict | None = None,
         root: Path | None = None) -> Path:
    return write(schedule_path(problem, target, root), to_document(schedule, problem, target, provenance))


def upgrade(data: dict) -> dict:
    """A document in the current format (format 1: the tuner's fields beside the others in provenance, the prose
    "amended" and "replaced"; panel_update "split" for "rowsplit", the tuner's "split" for "head_share")."""
    data = dict(data)
    version = data.get("format", 1)
    if version not in (1, FORMAT):
        raise ValueError(f"schedule file format {version!r} is not one this qrgen reads (1 or {FORMAT})")
    if version == 1:
        if data.get("panel_update") == "split":
            data["panel_update"] = "rowsplit"
        old = dict(data.get("provenance", {}))
        prov = {k: v for k, v in old.items() if k not in TUNER_FIELDS + ("amended", "replaced")}
        tuner = {k: old[k] for k in TUNER_FIELDS if k in old}
        if old.get("amended"):
            entry = {"change": old["amended"]}
            if old.get("replaced"):
                entry["replaced"] = old["replaced"]
            prov["amendments"] = [entry]
        if tuner.get("params"):  # the tuner's names of format 1
            params = {("head_share" if k == "split" else k): v for k, v in tuner["params"].items()}
            if params.get("panel_update") == "split":
                params["panel_update"] = "rowsplit"
            tuner["params"] = params
        if tuner:
            tuner["stale"] = bool(prov.get("amendments"))
            prov["tuner"] = tuner
        data = {"format": FORMAT, **{k: v for k, v in data.items() if k != "provenance"}, "provenance": prov}
        data.setdefault("backend", "cuda")
    return data


def read(path: Path) -> dict:
    """A schedule file's document, upgraded to the current format."""
    try:
        return upgrade(json.loads(Path(path).read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None


def load(path: Path) -> tuple[Schedule, dict]:
    """(schedule, provenance) of a schedule file."""
    data = read(path)
    return Schedule.from_json(data), data.get("provenance", {})


def tuner_params(provenance: dict) -> dict | None:
    """The tuner's point of a file where it still describes the file's schedule (not stale), else None."""
    tuner = provenance.get("tuner") or {}
    return None if tuner.get("stale") else tuner.get("params")


def amend(path: Path, schedule: Schedule, change: str) -> Path:
    """Replace a file's schedule, recording the change as an amendment (the tuner point is then stale)."""
    data = read(path)
    old = Schedule.from_json(data)
    prov = dict(data.get("provenance", {}))
    prov["amendments"] = list(prov.get("amendments", [])) + [
        {"date": datetime.date.today().isoformat(), "change": change, "replaced": old.describe()}]
    if "tuner" in prov:
        prov["tuner"] = {**prov["tuner"], "stale": True}
    problem = Problem(schedule.m, schedule.n, data["batch"])
    return write(Path(path), to_document(schedule, problem, Target(data.get("backend", "cuda"), data["arch"]), prov))


def check_precision(precision) -> None:
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be None (the schedule's own: tuned and default schedules may give the "
                         f"trailing update's products tf32 inputs where that passes the accuracy gates) or 'fp32' "
                         f"(every product from fp32 inputs); got {precision!r}")


def find(problem: Problem, target: Target = Target(), root: Path | None = None,
         precision: str | None = None) -> tuple[Schedule, str]:
    """The tuned schedule that serves this problem (lookup: the user's folder, then the shipped one, or `root`
    alone), else the default; checked against the target. Returns (schedule, origin). precision="fp32": the same
    schedule with every stage in fp32 (a lookahead then in pieces, as the heuristic takes it for fp32 products)."""
    from ..plan.planner import check
    from .heuristic import LOOKAHEAD_PIECES, default_schedule

    check_precision(precision)
    path = lookup(problem, target, root)
    if path is not None:
        schedule, _ = load(path)
        if (schedule.m, schedule.n) != (problem.m, problem.n):
            raise ValueError(f"{path} is for {schedule.m}x{schedule.n}, not {problem.m}x{problem.n}")
        origin = str(path)
    else:
        schedule, origin = default_schedule(problem, target), "default (heuristic)"
    if precision == "fp32" and schedule.precision != Precision():
        lookahead = LOOKAHEAD_PIECES if schedule.lookahead else 0
        schedule = replace(schedule, precision=Precision(), lookahead=lookahead)
        origin = f"{origin}, every stage in fp32"
    check(schedule, target)
    return schedule, origin
