"""NumPy entry points: geqrf, qr, householder_product, ormqr and lstsq on host arrays, by the generated kernels'
blocked algorithm (numerics/reference.py) and Q from numerics/qmatrix.py. As NumPy's: float32 in gives float32 out
(computed as the kernels round), float64 and integers give float64; empty dimensions give empty results; complex
input is refused until it is supported."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import qmatrix
from .reference import geqrf as _blocked_geqrf

MODES = ("reduced", "complete", "r", "raw")
MODE_ALIASES = {"full": "complete", "economic": "reduced"}  # scipy.linalg.qr's names


class QRResult(NamedTuple):
    Q: np.ndarray
    R: np.ndarray


class GeqrfResult(NamedTuple):
    h: np.ndarray
    tau: np.ndarray


class LstsqResult(NamedTuple):
    solution: np.ndarray
    residual: np.ndarray


def _real(name: str, x, dtype=None) -> tuple[np.ndarray, np.dtype]:
    """x as an array, and the dtype results take (float32 for float32, else float64; or `dtype`)."""
    x = np.asarray(x)
    if np.iscomplexobj(x):
        raise TypeError(f"{name} is complex ({x.dtype}); qrgen factors real matrices (float32, float64)")
    if x.dtype.kind not in "fiub":
        raise TypeError(f"{name} must be a real numeric array; got dtype {x.dtype}")
    if x.ndim < 2 and name in ("a", "h"):
        raise ValueError(f"{name} must have shape (..., m, n); got shape {x.shape}")
    out = np.dtype(dtype) if dtype is not None else np.dtype(np.float32 if x.dtype == np.float32 else np.float64)
    return x, out


def _mode(mode: str) -> str:
    mode = MODE_ALIASES.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (or scipy's {tuple(MODE_ALIASES)}), got {mode!r}")
    return mode


def _identity(lead: tuple, m: int, cols: int, dtype) -> np.ndarray:
    return np.broadcast_to(np.eye(m, cols, dtype=dtype), lead + (m, cols)).copy()


def _batch(x: np.ndarray) -> int:
    return math.prod(x.shape[:-2])


def geqrf(a, dtype=None) -> GeqrfResult:
    """(h, tau) of a (..., m, n) in LAPACK's convention."""
    a, dtype = _real("a", a, dtype)
    return GeqrfResult(*_blocked_geqrf(a, dtype=dtype))


def householder_product(h, tau, complete: bool = False) -> np.ndarray:
    """Q of (h, tau): (..., m, min(m, n)), or (..., m, m) with complete=True."""
    h, dtype = _real("h", h)
    tau = np.asarray(tau, dtype=dtype)
    m, n = h.shape[-2:]
    cols = m if complete else min(m, n)
    if h.size == 0:  # no reflectors: the identity's columns
        return _identity(h.shape[:-2], m, cols, dtype)
    q = qmatrix.householder_product(h.astype(dtype).reshape(_batch(h), m, n), tau.reshape(_batch(h), -1), complete)
    return q.reshape(*h.shape[:-2], m, q.shape[-1])


def ormqr(h, tau, c, side: str = "L", transpose: bool = False, *, left: bool | None = None) -> np.ndarray:
    """op(Q) C (side "L") or C op(Q) (side "R") without forming Q; `left` as torch.ormqr takes it (True: "L")."""
    side = side if left is None else ("L" if left else "R")
    if side not in qmatrix.SIDES:
        raise ValueError(f"side must be one of {qmatrix.SIDES}, got {side!r}")
    h, dtype = _real("h", h)
    tau, c = np.asarray(tau, dtype=dtype), np.asarray(c, dtype=dtype)
    m, n = h.shape[-2:]
    if c.size == 0 or h.size == 0:
        return c.copy()
    out = qmatrix.apply_q(h.astype(dtype).reshape(_batch(h), m, n), tau.reshape(_batch(h), -1),
                          c.reshape(_batch(c), *c.shape[-2:]), side, transpose)
    return out.reshape(c.shape)


def qr(a, mode: str = "reduced", dtype=None):
    """numpy.linalg.qr's modes, batched: QRResult(Q, R) for "reduced" and "complete", R for "r", (h, tau) with h
    transposed for "raw" (see qrgen.qr)."""
    mode = _mode(mode)
    a, dtype = _real("a", a, dtype)
    h, tau = _blocked_geqrf(a, dtype=dtype)
    m, n = a.shape[-2:]
    lead, k = a.shape[:-2], min(m, n)
    if mode == "raw":
        return h.swapaxes(-1, -2), tau
    rows = m if mode == "complete" else k
    if h.size == 0:
        r = np.zeros(lead + (rows, n), dtype)
        return r if mode == "r" else QRResult(_identity(lead, m, rows, dtype), r)
    h3 = h.reshape(_batch(a), m, n)
    r = qmatrix.r_factor(h3, complete=mode == "complete").reshape(*lead, -1, n)
    if mode == "r":
        return r
    q = qmatrix.householder_product(h3, tau.reshape(h3.shape[0], -1), mode == "complete")
    return QRResult(q.reshape(*lead, m, q.shape[-1]), r)


def lstsq(a, b, dtype=None) -> LstsqResult:
    """LstsqResult(solution, residual) of min ||a x - b|| for full-rank tall (or square) a (..., m, n), b (..., m)
    or (..., m, p); residual: the squared norm of a x - b per right-hand side. A rank-deficient matrix (a diagonal
    entry of R below max(m, n) eps times the largest) is a ValueError: QR without pivoting has no least-squares
    solution to give there (numpy.linalg.lstsq's minimum-norm one needs an SVD)."""
    a, dtype = _real("a", a, dtype)
    b = np.asarray(b)
    if np.iscomplexobj(b):
        raise TypeError(f"b is complex ({b.dtype}); qrgen solves real systems")
    vector = qmatrix.lstsq_shapes(a.shape, b.shape)
    m, n = a.shape[-2:]
    lead, p = a.shape[:-2], 1 if vector else b.shape[-1]
    if a.size == 0 or b.size == 0:
        x = np.zeros(lead + ((n,) if vector else (n, p)), dtype)
        residual = (np.asarray(b, dtype) ** 2).sum(axis=-1 if vector else -2)
        return LstsqResult(x, residual)
    h, tau = _blocked_geqrf(a, dtype=dtype)
    h3 = h.reshape(_batch(a), m, n)
    diag = np.abs(np.diagonal(h3, axis1=1, axis2=2))
    tol = max(m, n) * np.finfo(dtype).eps * diag.max(axis=1, initial=0.0)
    rank = (diag > tol[:, None]).sum(axis=1)
    if (rank < n).any():
        first = int(np.argmax(rank < n))
        raise ValueError(f"lstsq: matrix {first} of the batch is rank-deficient (rank {int(rank[first])} < n = {n}); "
                         f"QR without pivoting has no least-squares solution to give: use numpy.linalg.lstsq")
    rhs = np.asarray(b, dtype).reshape(-1, m, 1) if vector else np.asarray(b, dtype).reshape(-1, m, p)
    x, res = qmatrix.lstsq(h3, tau.reshape(h3.shape[0], -1), rhs)
    if vector:
        return LstsqResult(x.reshape(*lead, n), res.reshape(lead))
    return LstsqResult(x.reshape(*lead, n, -1), res.reshape(*lead, -1))
