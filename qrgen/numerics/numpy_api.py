"""NumPy entry points: geqrf, qr, householder_product, ormqr and lstsq on host arrays, by the generated kernels'
blocked algorithm (numerics/reference.py) and Q from numerics/qmatrix.py, in float64 by default."""
from __future__ import annotations

import numpy as np

from . import qmatrix
from .reference import geqrf


def householder_product(h, tau, complete: bool = False) -> np.ndarray:
    """Q of (h, tau): (..., m, min(m, n)), or (..., m, m) with complete=True."""
    h, tau = np.asarray(h), np.asarray(tau)
    m, n = h.shape[-2:]
    q = qmatrix.householder_product(h.reshape(-1, m, n), tau.reshape(-1, tau.shape[-1]), complete)
    return q.reshape(*h.shape[:-2], m, q.shape[-1])


def ormqr(h, tau, c, side: str = "L", transpose: bool = False) -> np.ndarray:
    """op(Q) C or C op(Q) without forming Q."""
    h, tau, c = np.asarray(h), np.asarray(tau), np.asarray(c)
    m, n = h.shape[-2:]
    out = qmatrix.apply_q(h.reshape(-1, m, n), tau.reshape(-1, tau.shape[-1]), c.reshape(-1, *c.shape[-2:]),
                          side, transpose)
    return out.reshape(c.shape)


def qr(a, mode: str = "reduced", dtype=np.float64):
    """numpy.linalg.qr's modes through this module's geqrf and qrgen.qmatrix (see qrgen.qr)."""
    a = np.asarray(a)
    h, tau = geqrf(a, dtype=dtype)
    m, n = a.shape[-2:]
    if mode == "raw":
        return h.swapaxes(-1, -2), tau
    h3 = h.reshape(-1, m, n)
    r = qmatrix.r_factor(h3, complete=mode == "complete").reshape(*a.shape[:-2], -1, n)
    if mode == "r":
        return r
    q = qmatrix.householder_product(h3, tau.reshape(h3.shape[0], -1), mode == "complete")
    return q.reshape(*a.shape[:-2], m, q.shape[-1]), r


def lstsq(a, b, dtype=np.float64):
    """(x, residual) of min ||a x - b|| for full-rank tall a; b (..., m) or (..., m, p)."""
    a, b = np.asarray(a), np.asarray(b)
    m, n = a.shape[-2:]
    vector = b.ndim == a.ndim - 1
    h, tau = geqrf(a, dtype=dtype)
    rhs = b.reshape(-1, m, 1) if vector else b.reshape(-1, m, b.shape[-1])
    x, res = qmatrix.lstsq(h.reshape(-1, m, n), tau.reshape(-1, tau.shape[-1]), rhs.astype(dtype))
    lead = a.shape[:-2]
    return (x.reshape(*lead, n), res.reshape(lead)) if vector else (x.reshape(*lead, n, -1), res.reshape(*lead, -1))
