"""Batched GEMMs through cuBLAS, called directly (ctypes), so that a qrgen call can be captured in a CUDA graph.

CuPy refuses every cuBLAS call while a stream is capturing (cupy/cupy#6290), although cuBLAS itself supports
capture once a handle has its own workspace (cuBLAS docs, "CUDA Graphs support"). qrgen therefore keeps one
cuBLAS handle per thread and device, each with a fixed workspace, and calls cublasGemmStridedBatchedEx on the
caller's stream.
The library is the libcublas that CuPy's own binding loaded (same process, same version).
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F = 0
CUBLAS_GEMM_DEFAULT = -1
COMPUTE_TYPE = {"fp32": 68, "fp16": 74, "bf16": 75, "tf32": 77}  # CUBLAS_COMPUTE_32F[_FAST_16F|_16BF|_TF32]
WORKSPACE_BYTES = 32 << 20  # what cuBLAS asks for on Hopper

_lib = None
_local = threading.local()
_SCALARS = {value: np.array(value, dtype=np.float32) for value in (1.0, -1.0, 0.0)}


def _library():
    global _lib
    if _lib is None:
        try:
            import cupy_backends.cuda.libs.cublas  # noqa: F401  (loads libcublas into the process)
        except Exception as exc:
            from ..compile.nvrtc import install_hint

            raise RuntimeError(f"qrgen's trailing updates need cuBLAS, which did not load ({exc}): "
                               f"{install_hint()}") from None
        for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:  # pragma: no cover - a CuPy install always brings one
            raise RuntimeError("qrgen needs cuBLAS (libcublas.so), which CuPy's cuBLAS binding did not load")
        i, ll, p, sz = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_size_t
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(p)]
        lib.cublasSetStream_v2.argtypes = [p, p]
        lib.cublasSetWorkspace_v2.argtypes = [p, p, sz]
        lib.cublasSetSmCountTarget.argtypes = [p, i]
        lib.cublasGemmStridedBatchedEx.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll,
                                                   i, i, i]
        for fn in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
                   lib.cublasSetSmCountTarget, lib.cublasGemmStridedBatchedEx):
            fn.restype = ctypes.c_int
        _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS {what} failed with status {status}")


def _handle(device_id: int, slot: int = 0) -> list:
    """[handle, workspace, stream last set, SM count target last set] of this thread on this device (a cuBLAS
    handle holds one stream at a time, so threads do not share handles, as in CuPy); slot 1 is a second one, for
    GEMMs that run at the same time as slot 0's on another stream (a workspace must not be shared by kernels
    running at once)."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    entry = handles.get((device_id, slot))
    if entry is None:
        import cupy

        lib = _library()
        with cupy.cuda.Device(device_id):
            handle = ctypes.c_void_p()
            _check(lib.cublasCreate_v2(ctypes.byref(handle)), "create")
            # from CuPy's own pool, whatever allocator the call runs under: a handle outlives the call (torch's
            # allocator would hand it memory of a graph's pool where the first call is inside a capture)
            workspace = cupy.get_default_memory_pool().malloc(WORKSPACE_BYTES)
            _check(lib.cublasSetWorkspace_v2(handle, workspace.ptr, WORKSPACE_BYTES), "set workspace")
        entry = handles[(device_id, slot)] = [handle, workspace, None, 0]
    return entry


def gemm(device_id: int, stream_ptr: int, trans_a: bool, trans_b: bool, rows: int, cols: int, depth: int,
         alpha: float, a_ptr: int, lda: int, sa: int, b_ptr: int, ldb: int, sb: int, beta: float, c_ptr: int,
         ldc: int, sc: int, batch: int, precision: str, slot: int = 0, sm_target: int = 0) -> None:
    """Row-major C = alpha op(A) op(B) + beta C for `batch` matrices at fixed strides (in floats), computed as
    cuBLAS's column-major C^T = op(B)^T op(A)^T. Inputs rounded as `precision` says, fp32 accumulation; `slot`
    picks the thread's handle (see _handle); `sm_target` > 0: the SMs cuBLAS may plan for (cublasSetSmCountTarget,
    for a GEMM that shares the GPU with kernels on another stream), 0 all of them."""
    lib = _library()
    entry = _handle(device_id, slot)
    handle = entry[0]
    if entry[2] != stream_ptr:
        _check(lib.cublasSetStream_v2(handle, stream_ptr), "set stream")
        entry[2] = stream_ptr
    if entry[3] != sm_target:
        _check(lib.cublasSetSmCountTarget(handle, sm_target), "set SM count target")
        entry[3] = sm_target
    _check(lib.cublasGemmStridedBatchedEx(
        handle, CUBLAS_OP_T if trans_b else CUBLAS_OP_N, CUBLAS_OP_T if trans_a else CUBLAS_OP_N,
        cols, rows, depth, _SCALARS[alpha].ctypes.data, b_ptr, CUDA_R_32F, ldb, sb, a_ptr, CUDA_R_32F, lda, sa,
        _SCALARS[beta].ctypes.data, c_ptr, CUDA_R_32F, ldc, sc, batch, COMPUTE_TYPE[precision], CUBLAS_GEMM_DEFAULT),
        "gemm")


def _operand(x):
    """(array, transposed, leading dimension, batch stride) of a 3-d CuPy float32 array whose last two axes are
    row-major or transposed, with any batch stride; other layouts are copied first."""
    item = x.itemsize
    s0, s1, s2 = (s // item for s in x.strides)
    if s2 == 1 and s1 >= x.shape[2]:
        return x, False, max(1, s1), s0
    if s1 == 1 and s2 >= x.shape[1]:
        return x, True, max(1, s2), s0
    y = x.copy(order="C")
    return y, False, max(1, y.shape[2]), y.shape[1] * y.shape[2]


def matmul(a, b, subtract_from=None, precision: str = "fp32", out=None):
    """a @ b for 3-d CuPy float32 arrays (batch, r, d) and (batch, d, c) (a batch of 1 broadcasts), on the current
    stream, capturable in a CUDA graph. Returns a new C-contiguous array; with `subtract_from` c (batch, r, c),
    float32 with row-major last two axes, possibly a view into a larger array: c -= a @ b in place (beta 1),
    returning c; with `out` such an array instead: out = a @ b (beta 0), returning out. `precision`: how the
    inputs are rounded (a key of COMPUTE_TYPE), fp32 accumulation."""
    import cupy

    if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[1]:
        raise ValueError(f"matmul needs (batch, r, d) @ (batch, d, c); got {a.shape} @ {b.shape}")
    if a.dtype != cupy.float32 or b.dtype != cupy.float32:
        raise TypeError(f"matmul takes float32 arrays; got {a.dtype} and {b.dtype}")
    batch = max(a.shape[0], b.shape[0])
    rows, depth, cols = a.shape[1], a.shape[2], b.shape[2]
    if subtract_from is not None and out is not None:
        raise ValueError("matmul takes subtract_from or out, not both")
    if subtract_from is None and out is None:
        c, alpha, beta = cupy.empty((batch, rows, cols), dtype=cupy.float32), 1.0, 0.0
    else:
        name, c = ("subtract_from", subtract_from) if out is None else ("out", out)
        alpha, beta = (-1.0, 1.0) if out is None else (1.0, 0.0)
        if c.shape != (batch, rows, cols) or c.dtype != cupy.float32 or c.strides[2] != 4 or c.strides[1] < 4 * cols:
            raise ValueError(f"{name} must be float32 (batch, {rows}, {cols}) with row-major last two axes; got "
                             f"{c.dtype} {c.shape} with strides {c.strides}")
    if depth == 0 and beta == 0.0:
        c.fill(0)
    if c.size == 0 or depth == 0:
        return c
    a, ta, lda, sa = _operand(a)
    b, tb, ldb, sb = _operand(b)
    sa = 0 if a.shape[0] == 1 else sa
    sb = 0 if b.shape[0] == 1 else sb
    gemm(c.device.id, cupy.cuda.get_current_stream().ptr, ta, tb, rows, cols, depth, alpha, a.data.ptr, lda, sa,
         b.data.ptr, ldb, sb, beta, c.data.ptr, c.strides[1] // 4, c.strides[0] // 4, batch, precision)
    return c
