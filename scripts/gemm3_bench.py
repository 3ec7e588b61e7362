"""The generated 3xTF32 GEMM (templates/cuda/gemm3.cu.j2, the "tf32x3" products) in several tile configurations
against cuBLAS fp32 and tf32 at the trailing update's shapes, C = C - A B: the largest error against float64 (in
eps32, relative to the largest entry), median time (L2 flushed), TFLOP/s. "project" and "update" are the
configurations the pipeline uses (qrgen.codegen.GEMM3).

    python scripts/gemm3_bench.py                  # on the GPU machine
    python scripts/gemm3_bench.py --compile-only   # no GPU: render, NVRTC to sm_90, registers and spills
"""
import sys

import numpy as np

from qrgen import __version__, codegen
from qrgen.compile import compile_source

# Tiles bm x bn of bk per step, warps wm x wn, steps in flight, resident blocks per SM asked of the compiler.
CONFIGS = {"project": {k: v for k, v in codegen.GEMM3["project"].items() if k != "a_mcontig"},
           "update": {k: v for k, v in codegen.GEMM3["update"].items() if k != "a_mcontig"},
           "gram": {k: v for k, v in codegen.GEMM3["gram"].items() if k != "a_mcontig"},
           "128 k32 s3": dict(bm=128, bn=128, bk=32, wm_warps=2, wn_warps=4, stages=3, min_blocks=1),
           "128 k16 s4 x2": dict(bm=128, bn=128, bk=16, wm_warps=2, wn_warps=4, stages=4, min_blocks=2),
           "128x64 k32 s3": dict(bm=128, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2),
           "64 k32 s3": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=3),
           "64x128 k32 s3": dict(bm=64, bn=128, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2),
           "project64": {k: v for k, v in codegen.GEMM3["project64"].items() if k != "a_mcontig"},
           "64 k32 s2 x4": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=2, min_blocks=4),
           "128x64 k32 s2 x2": dict(bm=128, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=2, min_blocks=2),
           "128 k32 s2": dict(bm=128, bn=128, bk=32, wm_warps=2, wn_warps=4, stages=2, min_blocks=1)}


def config(cfg: str, a_mcontig: bool) -> dict:
    return {"b_kcontig": False, **CONFIGS[cfg], "a_mcontig": a_mcontig, "upper_only": False}


def build(cfg: str, a_mcontig: bool):
    name = f"qr_gemm3_{cfg.replace(' ', '_')}_{'mc' if a_mcontig else 'kc'}"
    src = codegen.environment().get_template("cuda/gemm3.cu.j2").render(
        version=__version__, arch="sm_90", name=name, **config(cfg, a_mcontig))
    return compile_source(name, src, "sm_90")


if "--compile-only" in sys.argv:
    for cfg in CONFIGS:
        for mc in (False, True):
            b = build(cfg, mc)
            print(b.name, "registers", b.registers, "spill", b.spill_bytes, "shared",
                  codegen.gemm3_shared_bytes(config(cfg, mc)))
    raise SystemExit

import cupy  # noqa: E402

from qrgen import cublas  # noqa: E402
from qrgen.bench import median_time_us  # noqa: E402

funcs = {}


def func(cfg, mc):
    if (cfg, mc) not in funcs:
        b = build(cfg, mc)
        mod = cupy.cuda.function.Module()
        mod.load(b.cubin)
        f = mod.get_function(b.name)
        cupy.cuda.driver.funcSetAttribute(f.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          codegen.gemm3_shared_bytes(config(cfg, mc)))
        funcs[(cfg, mc)] = (mod, f)
        print(f"  {b.name}: {b.registers} registers, {b.spill_bytes} bytes spill", flush=True)
    return funcs[(cfg, mc)][1]


def gemm3(cfg, a, a_mcontig, lda, sa, b, ldb, sb, c, ldc, sc, M, N, K, batch, alpha, beta):
    c_ = config(cfg, a_mcontig)
    grid = ((N + c_["bn"] - 1) // c_["bn"], (M + c_["bm"] - 1) // c_["bm"], batch)
    func(cfg, a_mcontig)(grid, (codegen.gemm3_threads(c_),),
                         (a, np.int32(lda), np.int64(sa), b, np.int32(ldb), np.int64(sb), c, np.int32(ldc),
                          np.int64(sc), np.int32(M), np.int32(N), np.int32(K), np.float32(alpha), np.float32(beta),
                          np.int32(1), np.int64(0)),
                         shared_mem=codegen.gemm3_shared_bytes(c_))


# (label, batch, M, K, N, A given M-contiguous, B given K-contiguous): the 60 x 1024², 8 x 2048² and 2 x 4096²
# aggregates' products, a 60 x 1024² aggregate's Gram matrix, and 640 x 512²'s first and fifth aggregates (of 64).
SHAPES = [("1024² project", 60, 128, 896, 768, False, False), ("1024² update", 60, 896, 128, 768, True, False),
          ("2048² project", 8, 128, 1920, 1792, False, False), ("2048² update", 8, 1920, 128, 1792, True, False),
          ("4096² update", 2, 3968, 128, 3840, True, False), ("1024² near update", 60, 896, 128, 128, True, False),
          ("1024² gram", 60, 128, 896, 128, False, True),
          ("512² a64 project", 640, 64, 512, 448, False, False), ("512² a64 update", 640, 512, 64, 448, True, False),
          ("512² a64 late update", 640, 256, 64, 192, True, False)]
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
    for impl in ("cublas fp32", "cublas tf32", *(f"gemm3 {c}" for c in CONFIGS if config(c, mc)["b_kcontig"] == kc)):
        c = cupy.asarray(c_host)
        if impl.startswith("cublas"):
            run = lambda: cublas.matmul(a_op, b_op, subtract_from=c, precision=impl.split()[1])  # noqa: E731
        else:
            cfg = impl.split(" ", 1)[1]
            run = lambda: gemm3(cfg, a, mc, lda, M * K, b, K if kc else N, K * N, c, N, M * N, M, N, K, batch, -1.0,  # noqa: E731
                                1.0)
        run()
        cupy.cuda.runtime.deviceSynchronize()
        err = np.abs(cupy.asnumpy(c[:3]) - ref).max() / (np.abs(ref).max() * np.finfo(np.float32).eps)
        t = median_time_us(lambda x: run(), [None], 20)
        print(f"{label:<18} {impl:<20} {t:9.1f} µs {flops / t / 1e6:6.1f} TFLOP/s  largest error {err:8.2f} eps32",
              flush=True)
