"""A/B of schedules on the GPU: each case's schedule (its committed file, else the default heuristic) against the
same schedule with fields replaced (--variant) and against points of the tuning space (--point), on the same inputs
in one run: the gates on a batch of every stress family first, then graph-replay and eager medians (L2 flushed),
the schedules in turn for each round.

    python3 tools/schedule_ab.py 60x1024x1024 640x512x512 --variant panel_update=rowsplit --variant aggregate=64
    python3 tools/schedule_ab.py 640x512x512 --point aggregate=64,lookahead=0 --point family=lanes,cluster=2
    python3 tools/schedule_ab.py 8x2048x2048 --variant project=fp32,update=fp32 --profile
    python3 tools/schedule_ab.py 60x1024x1024 --variant whole=16 --compile-only --arch sm_90   # no GPU needed

A point (qrgen.tune.space.schedule_from_params) is KEY=VALUE pairs over a base point: from=tuned, the point in the
case's schedule file (its tuner provenance, while the file is not amended); from=default, the default heuristic's
point (tune.space.default_params); from=base, tune.space.DEFAULT_PARAMS (the rows family's base point). Without
from=, tuned where the file has one, else default. Values are JSON where they parse (1, 0.5, true), else text.
A variant or point that a case's schedule rejects says why and the others go on.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

from qrgen.bench import graph_time_us, median_time_us, profile_case
from qrgen.problem import Problem
from qrgen.run.factorizer import Factorizer
from qrgen.schedule.files import find, load, lookup, tuner_params
from qrgen.tune.space import DEFAULT_PARAMS, default_params, schedule_from_params
from tools import cases

BASES = ("tuned", "default", "base")


def point_schedule(problem: Problem, target, point: dict):
    """The schedule of a point of the tuning space: its KEY=VALUE pairs over the base point that from= names."""
    point = dict(point)
    base = point.pop("from", None)
    path = lookup(problem, target)  # the file that serves the case (its batch's, or a near batch's)
    tuned = tuner_params(load(path)[1]) if path is not None else None
    if base not in (None,) + BASES:
        raise ValueError(f"from= takes one of {BASES}, got {base!r}")
    if base == "tuned" and tuned is None:
        raise ValueError(f"{path} has no tuner point that still describes it (missing, or amended since)")
    if base == "tuned" or (base is None and tuned is not None):
        params = dict(tuned)
    elif base == "base":
        params = dict(DEFAULT_PARAMS)
    else:
        params = default_params(problem)
    try:
        return schedule_from_params(problem, {**params, **point})
    except KeyError as exc:  # a family's keys that the base point lacks
        raise ValueError(f"the point lacks {exc.args[0]}= (its family's keys: tune.space)") from None


def factorizers(case, target, variants, points) -> dict:
    """Label -> Factorizer: the case's schedule, then each variant and point that its schedule takes."""
    problem = Problem(case.m, case.n, case.batch)
    schedule, origin = find(problem, target)
    print(f"{case} schedule ({origin}): {schedule.describe()}", flush=True)
    facs = {"schedule": Factorizer(case.m, case.n, schedule, target)}
    for label, make in ([(f"variant {t}", lambda e=e: cases.edited(schedule, e, target)) for t, e in variants]
                        + [(f"point {t}", lambda p=p: point_schedule(problem, target, p)) for t, p in points]):
        try:
            s = make()
            facs[label] = Factorizer(case.m, case.n, s, target)
            print(f"{case} {label}: {s.describe()}", flush=True)
        except ValueError as exc:
            print(f"{case} {label}: rejected ({exc})", flush=True)
    return facs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=cases.EDITS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", type=cases.case, metavar="BATCHxMxN", help="such as 60x1024x1024")
    ap.add_argument("--variant", action="append", default=[], metavar="FIELD=VALUE[,...]",
                    help="the case's schedule with these fields replaced (repeatable; below)")
    ap.add_argument("--point", action="append", default=[], metavar="KEY=VALUE[,...]",
                    help="a point of the tuning space over from=tuned|default|base (repeatable)")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, the schedules in turn (default 2)")
    ap.add_argument("--reps", type=int, default=10, help="timed runs per median (default 10)")
    ap.add_argument("--arch", help="target architecture (default: the GPU's; sm_90 with --compile-only)")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile every schedule's kernels into the cache and stop (no GPU needed: to fill a cache "
                         "that the GPU machine then reads)")
    ap.add_argument("--profile", action="store_true",
                    help="also each schedule's GPU time by stage (qrgen.bench.profile_case), after the rounds")
    args = ap.parse_args()
    try:
        variants = [(text, cases.overrides(text, cases.EDITS)) for text in args.variant]
        points = [(text, cases.overrides(text)) for text in args.point]
    except ValueError as exc:
        ap.error(str(exc))
    target = cases.target(args.arch or ("sm_90" if args.compile_only else None))
    for case in args.cases:
        facs = factorizers(case, target, variants, points)
        if args.compile_only:
            for label, fac in facs.items():
                binaries = fac.build()
                spills = sum(b.spill_bytes for b in binaries)
                print(f"{case} {label}: {len(binaries)} kernels compiled, {spills} bytes of spill", flush=True)
            continue
        count = min(case.batch, 10 if case.m * case.n <= 1 << 20 else 4)
        for label, fac in facs.items():
            fac.build()
            print(f"{case} {label}: {cases.gates(fac, count)}", flush=True)
        inputs = cases.random_inputs(case.batch, case.m, case.n)
        for rnd in range(args.rounds):
            for label, fac in facs.items():
                graph = graph_time_us(fac, inputs, args.reps)
                eager = median_time_us(fac, inputs, args.reps, warmup=2)
                print(f"{case} round {rnd} {label:>32}: graph {graph:10.1f} eager {eager:10.1f} µs", flush=True)
        for label, fac in facs.items() if args.profile else ():
            print(f"{case} {label}:\n{profile_case(case.batch, case.m, case.n, fac=fac)}", flush=True)


if __name__ == "__main__":
    main()
