"""The generated 3xTF32 products (qrgen.plan.tf32x3, templates/cuda/gemm3.cu.j2) in several tile configurations
against cuBLAS fp32 and tf32 at the trailing update's shapes, C = C - A B: the largest error against float64 (in
eps32, relative to the largest entry), the median time (L2 flushed) and TFLOP/s. "project", "project64", "update"
and "gram" are the configurations the pipeline uses (tf32x3.CONFIGS; gram here computes all of C, not only its
upper part).

    python3 tools/tf32x3_bench.py [--config update ...]   # on the GPU machine
    python3 tools/tf32x3_bench.py --compile-only           # no GPU: render, NVRTC, registers, spills, shared
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import cupy
import numpy as np

from qrgen.bench import median_time_us
from qrgen.compile.nvrtc import compile_source
from qrgen.plan import tf32x3
from qrgen.render.environment import environment
from qrgen.run import cublas
from qrgen.run.launch import load_function
from qrgen.targets import Target
from qrgen.version import __version__
from tools import cases

TEMPLATE = "tf32x3.cu.j2"  # the template plan/tf32x3.render renders, in the target's template folder
# Tiles bm x bn of bk per step, warps wm x wn, steps in flight, resident blocks per SM asked of the compiler.
CONFIGS = {**{kind: {k: v for k, v in cfg.items() if k not in ("a_mcontig", "upper_only")}
              for kind, cfg in tf32x3.CONFIGS.items() if not cfg.get("t_fused")},  # (the _t kernels take T too)
           "128 k32 s3": dict(bm=128, bn=128, bk=32, wm_warps=2, wn_warps=4, stages=3, min_blocks=1),
           "128 k16 s4 x2": dict(bm=128, bn=128, bk=16, wm_warps=2, wn_warps=4, stages=4, min_blocks=2),
           "128x64 k32 s3": dict(bm=128, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2),
           "64 k32 s3": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=3),
           "64x128 k32 s3": dict(bm=64, bn=128, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2),
           "64 k32 s2 x4": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=2, min_blocks=4),
           "128x64 k32 s2 x2": dict(bm=128, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=2, min_blocks=2),
           "128 k32 s2": dict(bm=128, bn=128, bk=32, wm_warps=2, wn_warps=4, stages=2, min_blocks=1)}
# (label, batch, M, K, N, A given M-contiguous, B given K-contiguous): the 60 x 1024², 8 x 2048² and 2 x 4096²
# aggregates' products, a 60 x 1024² aggregate's Gram matrix, and 640 x 512²'s first and fifth aggregates (of 64).
SHAPES = [("1024² project", 60, 128, 896, 768, False, False), ("1024² update", 60, 896, 128, 768, True, False),
          ("2048² project", 8, 128, 1920, 1792, False, False), ("2048² update", 8, 1920, 128, 1792, True, False),
          ("4096² update", 2, 3968, 128, 3840, True, False), ("1024² near update", 60, 896, 128, 128, True, False),
          ("1024² gram", 60, 128, 896, 128, False, True),
          ("512² a64 project", 640, 64, 512, 448, False, False), ("512² a64 update", 640, 512, 64, 448, True, False),
          ("512² a64 late update", 640, 256, 64, 192, True, False)]


def config(label: str, a_mcontig: bool) -> dict:
    return {"b_kcontig": False, "t_fused": False, **CONFIGS[label], "a_mcontig": a_mcontig, "upper_only": False}


def build(label: str, a_mcontig: bool, target: Target):
    name = f"qr_tf32x3_bench_{label.replace(' ', '_')}_{'mc' if a_mcontig else 'kc'}"
    source = environment().get_template(f"{target.record.template_dir}/{TEMPLATE}").render(
        version=__version__, arch=target.arch, name=name, **config(label, a_mcontig))
    return compile_source(name, source, target.arch)


class Kernels:
    """Each configuration's kernel for A K- or M-contiguous, built and loaded on first use."""

    def __init__(self, target: Target):
        self.target, self.functions = target, {}

    def __call__(self, label, a, a_mcontig, lda, sa, b, ldb, sb, c, ldc, sc, M, N, K, batch, alpha, beta):
        cfg = config(label, a_mcontig)
        key = (label, a_mcontig)
        if key not in self.functions:
            binary = build(label, a_mcontig, self.target)
            self.functions[key] = load_function(binary, tf32x3.shared_bytes(cfg))
            print(f"  {binary.name}: {binary.registers} registers, {binary.spill_bytes} bytes spill", flush=True)
        _, func = self.functions[key]
        grid = ((N + cfg["bn"] - 1) // cfg["bn"], (M + cfg["bm"] - 1) // cfg["bm"], batch)
        # the kernels' parameters (tf32x3.SIGNATURE); one part of K
        func(grid, (tf32x3.threads(cfg),),
             (a, np.int32(lda), np.int64(sa), b, np.int32(ldb), np.int64(sb), c, np.int32(ldc), np.int64(sc),
              np.int32(M), np.int32(N), np.int32(K), np.float32(alpha), np.float32(beta), np.int32(1), np.int64(0)),
             shared_mem=tf32x3.shared_bytes(cfg))


def compare(target: Target, labels) -> None:
    kernels = Kernels(target)
    rng = np.random.default_rng(0)
    for label, batch, M, K, N, mc, kc in SHAPES:
        a_host = rng.standard_normal((batch, K, M) if mc else (batch, M, K), dtype=np.float32)
        b_host = rng.standard_normal((batch, K, N), dtype=np.float32)
        b_given = np.ascontiguousarray(b_host.transpose(0, 2, 1)) if kc else b_host  # as the kernel reads it
        c_host = rng.standard_normal((batch, M, N), dtype=np.float32)
        a, b = cupy.asarray(a_host), cupy.asarray(b_given)
        a_op = a.transpose(0, 2, 1) if mc else a
        b_op = b.transpose(0, 2, 1) if kc else b
        a64 = (a_host.transpose(0, 2, 1) if mc else a_host)[:3].astype(np.float64)
        ref = c_host[:3].astype(np.float64) - np.matmul(a64, b_host[:3].astype(np.float64))
        flops = 2.0 * batch * M * K * N
        lda = M if mc else K
        impls = ["cublas fp32", "cublas tf32"] + [f"tf32x3 {c}" for c in labels if config(c, mc)["b_kcontig"] == kc]
        for impl in impls:
            c = cupy.asarray(c_host)
            library, which = impl.split(" ", 1)
            if library == "cublas":
                def run():
                    cublas.matmul(a_op, b_op, subtract_from=c, precision=which)
            else:
                def run():
                    kernels(which, a, mc, lda, M * K, b, K if kc else N, K * N, c, N, M * N, M, N, K, batch, -1.0,
                            1.0)
            run()
            cupy.cuda.runtime.deviceSynchronize()
            err = np.abs(cupy.asnumpy(c[:3]) - ref).max() / (np.abs(ref).max() * np.finfo(np.float32).eps)
            t = median_time_us(lambda x: run(), [None], 20)
            print(f"{label:<18} {impl:<22} {t:9.1f} µs {flops / t / 1e6:6.1f} TFLOP/s  largest error {err:8.2f} "
                  f"eps32", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true",
                    help="render and compile every configuration, print registers, spills and shared memory (no GPU)")
    ap.add_argument("--config", action="append", choices=CONFIGS, metavar="LABEL",
                    help="only this configuration (repeatable; default all: " + ", ".join(CONFIGS) + ")")
    ap.add_argument("--arch", help="target architecture (default: the GPU's; sm_90 with --compile-only)")
    args = ap.parse_args()
    labels = args.config or list(CONFIGS)
    target = cases.target(args.arch or ("sm_90" if args.compile_only else None))
    if not args.compile_only:
        compare(target, labels)
        return
    for label in labels:
        for mc in (False, True):
            b = build(label, mc, target)
            print(f"{b.name}: {b.registers} registers, {b.spill_bytes} bytes spill, "
                  f"{tf32x3.shared_bytes(config(label, mc))} bytes shared", flush=True)


if __name__ == "__main__":
    main()
