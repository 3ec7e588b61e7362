"""Branch gemm3 (not wired into the pipeline): the generated 3xTF32 GEMM (templates/cuda/gemm3.cu.j2) against
cuBLAS fp32 and tf32 at the trailing update's shapes, C -= A B: the largest error against float64 (in eps32,
relative to the largest entry), median time (L2 flushed), TFLOP/s.

    python scripts/gemm3_bench.py                  # on the GPU machine
    python scripts/gemm3_bench.py --compile-only   # no GPU: render, NVRTC to sm_90, registers and spills
"""
import sys
import numpy as np
from qrgen import codegen, __version__
from qrgen.compile import compile_source

CONFIGS = {"b64": dict(bm=64, bn=128, bk=16, threads=128, wm_warps=1, wn_warps=4, presplit=False, min_blocks=3),
           "b64x64": dict(bm=64, bn=64, bk=16, threads=128, wm_warps=2, wn_warps=2, presplit=False, min_blocks=3),
           "b128x64": dict(bm=128, bn=64, bk=16, threads=256, wm_warps=4, wn_warps=2, presplit=False, min_blocks=1),
           "b64 pre": dict(bm=64, bn=128, bk=8, threads=128, wm_warps=1, wn_warps=4, presplit=True, min_blocks=3),
           "b64x64 pre": dict(bm=64, bn=64, bk=16, threads=128, wm_warps=2, wn_warps=2, presplit=True, min_blocks=3)}


def build(cfg: str, a_mcontig: bool):
    name = f"qr_gemm3_{cfg.replace(' ', '_')}_{'mc' if a_mcontig else 'kc'}"
    src = codegen.environment().get_template("cuda/gemm3.cu.j2").render(
        version=__version__, arch="sm_90", name=name, a_mcontig=a_mcontig, **CONFIGS[cfg])
    return compile_source(name, src, "sm_90")


if "--compile-only" in sys.argv:
    for cfg in CONFIGS:
        for mc in (False, True):
            b = build(cfg, mc)
            print(b.name, "registers", b.registers, "spill", b.spill_bytes, "stack", b.stack_bytes)
    raise SystemExit

import cupy
from qrgen import cublas
from qrgen.bench import median_time_us

funcs = {}
def func(cfg, mc):
    if (cfg, mc) not in funcs:
        b = build(cfg, mc)
        mod = cupy.cuda.function.Module(); mod.load(b.cubin)
        funcs[(cfg, mc)] = (mod, mod.get_function(b.name), b)
        print(f"  {b.name}: {b.registers} registers, {b.spill_bytes} bytes spill", flush=True)
    return funcs[(cfg, mc)][1]


def gemm3(cfg, a, a_mcontig, lda, sa, b, ldb, sb, c, ldc, sc, M, N, K, batch, alpha, beta):
    f = func(cfg, a_mcontig)
    bm, bn = CONFIGS[cfg]["bm"], CONFIGS[cfg]["bn"]
    grid = (((N + bn - 1) // bn) * ((M + bm - 1) // bm), 1, batch)
    f(grid, (CONFIGS[cfg]["threads"],), (a, np.int32(lda), np.int64(sa), b, np.int32(ldb), np.int64(sb), c,
                                         np.int32(ldc), np.int64(sc), np.int32(M), np.int32(N), np.int32(K),
                                         np.float32(alpha), np.float32(beta)))


SHAPES = [("1024² project", 60, 128, 896, 768, False), ("1024² update", 60, 896, 128, 768, True),
          ("2048² project", 8, 128, 1920, 1792, False), ("2048² update", 8, 1920, 128, 1792, True),
          ("4096² update", 2, 3968, 128, 3840, True), ("1024² near update", 60, 896, 128, 128, True)]
rng = np.random.default_rng(0)
for label, batch, M, K, N, mc in SHAPES:
    a_host = rng.standard_normal((batch, K, M) if mc else (batch, M, K), dtype=np.float32)
    b_host = rng.standard_normal((batch, K, N), dtype=np.float32)
    c_host = rng.standard_normal((batch, M, N), dtype=np.float32)
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    a_op = a.transpose(0, 2, 1) if mc else a
    a64 = (a_host.transpose(0, 2, 1) if mc else a_host)[:3].astype(np.float64)
    ref = c_host[:3].astype(np.float64) - np.matmul(a64, b_host[:3].astype(np.float64))  # C -= A B
    flops = 2.0 * batch * M * K * N
    lda = M if mc else K
    for impl in ("cublas fp32", "cublas tf32", *(f"gemm3 {c}" for c in CONFIGS)):
        c = cupy.asarray(c_host)
        if impl.startswith("cublas"):
            prec = impl.split()[1]
            run = lambda: cublas.matmul(a_op, b, subtract_from=c, precision=prec)
        else:
            cfg = impl.split(" ", 1)[1]
            run = lambda: gemm3(cfg, a, mc, lda, M * K, b, N, K * N, c, N, M * N, M, N, K, batch, -1.0, 1.0)
        run()
        cupy.cuda.runtime.deviceSynchronize()
        err = np.abs(cupy.asnumpy(c[:3]) - ref).max() / (np.abs(ref).max() * np.finfo(np.float32).eps)
        t = median_time_us(lambda x: run(), [None], 20)
        print(f"{label:<18} {impl:<18} {t:9.1f} µs {flops / t / 1e6:6.1f} TFLOP/s  largest error {err:8.2f} eps32",
              flush=True)
