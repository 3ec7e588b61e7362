"""Run on the GPU machine: a panel's own trailing update (W = Z^T C, C -= V W) through cuBLAS against the
generated split kernels (templates/cuda/split.cu.j2), for the panel shapes of the large schedules; and where
the GPU time of a large factorization goes per launch kind (Factorizer.profile)."""
import sys

import cupy
import numpy as np

from qrgen import codegen, cublas
from qrgen.bench import back_to_back_us
from qrgen.compile import compile_many
from qrgen.runtime import split_rows

REPS = 20


def kernels(width):
    """The pipeline's split kernels for panels of `width` columns (rendered and compiled as qrgen does)."""
    funcs = []
    for kind in ("project", "update"):
        rendered = codegen.render_split(codegen.split_kernel(kind, width), "sm_90")
        (b,) = compile_many([(rendered.name, rendered.source)], "sm_90")
        mod = cupy.cuda.function.Module()
        mod.load(b.cubin)
        funcs.append((mod, mod.get_function(rendered.name)))
    return funcs


def case(nb, rows, width, nc, ldc):
    rng = cupy.random.default_rng(0)
    zt = rng.standard_normal((nb, width, rows), dtype=cupy.float32)
    vt = rng.standard_normal((nb, width, rows), dtype=cupy.float32)
    c = rng.standard_normal((nb, rows, ldc), dtype=cupy.float32)
    w = cupy.zeros((nb, width, nc), dtype=cupy.float32)
    tiles = -(-nc // 32)
    splits, chunk = split_rows(rows, nc, nb, cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"])
    part = cupy.empty((nb, splits * width * nc), dtype=cupy.float32)
    counters = cupy.zeros((nb * tiles,), dtype=cupy.uint32)
    (_, project), (_, update) = kernels(width)
    dev = cupy.cuda.Device().id

    def custom():
        project((tiles, splits, nb), (codegen.SPLIT_THREADS,), (zt, np.int32(rows), np.int64(width * rows), c, np.int32(ldc),
                np.int64(rows * ldc), part, np.int64(splits * width * nc), w, np.int32(nc), np.int64(width * nc),
                counters, np.int32(rows), np.int32(nc), np.int32(chunk)))
        update((tiles, -(-rows // codegen.SPLIT_TILE), nb), (codegen.SPLIT_THREADS,), (vt, np.int32(rows), np.int64(width * rows), w, np.int32(nc),
               np.int64(width * nc), c, np.int32(ldc), np.int64(rows * ldc), np.int32(rows), np.int32(nc)))

    def blas():
        s = cupy.cuda.get_current_stream().ptr
        cublas.gemm(dev, s, False, False, width, nc, rows, 1.0, zt.data.ptr, rows, width * rows, c.data.ptr, ldc,
                    rows * ldc, 0.0, w.data.ptr, nc, width * nc, nb, "fp32")
        cublas.gemm(dev, s, True, False, rows, nc, width, -1.0, vt.data.ptr, rows, width * rows, w.data.ptr, nc,
                    width * nc, 1.0, c.data.ptr, ldc, rows * ldc, nb, "fp32")

    # correctness of the custom pair against float64
    c0 = c.copy()
    custom()
    wref = cupy.einsum("bkr,brc->bkc", zt.astype(cupy.float64), c0[:, :, :nc].astype(cupy.float64))
    cref = c0[:, :, :nc].astype(cupy.float64) - cupy.einsum("bkr,bkc->brc", vt.astype(cupy.float64), wref)
    werr = float(cupy.abs(w - wref).max() / cupy.abs(wref).max())
    cerr = float(cupy.abs(c[:, :, :nc] - cref).max() / cupy.abs(cref).max())
    rest = bool((c[:, :, nc:] == c0[:, :, nc:]).all())
    c[...] = c0
    t_custom, t_blas = back_to_back_us(custom, REPS, 7), back_to_back_us(blas, REPS, 7)
    print(f"| {nb} | {rows} | {width} | {nc} | {splits} | {t_blas:.1f} | {t_custom:.1f} | {t_blas / t_custom:.1f}x"
          f" | {werr:.1e} | {cerr:.1e} | {rest} |", flush=True)


def breakdown(batch, n):
    from qrgen.runtime import factorizer_for

    fac = factorizer_for(n, n, batch, "sm_90")
    a = cupy.random.standard_normal((batch, n, n), dtype=cupy.float32)
    fac(a)
    fac.profile(a)
    stages = fac.profile(a)
    sums, counts, level = {}, {}, "panel"
    for stage, launch, start, stop in stages:
        if stage == "panel":
            level = "panel"
        elif stage == "gram":
            level = "aggregate"
        key = stage if stage in ("panel", "gram", "tmat", "aggregate") else f"{stage} ({level} level)"
        sums[key] = sums.get(key, 0.0) + cupy.cuda.get_elapsed_time(start, stop) * 1e3
        counts[key] = counts.get(key, 0) + 1
    print(f"\n{batch} x {n}² by launch kind (events around each launch, eager): total {sum(sums.values()):,.0f} µs")
    for key in sums:
        print(f"  {key:28s} {counts[key]:4d} launches {sums[key]:10,.0f} µs  {sums[key] / counts[key]:8.1f} µs each")


if __name__ == "__main__":
    print("| batch | rows | width | nc | splits | cuBLAS µs | split µs | speed-up | W err | C err | rest kept |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for nb, rows, width, nc, ldc in [(2, 4096, 8, 120, 4096), (2, 3000, 8, 56, 4096), (2, 1800, 16, 112, 4096),
                                     (2, 900, 32, 96, 4096), (8, 2048, 16, 112, 2048), (8, 1500, 32, 96, 2048),
                                     (60, 1024, 32, 96, 1024), (60, 600, 32, 32, 1024), (640, 512, 32, 480, 512),
                                     (640, 256, 32, 224, 512), (40, 352, 32, 320, 352), (40, 176, 32, 144, 176),
                                     (1, 4096, 8, 120, 4096), (1, 8192, 16, 496, 512), (1, 100000, 8, 24, 32)]:
        if nc > 0:
            case(nb, rows, width, nc, ldc)
    if "--breakdown" in sys.argv:
        breakdown(2, 4096)
        breakdown(8, 2048)
        breakdown(60, 1024)
