"""The SASS of one generated kernel, without a GPU: NVRTC to PTX (compute_90), ptxas to a cubin, nvdisasm; prints an
instruction histogram, and with --per SASS_OP the instructions between consecutive occurrences of that op (e.g.
SYNCS.PHASECHK or UCGABAR_WAIT: one per column of a cluster panel) and the makeup of one such stretch.

    python scripts/sass_report.py BATCH,M,N KERNEL [--per OP] [--bin DIR] [--sass FILE]

KERNEL is a name `qrgen build --no-compile` writes (generated/qr_<m>x<n>_b<batch>/<KERNEL>.cu) for the shape's
schedule (tuned or default). DIR holds ptxas and nvdisasm (default: $QRGEN_CUDA_BIN, else PATH); without a CUDA
toolkit, the triton wheel carries both (`pip download --no-deps triton`, unzip, triton/backends/nvidia/bin). The
cubin NVRTC writes itself is refused by nvdisasm 13.x ("invalid ELF file"); going through PTX avoids that. When
that ptxas is older than NVRTC, the PTX's .version is lowered to what ptxas accepts.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from qrgen.codegen import render_all
from qrgen.problem import Problem, Target
from qrgen.schedule import find

OP = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", re.M)


def tool(name: str, folder: str | None) -> str:
    path = Path(folder) / name if folder else shutil.which(name)
    if not path or not Path(path).exists():
        raise SystemExit(f"{name} not found (give --bin DIR or set QRGEN_CUDA_BIN)")
    return str(path)


def ptx_of(source: str, name: str) -> str:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["--gpu-architecture=compute_90", "-std=c++17"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="BATCH,M,N")
    ap.add_argument("kernel")
    ap.add_argument("--per", help="SASS op that marks a stretch (e.g. SYNCS.PHASECHK)")
    ap.add_argument("--bin", default=os.environ.get("QRGEN_CUDA_BIN"))
    ap.add_argument("--sass", type=Path, help="also write the whole SASS listing to this file")
    args = ap.parse_args()
    batch, m, n = (int(x) for x in args.case.split(","))
    schedule, _ = find(Problem(m, n, batch), Target("cuda", "sm_90"))
    sources = {r.name: r.source for r in render_all(schedule, "sm_90")}
    if args.kernel not in sources:
        raise SystemExit(f"{args.kernel} is not a kernel of this schedule; it has: {', '.join(sorted(sources))}")
    ptxas, nvdisasm = tool("ptxas", args.bin), tool("nvdisasm", args.bin)
    ptx = ptx_of(sources[args.kernel], args.kernel)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        for version in (None, "8.8", "8.7", "8.5"):  # the PTX as written, then older ISA versions
            text = ptx if version is None else re.sub(r"^\.version \S+", f".version {version}", ptx, flags=re.M)
            ptx_path.write_text(text)
            run = subprocess.run([ptxas, "-arch=sm_90", "-O3", "-v", str(ptx_path), "-o", str(cubin)],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                break
        else:
            raise SystemExit(run.stderr)
        print(run.stderr.strip().splitlines()[-2] if run.stderr.strip() else "")
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
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
