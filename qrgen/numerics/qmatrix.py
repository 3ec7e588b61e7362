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
BLOCK = 128  # reflectors per block; at most 256 (the T kernel, qrgen/plan/tmat.MAX)
Q_WIDE_BLOCK_FROM = 4096  # householder_product's blocks are 256 wide from this min(m, n) on (q_block)
Q_PRECISIONS = ("fp32", "tf32x3")  # of householder_product's products
GRAM_BATCHED_BELOW = 132  # batches under this (the H200's SM count) get all blocks' V, G and T at once (wy_forms)


# Products on device arrays come from the backend that holds them: qrgen.run.device_ops registers CuPy's (cuBLAS, the
# tf32x3 kernels, the T kernel) under "cupy", each an object with matmul(a, b, subtract_from=None, out=None),
# tf32x3(a, b, c, alpha, beta) -> bool (False: not taken), tmatrix(gram, tau) and t_max() (the most reflectors
# tmatrix takes on the current device).
DEVICE_OPS: dict[str, object] = {}


def device_ops(xp):
    ops = DEVICE_OPS.get(xp.__name__)
    if ops is None:
        raise RuntimeError(f"no device products registered for {xp.__name__} arrays: import qrgen.run.device_ops")
    return ops


def array_module(x):
    """numpy or cupy, by the array's kind."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _matmul(xp, a, b, precision: str = "fp32"):
    """Batched a @ b; on the GPU in float32 through cuBLAS (capturable in a CUDA graph, unlike cupy.matmul), or in
    "tf32x3" through the tf32x3 kernels where they take the product (DEVICE_OPS);
    in NumPy float32 with tf32x3's rounding where asked (reference.product); float64 (the check) as it is."""
    if xp is np or a.dtype != xp.float32:
        from .reference import matmul, product

        if precision == "fp32":
            return matmul(a, b) if xp is np else xp.matmul(a, b)

        return product(a, b, precision)
    if precision == "tf32x3":  # one output, written by the tf32x3 kernels or else cuBLAS
        c = xp.empty((max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2]), dtype=xp.float32)
        _matmul_into(xp, c, a, b, precision)
        return c
    return device_ops(xp).matmul(a, b)


def _cublas_target(xp, c) -> bool:
    """Whether cuBLAS can write c where it lies: a float32 GPU array with row-major last two axes."""
    item = c.itemsize
    return xp is not np and c.dtype == xp.float32 and c.strides[2] == item and c.strides[1] >= c.shape[2] * item


def _sub_matmul(xp, c, a, b, precision: str = "fp32"):
    """c -= a @ b in place (c a view of a larger array is updated where it lies); on the GPU one cuBLAS (or tf32x3)
    call with beta 1 for float32 row-major c, no temporary and no separate subtraction."""
    if not _cublas_target(xp, c):
        c -= _matmul(xp, a, b, precision)
        return
    if precision == "tf32x3" and device_ops(xp).tf32x3(a, b, c, -1.0, 1.0):
        return
    device_ops(xp).matmul(a, b, subtract_from=c)


def _matmul_into(xp, out, a, b, precision: str = "fp32") -> None:
    """out = a @ b, out a view of a larger array written where it lies (on the GPU one cuBLAS or tf32x3 call,
    beta 0)."""
    if not _cublas_target(xp, out):
        out[...] = _matmul(xp, a, b, precision)
        return
    if precision == "tf32x3" and device_ops(xp).tf32x3(a, b, out, 1.0, 0.0):
        return
    device_ops(xp).matmul(a, b, out=out)


def set_diagonal(x, value) -> None:
    """x[:, i, i] = value for i < min of the last two dimensions, through a strided view of the C-contiguous
    (batch, r, c) array x: one fill, where an index array would scatter."""
    batch, r, c = x.shape
    x.reshape(batch, r * c)[:, ::c + 1][:, :min(r, c)] = value


def _tmatrix(xp, gram, tau):
    if xp is np or tau.dtype != xp.float32:
        from .reference import tmatrix

        return tmatrix(gram, tau, xp)
    return device_ops(xp).tmatrix(gram, tau)


def q_block(m: int, n: int) -> int:
    """householder_product's default block width: BLOCK, or 256 from min(m, n) = Q_WIDE_BLOCK_FROM on, where
    wider blocks' fewer passes over Q and deeper second product pay for the larger T (docs/decisions.md#q-block)."""
    return 256 if min(m, n) >= Q_WIDE_BLOCK_FROM else BLOCK


def blocks(m: int, n: int, block: int = BLOCK) -> list[tuple[int, int]]:
    """(first column, width) of each block of reflectors."""
    if not 1 <= block <= 256:
        raise ValueError(f"block must be from 1 to 256 reflectors, got {block}")
    k = min(m, n)
    return [(c0, min(block, k - c0)) for c0 in range(0, k, block)]


def _block_reflectors(xp, h, block: int):
    """V of every block at once, (batch, q, m, block): block i (first column c0) holds its reflectors in its first
    columns over all m rows (unit diagonal at row c0 + j, zero above it), zero columns past the last reflector.
    One elementwise pass over h, where a copy per block costs several launches each."""
    batch, m, n = h.shape
    k = min(m, n)
    q = -(-k // block)
    cols = q * block
    if cols > n:
        src = xp.concatenate([h, xp.zeros((batch, m, cols - n), dtype=h.dtype)], axis=2)
    else:
        src = h[:, :, :cols]
    col = xp.arange(cols).reshape(q, 1, block)
    row = xp.arange(m).reshape(1, m, 1)
    below = (row > col) & (col < k)
    unit = ((row == col) & (col < k)).astype(h.dtype)
    return xp.where(below, src.reshape(batch, m, q, block).transpose(0, 2, 1, 3), unit)


def _wy_block(xp, h, tau, c0: int, w: int):
    """V (batch, m - c0, w) and T (batch, w, w) of the reflectors c0 .. c0 + w - 1."""
    v = xp.tril(h[:, c0:, c0:c0 + w], -1)  # a new C-contiguous array
    set_diagonal(v, 1)
    t = _tmatrix(xp, _matmul(xp, v.transpose(0, 2, 1), v), xp.ascontiguousarray(tau[:, c0:c0 + w]))
    return v, t


def wy_forms(xp, h, tau, block: int, reverse: bool = False):
    """Yields (c0, V, T) of each block of reflectors (first column c0, V (batch, m - c0, w), T (batch, w, w),
    B = I - V T V^T), first to last or last to first.

    A batch smaller than GRAM_BATCHED_BELOW gets every block's V in one pass over h (_block_reflectors), their
    Gram matrices V^T V in one product over all m rows (rows above a block are zero in it) and their T in one
    T-kernel launch: block by block, each product would have batch * (w / 128)^2 output tiles, too few for the
    GPU, and each launch its own latency. A larger batch fills the GPU block by block, where the rows above each
    block stay out of its products and only one block's V is held at a time. Blocks are at most the reflectors
    the device's T kernel takes (its shared memory: fewer on GPUs of 99 KB a block)."""
    if xp is not np:
        block = min(block, device_ops(xp).t_max())
    order = list(enumerate(blocks(h.shape[1], h.shape[2], block)))
    if reverse:
        order.reverse()
    batch = h.shape[0]
    if batch >= GRAM_BATCHED_BELOW:
        for _, (c0, w) in order:
            yield (c0, *_wy_block(xp, h, tau, c0, w))
        return
    v = _block_reflectors(xp, h, block)
    _, q, m, w = v.shape
    flat = v.reshape(batch * q, m, w)
    taus = xp.zeros((batch, q * w), dtype=tau.dtype)
    taus[:, :tau.shape[1]] = tau
    t = _tmatrix(xp, _matmul(xp, flat.transpose(0, 2, 1), flat), taus.reshape(batch * q, w)).reshape(batch, q, w, w)
    for i, (c0, wi) in order:
        yield c0, v[:, i, c0:, :wi], t[:, i, :wi, :wi]


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
    blocks(m, n, block)  # checks block before anything is allocated
    out = c.copy()
    # Q = B_0 ... B_{q-1}: Q^T C and C Q take the blocks first to last; Q C and C Q^T last to first.
    forward = transpose if side == "L" else not transpose
    for c0, vi, ti in wy_forms(xp, h, tau, block, reverse=not forward):
        tt = ti.transpose(0, 2, 1) if transpose else ti
        if side == "L":  # C[c0:] -= V op(T) V^T C[c0:]
            _left(xp, out[:, c0:, :], vi, tt)
        else:  # C[:, c0:] -= C[:, c0:] V op(T) V^T, with op(T) = T for C Q and T^T for C Q^T
            part = out[:, :, c0:]
            _sub_matmul(xp, part, _matmul(xp, _matmul(xp, part, vi), tt), vi.transpose(0, 2, 1))
    return out


def householder_product(h, tau, complete: bool = False, block: int | None = None, precision: str = "fp32"):
    """Q (batch, m, k) from (h, tau), or (batch, m, m) with complete=True, in blocks of `block` reflectors
    (default q_block(m, n)). precision: of the two products a block applies to Q, "fp32" (cuBLAS) or "tf32x3"
    (the tf32x3 kernels where they take a product, else cuBLAS fp32; T and its Gram matrix stay fp32).

    Q = B_0 ... B_{q-1} I, the last block first. Before B_i (first column c0, width w) is applied, the later
    blocks have changed only rows and columns from c0 + w on: the columns left of c0 are still those of I, zero in
    B_i's rows, so B_i only changes P = Q[c0:, c0:] (as LAPACK's sorgqr does); and P = [[I_w, 0], [0, P22]], so
    V^T P = [V1^T, V2^T P22] with V = [V1; V2] split after w rows: the first product's depth and width shrink by w
    (a third of its work at 1024^2 with blocks of 128, half at 512^2)."""
    if precision not in Q_PRECISIONS:
        raise ValueError(f"precision must be one of {Q_PRECISIONS}, got {precision!r}")
    xp = array_module(h)
    batch, m, n = h.shape
    cols = m if complete else min(m, n)
    block = q_block(m, n) if block is None else block
    blocks(m, n, block)  # checks block before anything is allocated
    q = xp.zeros((batch, m, cols), dtype=h.dtype)
    set_diagonal(q, 1)
    for c0, v, t in wy_forms(xp, h, tau, block, reverse=True):
        part, w = q[:, c0:, c0:], v.shape[2]
        vtp = xp.empty((batch, w, part.shape[2]), dtype=h.dtype)
        vtp[:, :, :w] = v[:, :w, :].transpose(0, 2, 1)
        _matmul_into(xp, vtp[:, :, w:], v[:, w:, :].transpose(0, 2, 1), part[:, w:, w:], precision)
        _sub_matmul(xp, part, v, _matmul(xp, t, vtp), precision)
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


def lstsq_shapes(a_shape: tuple, b_shape: tuple) -> bool:
    """Check lstsq's shapes (a (..., m, n) with m >= n, b (..., m) or (..., m, p) with a's leading dimensions);
    returns whether b is a vector per matrix."""
    m, n = a_shape[-2:]
    if m < n:
        raise ValueError(f"lstsq needs m >= n (full-rank tall or square systems); got {m}x{n}")
    vector = len(b_shape) == len(a_shape) - 1
    if (b_shape[:-1] if vector else b_shape[:-2]) != a_shape[:-2] or b_shape[-1 if vector else -2] != m:
        raise ValueError(f"b must have shape {a_shape[:-2] + (m,)} or {a_shape[:-2] + (m, 'p')} for a of shape "
                         f"{a_shape}; got {b_shape}")
    return vector


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
