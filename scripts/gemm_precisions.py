"""Run on the GPU machine: cuBLAS's batched GEMMs at the trailing update's shapes in fp32, tf32 and fp32 emulated
by BF16x9 (compute type 78, CUBLAS_COMPUTE_32F_EMULATED_16BFX9, with the emulation strategy forced to EAGER where
the library has cublasSetEmulationStrategy): median time (L2 flushed), TFLOP/s, and the largest error against
float64 in units of eps32 relative to the largest entry.

    python scripts/gemm_precisions.py
"""
import ctypes

import cupy
import numpy as np

from qrgen import cublas
from qrgen.bench import median_time_us

EMULATED = "bf16x9"
# (label, batch, rows, depth, cols, A transposed): W = V^T C (project) and C -= (VT) W (update) of one aggregate
# of 128 columns, and the rank-32 panel products of 640 x 512².
SHAPES = [("1024² project", 60, 128, 896, 768, False), ("1024² update", 60, 896, 128, 768, True),
          ("512² panel project", 640, 32, 480, 448, False), ("512² panel update", 640, 480, 32, 448, True),
          ("2048² project", 8, 128, 1920, 1792, False), ("2048² update", 8, 1920, 128, 1792, True)]


def force_emulation() -> None:
    lib = cublas._library()
    handle = cublas._handle(cupy.cuda.Device().id)[0]
    version = ctypes.c_int()
    lib.cublasGetVersion_v2.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.cublasGetVersion_v2(handle, ctypes.byref(version))
    print(f"cuBLAS {version.value}")
    try:
        setter = lib.cublasSetEmulationStrategy
    except AttributeError:
        print("this cuBLAS has no cublasSetEmulationStrategy")
        return
    setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    print(f"cublasSetEmulationStrategy(EAGER): status {setter(handle, 2)}")


def main() -> None:
    compute = dict(cublas.COMPUTE_TYPE)
    cublas.COMPUTE_TYPE[EMULATED] = 78  # this script only: qrgen's stages never ask for it
    try:
        force_emulation()
        rng = np.random.default_rng(0)
        for label, batch, rows, depth, cols, trans in SHAPES:
            a_host = rng.standard_normal((batch, depth, rows) if trans else (batch, rows, depth), dtype=np.float32)
            b_host = rng.standard_normal((batch, depth, cols), dtype=np.float32)
            a, b = cupy.asarray(a_host), cupy.asarray(b_host)
            a_op = a.transpose(0, 2, 1) if trans else a
            a64 = (a_host.transpose(0, 2, 1) if trans else a_host)[:4].astype(np.float64)
            ref = np.matmul(a64, b_host[:4].astype(np.float64))
            out = cupy.empty((batch, rows, cols), dtype=cupy.float32)
            flops = 2.0 * batch * rows * depth * cols
            for precision in ("fp32", "tf32", EMULATED):
                cublas.matmul(a_op, b, precision=precision, out=out)
                err = np.abs(cupy.asnumpy(out[:4]) - ref).max() / (np.abs(ref).max() * np.finfo(np.float32).eps)
                t = median_time_us(lambda x: cublas.matmul(a_op, x, precision=precision, out=out), [b], 20)
                print(f"{label:<20} {precision:<7} {t:9.1f} µs {flops / t / 1e6:6.1f} TFLOP/s  largest error "
                      f"{err:8.1f} eps32", flush=True)
    finally:
        cublas.COMPUTE_TYPE.clear()
        cublas.COMPUTE_TYPE.update(compute)


if __name__ == "__main__":
    main()
