"""Forming and applying Q from (h, tau), batched: householder_product (orgqr), ormqr, qr and lstsq.

Q = H_0 H_1 ... H_{k-1} is applied in blocks of BLOCK reflectors in compact WY form, B = I - V T V^T, with V
from h (unit diagonal, zero above) and T from G = V^T V and tau (LAPACK's slarft). The blocks need not be the
factorization's panels: wide blocks mean few passes over C (a rank-128 update instead of one per 8-, 16- or
32-column panel). The same code runs on NumPy arrays (the CPU reference, in the arrays' precision) and on CuPy
arrays (the GPU: batched products through cuBLAS, T by the generated T kernel), so the CPU tests check the GPU's
algorithm.
"""
from __future__ import annotations

import numpy as np

SIDES = ("L", "R")
BLOCK = 128  # reflectors per block; at most 256 (the T kernel, qrgen.codegen.TMAT_THREADS)


def array_module(x):
    """numpy or cupy, by the array's kind."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _matmul(xp, a, b):
    """Batched a @ b; on the GPU in float32 through qrgen.cublas (capturable in a CUDA graph, unlike
    cupy.matmul); other precisions (the float64 check) through the array module."""
    if xp is np or a.dtype != xp.float32:
        return xp.matmul(a, b)
    from .cublas import matmul

    return matmul(a, b)


def _sub_matmul(xp, c, a, b):
    """c -= a @ b in place (c a view of a larger array is updated where it lies); on the GPU one cuBLAS call with
    beta 1 for float32 row-major c, no temporary and no separate subtraction."""
    if xp is np or c.dtype != xp.float32 or c.strides[2] != c.itemsize or c.strides[1] < c.shape[2] * c.itemsize:
        c -= _matmul(xp, a, b)
        return
    from .cublas import matmul

    matmul(a, b, subtract_from=c)


def _set_diagonal(x, value) -> None:
    """x[:, i, i] = value for i < min of the last two dimensions, through a strided view of the C-contiguous
    (batch, r, c) array x: one fill, where an index array would scatter."""
    batch, r, c = x.shape
    x.reshape(batch, r * c)[:, ::c + 1][:, :min(r, c)] = value


def _tmatrix(xp, gram, tau):
    if xp is np or tau.dtype != xp.float32:
        from .reference import _tmatrix as tmatrix

        return tmatrix(gram, tau, xp)
    from .runtime import tmatrix_gpu

    return tmatrix_gpu(gram, tau)


def blocks(m: int, n: int, block: int = BLOCK) -> list[tuple[int, int]]:
    """(first column, width) of each block of reflectors."""
    if not 1 <= block <= 256:
        raise ValueError(f"block must be from 1 to 256 reflectors, got {block}")
    k = min(m, n)
    return [(c0, min(block, k - c0)) for c0 in range(0, k, block)]


def _wy(xp, h, tau, c0: int, w: int):
    """V (batch, m - c0, w) and T (batch, w, w) of the reflectors c0 .. c0 + w - 1."""
    v = xp.tril(h[:, c0:, c0:c0 + w], -1)  # a new C-contiguous array
    _set_diagonal(v, 1)
    t = _tmatrix(xp, _matmul(xp, v.transpose(0, 2, 1), v), xp.ascontiguousarray(tau[:, c0:c0 + w]))
    return v, t


def _left(xp, part, v, tt):
    """part -= V op(T) V^T part, in place: one block applied from the left."""
    _sub_matmul(xp, part, v, _matmul(xp, tt, _matmul(xp, v.transpose(0, 2, 1), part)))


def apply_q(h, tau, c, side: str = "L", transpose: bool = False, block: int = BLOCK):
    """op(Q) C (side "L") or C op(Q) (side "R"), op(Q) = Q^T if transpose else Q, for batches (batch, ...) of 3-d
    arrays: h (batch, m, n), tau (batch, k), C (batch, m, p) or (batch, p, m). Returns a new array."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    xp = array_module(h)
    m, n = h.shape[-2:]
    out = c.copy()
    order = blocks(m, n, block)
    # Q = B_0 ... B_{q-1}: Q^T C and C Q take the blocks first to last; Q C and C Q^T last to first.
    forward = transpose if side == "L" else not transpose
    for c0, w in (order if forward else order[::-1]):
        v, t = _wy(xp, h, tau, c0, w)
        if side == "L":  # C[c0:] -= V op(T) V^T C[c0:]
            _left(xp, out[:, c0:, :], v, t.transpose(0, 2, 1) if transpose else t)
        else:  # C[:, c0:] -= C[:, c0:] V op(T) V^T, with op(T) = T for C Q and T^T for C Q^T
            part = out[:, :, c0:]
            tt = t.transpose(0, 2, 1) if transpose else t
            _sub_matmul(xp, part, _matmul(xp, _matmul(xp, part, v), tt), v.transpose(0, 2, 1))
    return out


def householder_product(h, tau, complete: bool = False, block: int = BLOCK):
    """Q (batch, m, k) from (h, tau), or (batch, m, m) with complete=True.

    Q = B_0 ... B_{q-1} I, the last block first. Before B_i is applied, the columns left of its first column c0
    are still those of I, zero in B_i's rows, so B_i only changes Q[c0:, c0:] (as LAPACK's sorgqr does)."""
    xp = array_module(h)
    batch, m, n = h.shape
    cols = m if complete else min(m, n)
    q = xp.zeros((batch, m, cols), dtype=h.dtype)
    _set_diagonal(q, 1)
    for c0, w in blocks(m, n, block)[::-1]:
        v, t = _wy(xp, h, tau, c0, w)
        _left(xp, q[:, c0:, c0:], v, t)
    return q


def r_factor(h, complete: bool = False):
    """R from h: (batch, k, n), or (batch, m, n) with complete=True (zero below the diagonal)."""
    xp = array_module(h)
    m, n = h.shape[-2:]
    rows = m if complete else min(m, n)
    return xp.triu(h[:, :rows, :])


def solve_upper(r, y, block: int = 32):
    """x with R x = y for upper-triangular R (batch, n, n) and y (batch, n, p): blocked back substitution, the
    diagonal blocks by columns and the rest as products."""
    xp = array_module(r)
    n = r.shape[-1]
    x = y.copy()
    for hi in range(n, 0, -block):
        lo = max(0, hi - block)
        for j in range(hi - 1, lo - 1, -1):
            x[:, j, :] = x[:, j, :] / r[:, j, j][:, None]
            if j > lo:
                x[:, lo:j, :] -= r[:, lo:j, j][:, :, None] * x[:, j, :][:, None, :]
        if lo:
            x[:, :lo, :] -= _matmul(xp, r[:, :lo, lo:hi], x[:, lo:hi, :])
    return x


def lstsq(h, tau, b, block: int = BLOCK):
    """Least squares min ||A x - b|| for full-rank tall A given its (h, tau): (x, residual). b is (batch, m, p);
    x (batch, n, p); residual (batch, p), the squared norms of the parts of Q^T b that R cannot reach."""
    xp = array_module(h)
    m, n = h.shape[-2:]
    if m < n:
        raise ValueError(f"lstsq needs tall or square matrices (m >= n); got {m}x{n}")
    y = apply_q(h, tau, b, "L", True, block)
    x = solve_upper(xp.triu(h[:, :n, :]), y[:, :n, :])
    residual = (y[:, n:, :] ** 2).sum(axis=1)
    return x, residual
