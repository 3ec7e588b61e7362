"""What the tools share: the one case syntax, the one KEY=VALUE parser, a schedule's field edits, the target, inputs
and the accuracy gates.

A case is BATCHxMxN (qrgen.problem.parse_case), such as 60x1024x1024; a tool that takes options per case reads them
after a ':' (60x1024x32:lanes,slots=16). Options and overrides are KEY=VALUE pairs separated by commas (overrides).

Every tool starts by putting the repository root first on sys.path, then imports this module as `from tools import
cases`: a tool runs as `python3 tools/<tool>.py` from anywhere and measures the qrgen of the tree it is in."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import cupy
import numpy as np

from qrgen.numerics.check import EPS32, CheckResult, check
from qrgen.numerics.stress import mixed
from qrgen.problem import parse_case
from qrgen.run.launch import device_target
from qrgen.schedule.files import load
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.schedule.panels import CLUSTER_LANE_SLOTS, cols_panel, one_warp_tail, with_cluster, with_loop
from qrgen.targets import Target

# The tools time optimized kernels: a first call compiles them before it runs (qrgen.compile.background)
os.environ.setdefault("QRGEN_FIRST_CALL", "wait")


@dataclass(frozen=True)
class Case:
    batch: int
    m: int
    n: int
    options: str = ""  # what follows the ':', "" where nothing does

    def __str__(self) -> str:
        return f"{self.batch}x{self.m}x{self.n}" + (f":{self.options}" if self.options else "")


def case_with_options(text: str) -> Case:
    """BATCHxMxN[:OPTIONS] (an argparse type: a bad case is a usage error that says what is accepted)."""
    shape, _, options = text.partition(":")
    try:
        batch, m, n = parse_case(shape)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return Case(batch, m, n, options)


def case(text: str) -> Case:
    """BATCHxMxN, no options (an argparse type)."""
    parsed = case_with_options(text)
    if parsed.options:
        raise argparse.ArgumentTypeError(f"this tool takes no options after ':'; got {text!r}")
    return parsed


def value(text: str):
    """A JSON value where the text is one (1, 0.5, true, null), else the text itself (auto, cols)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def flag(text: str) -> bool:
    """0 or 1 (false or true)."""
    if text not in ("0", "1", "false", "true"):
        raise ValueError(f"expected 0 or 1, got {text!r}")
    return text in ("1", "true")


def overrides(text: str, fields: dict | None = None) -> dict:
    """'KEY=VALUE,KEY=VALUE' as a dict, each value converted by fields[KEY] (a key not in fields is an error naming
    those that are); without fields, any key, each value by value(). ValueError says what is wrong."""
    out = {}
    for item in filter(None, text.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or not raw:
            raise ValueError(f"expected KEY=VALUE, got {item!r} (in {text!r})")
        if fields is None:
            out[key] = value(raw)
            continue
        if key not in fields:
            raise ValueError(f"unknown key {key!r} (in {text!r}); the keys are {', '.join(fields)}")
        try:
            out[key] = fields[key](raw)
        except ValueError as exc:
            raise ValueError(f"{key}={raw}: {exc}") from None
    return out


# A schedule's field edits (edited): KEY=VALUE overrides of schedule_ab.py's --variant and lanes_timeline.py's.
EDITS = {"aggregate": int, "lookahead": int, "panel_update": str, "reach": flag, "aggregate_update": str,
         "gram": str, "project": str, "update": str, "file": str, "width": int, "one_warp_tail": flag,
         "cluster": int, "slots": int, "every": flag, "whole": int, "threads": int, "loop": flag,
         "cols_blocks": int}
EDITS_HELP = """\
A variant is FIELD=VALUE pairs separated by commas, applied to the case's schedule in this order:
  file=PATH               a schedule file's schedule (for the same MxN) in place of the case's
  aggregate=A lookahead=L panel_update=cublas|rowsplit|fused reach=0|1 aggregate_update=gemm|fused
                          the Schedule fields
  gram= project= update=  a stage's precision (fp32, tf32, bf16, fp16; project and update also tf32x3)
  width=W                 every panel wider than W split into panels of W columns (the same kernel variant)
  loop=0|1                every warp, rows, tsqr and whole panel's column loop (qrgen.schedule.panels.with_loop)
  one_warp_tail=1         panels of at most 32 rows on one warp (qrgen.schedule.panels.one_warp_tail)
  cluster=B[,slots=S][,every=1]   the cluster panels (every=1: also the one-block lanes and rows panels) on
                          clusters of B blocks, lanes panels of about S rows a warp where they fit (with_cluster)
  cols_blocks=B           every cols panel on B blocks a matrix (a cluster where B > 1), its slice kept
  whole=S[,threads=T][,loop=1]    the whole factorization in one kernel a matrix, inner panels of S columns on T
                          threads (256 unless given); fp32, nothing else"""


def split_panels(panels, width: int) -> tuple:
    """Each panel wider than `width` as panels of `width` columns (the last one narrower), the same variant."""
    return tuple(dataclasses.replace(p, width=min(width, p.width - c))
                 for p in panels for c in range(0, p.width, width))


def edited(schedule: Schedule, edits: dict, target: Target = Target()) -> Schedule:
    """The schedule with the edits of EDITS applied (EDITS_HELP); ValueError where the result is not a schedule."""
    edits = dict(edits)
    m, n = schedule.m, schedule.n
    if "file" in edits:
        schedule = load(Path(edits.pop("file")))[0]
        if (schedule.m, schedule.n) != (m, n):
            raise ValueError(f"that file's schedule is for {schedule.m}x{schedule.n}, not {m}x{n}")
    tail, blocks = edits.pop("one_warp_tail", False), edits.pop("cluster", 0)
    slots, every = edits.pop("slots", CLUSTER_LANE_SLOTS), edits.pop("every", False)
    stages = {k: edits.pop(k) for k in ("gram", "project", "update") if k in edits}
    width, cols_blocks = edits.pop("width", 0), edits.pop("cols_blocks", 0)
    whole, threads, loop = edits.pop("whole", 0), edits.pop("threads", 256), edits.pop("loop", None)
    if whole:
        return Schedule(m, n, (Panel(min(m, n), "whole", threads, slice=whole, loop=bool(loop)),), Precision())
    schedule = dataclasses.replace(schedule, **edits)  # the Schedule fields that are left
    if width:
        schedule = dataclasses.replace(schedule, panels=split_panels(schedule.panels, width))
    if loop is not None:
        schedule = dataclasses.replace(schedule, panels=tuple(with_loop(p, loop) for p in schedule.panels))
    if cols_blocks:
        schedule = dataclasses.replace(schedule, panels=tuple(
            cols_panel(p.width, p.slice, cols_blocks) if p.variant == "cols" else p for p in schedule.panels))
    schedule = dataclasses.replace(schedule, precision=dataclasses.replace(schedule.precision, **stages))
    schedule = one_warp_tail(schedule) if tail else schedule
    return with_cluster(schedule, blocks, slots=slots, every=every, target=target) if blocks else schedule


def target(arch: str | None = None) -> Target:
    """Target.parse(arch) where given, else the current CUDA device's."""
    return Target.parse(arch) if arch else device_target(cupy.cuda.Device().id)


def random_inputs(batch: int, m: int, n: int, count: int = 2, seed: int = 0) -> list:
    """`count` batches of standard normal float32 matrices on the current device (timings cycle through them)."""
    rng = np.random.default_rng(seed)
    return [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(count)]


def hostile(m: int, n: int, count: int, seed: int = 1):
    """A batch of `count` matrices mixing every stress family (all of them from len(FAMILIES) on), on the device."""
    return cupy.asarray(mixed(m, n, count, seed=seed)[0])


def gates(fac, count: int, seed: int = 1) -> CheckResult:
    """The accuracy gates of a Factorizer's geqrf on a hostile batch of `count` matrices."""
    a = hostile(fac.m, fac.n, count, seed)
    h, tau = fac(a)
    return check(a, h, tau)


def q_gates(a, q, r) -> tuple[np.ndarray, np.ndarray]:
    """Q's gates per matrix in float64, each in units of n eps32: (||A - QR||_1 / ||A||_1, ||Q^T Q - I||_1); the
    gates are factor <= 20 and orthogonality <= 100, as for geqrf."""
    n = a.shape[-1]
    a64, q64, r64 = (np.asarray(x, dtype=np.float64) for x in (a, q, r))
    orth = np.abs(np.swapaxes(q64, -1, -2) @ q64 - np.eye(q.shape[-1])).sum(axis=-2).max(axis=-1) / (n * EPS32)
    norm_a = np.maximum(np.abs(a64).sum(axis=-2).max(axis=-1), np.finfo(np.float64).tiny)
    factor = np.abs(a64 - q64 @ r64).sum(axis=-2).max(axis=-1) / (norm_a * n * EPS32)
    return factor, orth
