"""The SASS of one generated kernel, without a GPU: NVRTC to PTX, ptxas to a cubin, nvdisasm; an instruction
histogram, and with --per SASS_OP the instructions between consecutive occurrences of that op (SYNCS.PHASECHK or
UCGABAR_WAIT: one per column of a cluster panel) and the makeup of one such stretch.

    python3 tools/sass_report.py 8x2048x2048                       # the kernels of the case's schedule
    python3 tools/sass_report.py 8x2048x2048 KERNEL [--per OP] [--bin DIR] [--sass FILE] [--arch sm_90]

The case's schedule is its committed file, else the default heuristic (qrgen.schedule.files.find); without KERNEL
the tool lists that schedule's kernels. DIR holds ptxas and nvdisasm (default: $QRGEN_CUDA_BIN, else PATH); without
a CUDA toolkit, the triton wheel carries both (`pip download --no-deps triton`, unzip, triton/backends/nvidia/bin).
The cubin NVRTC writes itself is refused by nvdisasm 13.x ("invalid ELF file"); going through PTX avoids that.
Where that ptxas is older than NVRTC, the PTX's .version is lowered to what ptxas accepts.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile

from cupy_backends.cuda.libs import nvrtc

from qrgen.problem import Problem
from qrgen.render.sources import render_all
from qrgen.schedule.files import find
from qrgen.targets import Target
from tools import cases

OP = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", re.M)


def tool(name: str, folder: str | None) -> str:
    path = Path(folder) / name if folder else shutil.which(name)
    if not path or not Path(path).exists():
        raise SystemExit(f"{name} not found (give --bin DIR or set QRGEN_CUDA_BIN)")
    return str(path)


def ptx_of(source: str, name: str, target: Target) -> str:
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture=compute_{target.arch[3:]}", "-std=c++17"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def sass_of(ptx: str, target: Target, ptxas: str, nvdisasm: str) -> tuple[str, str]:
    """(ptxas's report line, the SASS listing) of PTX."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        for version in (None, "8.8", "8.7", "8.5"):  # the PTX as written, then older ISA versions
            text = ptx if version is None else re.sub(r"^\.version \S+", f".version {version}", ptx, flags=re.M)
            ptx_path.write_text(text)
            run = subprocess.run([ptxas, f"-arch={target.arch}", "-O3", "-v", str(ptx_path), "-o", str(cubin)],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                break
        else:
            raise SystemExit(run.stderr)
        report = run.stderr.strip().splitlines()[-2] if run.stderr.strip() else ""
        return report, subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True,
                                      check=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("case", type=cases.case, metavar="BATCHxMxN", help="such as 8x2048x2048")
    ap.add_argument("kernel", nargs="?", help="a kernel of the case's schedule (none: list them)")
    ap.add_argument("--per", metavar="OP", help="SASS op that marks a stretch (e.g. SYNCS.PHASECHK)")
    ap.add_argument("--bin", metavar="DIR", default=os.environ.get("QRGEN_CUDA_BIN"),
                    help="folder of ptxas and nvdisasm")
    ap.add_argument("--sass", type=Path, metavar="FILE", help="also write the whole SASS listing to this file")
    ap.add_argument("--arch", default="sm_90", help="CUDA architecture (default sm_90)")
    args = ap.parse_args()
    target = Target.parse(args.arch)
    case = args.case
    schedule, origin = find(Problem(case.m, case.n, case.batch), target)
    sources = {r.name: r.source for r in render_all(schedule, target)}
    if args.kernel not in sources:
        print(f"{case} ({origin}): {schedule.describe()}\nkernels: {', '.join(sorted(sources))}")
        raise SystemExit(0 if args.kernel is None else f"{args.kernel} is not a kernel of this schedule")
    report, sass = sass_of(ptx_of(sources[args.kernel], args.kernel, target), target, tool("ptxas", args.bin),
                           tool("nvdisasm", args.bin))
    print(report)
    if args.sass:
        args.sass.write_text(sass)
    ops = OP.findall(sass)
    print(f"{args.kernel}: {len(ops)} instructions")
    print(collections.Counter(op.split(".")[0] for op in ops).most_common(30))
    if args.per:
        marks = [i for i, op in enumerate(ops) if op.startswith(args.per)]
        stretches = [b - a for a, b in zip(marks, marks[1:])]
        print(f"{len(marks)} x {args.per}; instructions between them: {stretches}")
        if len(marks) > 2:
            middle = len(marks) // 2
            print(collections.Counter(op.split(".")[0] for op in ops[marks[middle - 1]:marks[middle]]).most_common(25))


if __name__ == "__main__":
    main()
