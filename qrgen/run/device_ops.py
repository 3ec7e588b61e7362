"""The products qrgen.numerics.qmatrix runs on CuPy arrays: float32 through cuBLAS (capturable in a CUDA graph),
tf32x3 through the generated kernels, T through the T kernel. Importing this module registers them."""
from __future__ import annotations

from ..numerics import qmatrix
from . import cublas
from .launch import t_max_gpu, tf32x3_matmul, tmatrix_gpu


class CupyOps:
    matmul = staticmethod(cublas.matmul)
    tf32x3 = staticmethod(tf32x3_matmul)
    tmatrix = staticmethod(tmatrix_gpu)
    t_max = staticmethod(t_max_gpu)


qmatrix.DEVICE_OPS["cupy"] = CupyOps
