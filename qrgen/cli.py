"""The qrgen command: build a module for a shape, or time qrgen against torch.geqrf."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .numerics.stress import FAMILIES
from .problem import Problem, parse_case, parse_shape
from .targets import Target


QR_HEADER = ("| batch x shape | qrgen.qr µs | torch.linalg.qr µs | cupy.linalg.qr µs | speed-up over torch |\n"
             "|---|---:|---:|---:|---:|")


def _default_target() -> Target:
    """This machine's GPU (run.launch.current_target), else the H200's sm_90."""
    from .run.launch import current_target

    return current_target() or Target("cuda", "sm_90")


def _folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory (a schedule folder holds one folder per "
                                         f"architecture, such as sm_90/)")
    return path


def _integer(least: int, what: str):
    """An argparse type: an integer of at least `least`, else an error saying `what` is expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


_count = _integer(0, "a number of trials (0 or more)")
_positive = _integer(1, "a positive integer")


def _shape(text: str) -> tuple[int, int]:
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _case(text: str) -> tuple[int, int, int]:
    try:
        return parse_case(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qrgen", description="Batched QR factorization with kernels generated per shape.")
    p.add_argument("--version", action="version", version=f"qrgen {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="write generated/qr_<m>x<n>_b<batch>.py and its kernels, and compile them",
                       description="Pick the schedule (a tuned file under schedules/<arch>/, else the default "
                                   "heuristic), render its kernels, compile them with NVRTC (cached on disk) and "
                                   "write an importable module with geqrf(a) for that shape.")
    b.add_argument("--shape", type=_shape, required=True, metavar="MxN", help="matrix shape, such as 1024x1024")
    b.add_argument("--batch", type=_positive, default=1,
                   help="number of matrices the schedule is chosen for (the module takes any batch); default 1")
    b.add_argument("--arch", default=None,
                   help="target architecture such as sm_90 or sm_80 (one the installed NVRTC compiles for), or an "
                        "Apple GPU family apple7 .. apple10 (Metal sources, checked here and compiled on the Mac at "
                        "run time); default: this machine's GPU, else sm_90")
    b.add_argument("--out", type=Path, default=None, help="directory for the module (default: ./generated)")
    b.add_argument("--schedules", type=_folder, default=None,
                   help="an existing directory of schedule files, one folder per arch, searched alone (default: the "
                        "user's schedule folder, $QRGEN_SCHEDULE_DIR, then the shipped schedules)")
    b.add_argument("--no-compile", action="store_true", help="write the module and sources, compile nothing")
    b.add_argument("--jobs", type=_positive, default=None, help="kernels compiled at once (default: CPU count)")
    b.add_argument("--trials", type=_count, default=0,
                   help="search the schedule first with this many trials (`qrgen tune`): measured on the GPU where "
                        "there is one, else over the cost model; default 0 (use the tuned file or the default)")
    b.add_argument("--storage", default=None, help="optuna storage URL for --trials (default: SQLite in the cache)")

    t = sub.add_parser("tune", help="search a shape's schedule with optuna and save it in the user's schedule folder",
                       description="Search panel widths, panel kernels and stage precisions for one shape and "
                                   "batch: the objective is the median time on the GPU (or the cost model's "
                                   "estimate without one), the constraint is that every stress family passes the "
                                   "gates with margin (factor <= 10, orthogonality <= 50). Trials are kept in an "
                                   "optuna study (resumed when run again; Ctrl-C leaves it saved). A final round "
                                   "times the study's three fastest schedules, the default and the file already "
                                   "there again, three times each, in turn; the fastest on those medians is "
                                   "written as <arch>/<m>x<n>_b<batch>.json in the user's schedule folder "
                                   "($QRGEN_SCHEDULE_DIR, else ~/.local/share/qrgen/schedules; --schedules "
                                   "names another, such as a checkout's schedules/) unless it is not 2% faster "
                                   "than the file that serves the shape now (then nothing is written). Ctrl-C "
                                   "stops the search, runs the final round and exits with status 130.")
    t.add_argument("--shape", type=_shape, required=True, metavar="MxN", help="matrix shape, such as 1024x1024")
    t.add_argument("--batch", type=_positive, default=1, help="number of matrices (default 1)")
    t.add_argument("--trials", type=_positive, default=50, help="trials to run now (default 50)")
    t.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="start no trial after this many seconds (the first always runs); the final round follows")
    t.add_argument("--arch", default=None, help="target architecture (default: this machine's GPU, else sm_90)")
    t.add_argument("--storage", default=None,
                   help="optuna storage URL (default: SQLite in the cache directory, $QRGEN_CACHE_DIR)")
    t.add_argument("--schedules", type=_folder, default=None,
                   help="an existing schedule directory to search and write (default: the user's schedule folder, "
                        "searched before the shipped one)")
    t.add_argument("--multi-objective", action="store_true",
                   help="minimize time and the worst scaled residual together and print the Pareto front")
    t.add_argument("--cost-model", action="store_true", help="search over the cost model even where a GPU is present")
    t.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    t.add_argument("--with-cols", action="store_true", help=argparse.SUPPRESS)  # cols is searched by default now

    w = sub.add_parser("warmup", help="compile ahead the kernels of a list of problems into the kernel cache",
                       description="Compile, in parallel over all of them, every kernel that qrgen.geqrf and "
                                   "qrgen.qr will need for each BATCHxMxN, into the kernel cache "
                                   "($QRGEN_CACHE_DIR), so that a service's first calls compile nothing; on a GPU "
                                   "the kernels are also loaded once (a check that the driver takes them).")
    w.add_argument("cases", nargs="+", type=_case, metavar="BATCHxMxN", help="problems such as 60x1024x1024")
    w.add_argument("--arch", default=None,
                   help="target architecture (default: this machine's GPU, which then also loads them; else sm_90)")
    w.add_argument("--no-qr", action="store_true", help="geqrf's kernels only, not qr's")
    w.add_argument("--jobs", type=_positive, default=None, help="kernels compiled at once (default: CPU count)")

    s = sub.add_parser("bench", help="time qrgen against torch.geqrf (needs a CUDA GPU)",
                       description="For each case: qrgen's and torch.geqrf's median time (CUDA events, L2 "
                                   "flushed, fresh inputs) in the same run, their ratio, and the accuracy gates "
                                   "on a batch of every stress family. Prints a Markdown table.")
    s.add_argument("cases", nargs="*", type=_case, metavar="BATCHxMxN",
                   help="cases such as 60x1024x1024, then the sets asked for below; with neither, the seven "
                        "reference batches")
    s.add_argument("--tall", action="store_true", help="the single and tall cases (in place of the reference batches)")
    s.add_argument("--small", action="store_true", help="many small matrices (1000x64x64 and the like)")
    s.add_argument("--untuned", action="store_true",
                   help="shapes with no shipped schedule file of their own (the default heuristic)")
    s.add_argument("--qr", action="store_true",
                   help="time qrgen.qr(mode='reduced') against torch.linalg.qr and cupy.linalg.qr instead "
                        "(default cases: the reference batches and 20000x32x32)")
    s.add_argument("--reps", type=_positive, default=20, help="timed runs of qrgen per case (default 20)")
    s.add_argument("--no-torch", action="store_true", help="do not time torch.geqrf")
    s.add_argument("--mixed", action="store_true",
                   help="also time a batch of every stress family at random positions (should cost what a dense one does)")
    s.add_argument("--family", action="append", default=[], choices=FAMILIES, metavar="FAMILY",
                   help="also time a batch of this stress family alone (repeatable; one of "
                        f"{', '.join(FAMILIES)}), e.g. rankdef")
    s.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                   help="run the reference batches (with the mixed, rankdef and normspread batches), the single and "
                        "tall cases, the many small matrices (with a mixed batch), the untuned shapes and qr against "
                        "torch, and write the tables with the device and versions to FILE (BENCHMARKS.md)")
    s.add_argument("--profile", action="store_true",
                   help="also print each case's GPU time by stage (panel kernels, trailing-update GEMMs and of "
                        "them the panels' own products, the "
                        "power-of-two scaling where the schedule has it, the aggregates' merge and each of its "
                        "stages), by difference between CUDA-graph replays that leave stages out")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command in ("tune", "build"):
        from .build import build
        from .tune.evaluate import ModelEvaluator
        from .tune.search import tune_and_save

        m, n = args.shape
        try:
            problem = Problem(m, n, args.batch)
            target = Target.parse(args.arch) if args.arch else _default_target()
            cost_model = getattr(args, "cost_model", False)
            if target.backend == "metal" and (args.command == "tune" or args.trials > 0):
                raise ValueError(f"no schedule can be tuned for {target.arch} here (no Apple GPU to time it on): "
                                 f"Metal modules take the default schedule (qrgen/schedule/apple.py)")
            if (args.command == "build" and not args.no_compile) or (args.command == "tune" and not cost_model):
                from .build import compiler

                compiler(target).check_arch(target)  # before anything is searched, compiled or written
            interrupted = False
            if args.command == "tune" or args.trials > 0:
                result, _ = tune_and_save(problem, target, args.trials, args.storage,
                                          getattr(args, "multi_objective", False), args.schedules,
                                          getattr(args, "seed", 0),
                                          evaluator=ModelEvaluator(problem) if cost_model else None,
                                          time_limit=getattr(args, "time_limit", None))
                interrupted = result.interrupted
            if args.command == "build" and not interrupted:
                build(problem, target, args.out, args.schedules, compile_kernels=not args.no_compile,
                      jobs=args.jobs)
        except KeyboardInterrupt:
            print(f"qrgen {args.command}: interrupted in the final round: nothing written", file=sys.stderr)
            return 130
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"qrgen {args.command}: error: {exc}", file=sys.stderr)
            return 2
        return 130 if interrupted else 0
    if args.command == "warmup":
        return _warmup(args)
    if args.command == "bench":
        from .bench import case_sets, profile_case, run_case, run_qr_case, table

        cases = case_sets(args.qr, args.tall, args.small, args.untuned, tuple(args.cases))
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() == 0:
                raise RuntimeError("no CUDA device")
        except Exception as exc:
            print(f"qrgen bench: error: needs a CUDA GPU ({exc})", file=sys.stderr)
            return 2
        if args.markdown is not None:
            return _markdown(args)
        if args.qr:
            print(QR_HEADER)
            for batch, m, n in cases:
                print(run_qr_case(batch, m, n, reps=args.reps), flush=True)
            return 0
        rows = []
        for batch, m, n in cases:
            row = run_case(batch, m, n, reps=args.reps, with_torch=not args.no_torch,
                           hostile=(("mixed",) if args.mixed else ()) + tuple(args.family))
            torch_us = "—" if row.torch_us is None else f"{row.torch_us:,.0f} µs"
            print(f"{batch} x {m}x{n}: qrgen {row.qrgen_us:,.1f} µs, torch.geqrf {torch_us}, "
                  f"gates {'pass' if row.passed else 'FAIL'}", flush=True)
            rows.append(row)
            if args.profile:
                print(profile_case(batch, m, n, reps=args.reps), flush=True)
        print(table(rows))
        return 0
    return 2  # pragma: no cover


def _warmup(args) -> int:
    from .run.launch import current_target
    from .warmup import warmup

    on_gpu = not args.arch and current_target() is not None  # then also loaded there
    try:
        report = warmup(args.cases, target=None if on_gpu else Target.parse(args.arch or "sm_90"),
                        qr=not args.no_qr, jobs=args.jobs,
                        log=lambda b: print(f"  {b.name}: {'cached' if b.cached else f'{b.seconds:.1f} s'}", flush=True))
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"qrgen warmup: error: {exc}", file=sys.stderr)
        return 2
    print(f"{report['kernels']} kernel(s), {report['compiled']} compiled, {report['seconds']:.1f} s"
          f"{' (loaded on the GPU)' if on_gpu else ''}")
    return 0


def _markdown(args) -> int:
    """The reference batches, the single and tall cases, many small matrices, shapes with no tuned file and qr,
    written to args.markdown after each table."""
    from .bench import (MARKDOWN_FAMILIES, QR_CASES, REFERENCE_CASES, SINGLE_TALL_CASES, SMALL_CASES, UNTUNED_CASES,
                        environment_facts, markdown_document, run_case, run_qr_case, table)

    facts, sections = environment_facts(), []
    command = f"qrgen bench --markdown {args.markdown.name} --reps {args.reps}"

    def write():
        args.markdown.write_text(markdown_document(sections, command, facts))

    for title, cases, hostile in (("Reference batches", REFERENCE_CASES, MARKDOWN_FAMILIES),
                                  ("Single and tall matrices", SINGLE_TALL_CASES, ()),
                                  ("Many small matrices", SMALL_CASES, ("mixed",)),
                                  ("Shapes with no tuned file of their own", UNTUNED_CASES, ())):
        rows = []
        for batch, m, n in cases:
            rows.append(run_case(batch, m, n, reps=args.reps, with_torch=not args.no_torch, hostile=hostile))
            print(f"{batch} x {m}x{n}: {rows[-1].qrgen_us:,.1f} µs", flush=True)
        sections.append((title, table(rows)))
        write()
    qr_rows = []
    for batch, m, n in QR_CASES:
        qr_rows.append(run_qr_case(batch, m, n, reps=args.reps))
        print(qr_rows[-1], flush=True)
    sections.append(("qr against torch.linalg.qr", QR_HEADER + "\n" + "\n".join(qr_rows)))
    write()
    print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
