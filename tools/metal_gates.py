"""The Metal kernels' accuracy by product precision: each case's default Apple schedule with its GEMMs' inputs in
each precision (gram, project, update), one matrix of every stress family run through a translation layer (the
CPU's, or with --cuda the CUDA one), and the worst factor and orthogonality per family against the gates (20, 100)
and the tuner's margin (10, 50). No GPU for the CPU layer.

    python3 tools/metal_gates.py 1x176x176 1x512x512 1x4096x64 [--precisions fp32,fp16,fp16 bf16,bf16,bf16] [--cuda]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import dataclasses
import time

from qrgen.numerics.check import FACTOR_GATE, ORTHOGONALITY_GATE, check
from qrgen.numerics.stress import FAMILIES, mixed
from qrgen.problem import Problem, parse_case
from qrgen.run import metal_engine
from qrgen.schedule.files import find
from qrgen.schedule.model import Precision
from qrgen.targets import Target
from qrgen.tune.evaluate import TUNE_FACTOR_GATE, TUNE_ORTHOGONALITY_GATE

PRECISIONS = ("fp32,fp32,fp32", "fp32,fp16,fp16", "fp16,fp16,fp16", "fp32,bf16,bf16", "bf16,bf16,bf16")


def gates(device, target, batch, m, n, precision: Precision) -> dict:
    """{family: (factor, orthogonality)}, the worst over `batch` matrices of each family."""
    schedule = dataclasses.replace(find(Problem(m, n, batch), target)[0], precision=precision)
    a, labels = mixed(m, n, batch * len(FAMILIES), seed=m + n)
    h, tau = metal_engine.geqrf(a, device, schedule, target)
    result = check(a, h, tau)
    out = {}
    for label, f, o in zip(labels, result.factor, result.orthogonality):
        pf, po = out.get(label, (0.0, 0.0))
        out[label] = (max(pf, float(f)), max(po, float(o)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help="BATCHxMxN: matrices of each family")
    parser.add_argument("--precisions", nargs="+", default=PRECISIONS, help="gram,project,update triples")
    parser.add_argument("--arch", default="apple9")
    parser.add_argument("--cuda", action="store_true", help="the CUDA translation layer (an NVIDIA GPU)")
    args = parser.parse_args()
    from qrgen.run.msl_devices import CpuDevice, CudaDevice

    device = CudaDevice() if args.cuda else CpuDevice()
    target = Target.parse(args.arch)
    print(f"{device.name}; gates {FACTOR_GATE:g}/{ORTHOGONALITY_GATE:g}, margin {TUNE_FACTOR_GATE:g}/"
          f"{TUNE_ORTHOGONALITY_GATE:g}")
    for text in args.cases:
        batch, m, n = parse_case(text)
        for triple in args.precisions:
            precision = Precision(*triple.split(","))
            start = time.perf_counter()
            per = gates(device, target, batch, m, n, precision)
            worst_f, family = max((f, fam) for fam, (f, _) in per.items())
            worst_o = max(o for _, o in per.values())
            margin = worst_f <= TUNE_FACTOR_GATE and worst_o <= TUNE_ORTHOGONALITY_GATE
            verdict = "margin" if margin else "gates" if worst_f <= FACTOR_GATE and worst_o <= ORTHOGONALITY_GATE \
                else "FAILS"
            print(f"{text} {triple}: factor {worst_f:.2f} ({family}), orthogonality {worst_o:.2f}: {verdict} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            print("   " + ", ".join(f"{fam} {f:.2f}" for fam, (f, _) in sorted(per.items())), flush=True)


if __name__ == "__main__":
    main()
