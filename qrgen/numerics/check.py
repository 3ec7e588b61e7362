"""Accuracy of a factorization, per matrix, in float64: the gates every qrgen result must pass."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .qmatrix import array_module

EPS32 = float(np.finfo(np.float32).eps)
FACTOR_GATE = 20.0
ORTHOGONALITY_GATE = 100.0


@dataclass(frozen=True)
class CheckResult:
    factor: np.ndarray  # ||R - Q^T A||_1 / (||A||_1 n eps32), per matrix
    orthogonality: np.ndarray  # ||Q^T Q - I||_1 / (n eps32), per matrix
    factor_gate: float = FACTOR_GATE
    orthogonality_gate: float = ORTHOGONALITY_GATE

    @property
    def passed(self) -> np.ndarray:
        # NaN fails: the comparisons are written so that NaN is never <= a gate.
        return (self.factor <= self.factor_gate) & (self.orthogonality <= self.orthogonality_gate)

    @property
    def ok(self) -> bool:
        return bool(np.all(self.passed))

    def worst(self) -> tuple[float, float]:
        return float(np.max(self.factor, initial=0.0)), float(np.max(self.orthogonality, initial=0.0))

    def __str__(self) -> str:
        f, o = self.worst()
        bad = int(np.size(self.passed) - np.count_nonzero(self.passed))
        return (f"factor {f:.3g} (gate {self.factor_gate:g}), orthogonality {o:.3g} "
                f"(gate {self.orthogonality_gate:g}): {'pass' if self.ok else f'{bad} matrices fail'}")


def to_numpy(x) -> np.ndarray:
    """A host copy of a NumPy, CuPy or torch array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        return x.get()
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def check(a, h, tau, factor_gate: float = FACTOR_GATE, orthogonality_gate: float = ORTHOGONALITY_GATE,
          device: str = "auto") -> CheckResult:
    """Scaled factor residual and orthogonality of (h, tau) as the geqrf of a, per matrix, in float64.

    a, h: (..., m, n); tau: (..., min(m, n)); NumPy, CuPy or torch arrays. device "cpu": LAPACK on the host
    (dormqr, dorgqr); "gpu": the same products in float64 on the GPU (qrgen.qmatrix's blocked Q on CuPy arrays,
    tens of times faster for large matrices); "auto": the GPU where h is a CuPy array.
    """
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if device == "gpu" or (device == "auto" and array_module(h) is not np):
        import cupy

        a64, h64, t64 = (cupy.asarray(to_numpy(x) if type(x).__module__.startswith("torch") else x,
                                      dtype=cupy.float64) for x in (a, h, tau))
        factor, orth = residuals(cupy, a64, h64, t64)
        return CheckResult(cupy.asnumpy(factor), cupy.asnumpy(orth), factor_gate, orthogonality_gate)
    from scipy.linalg import lapack

    a64 = to_numpy(a).astype(np.float64)
    h64 = to_numpy(h).astype(np.float64)
    t64 = to_numpy(tau).astype(np.float64)
    if a64.shape != h64.shape or a64.ndim < 2:
        raise ValueError(f"a and h must have the same shape (..., m, n); got {a64.shape} and {h64.shape}")
    m, n = a64.shape[-2:]
    k = min(m, n)
    if t64.shape != a64.shape[:-2] + (k,):
        raise ValueError(f"tau must have shape {a64.shape[:-2] + (k,)}; got {t64.shape}")
    a64 = a64.reshape(-1, m, n)
    h64 = h64.reshape(-1, m, n)
    t64 = t64.reshape(-1, k)
    batch = a64.shape[0]
    factor = np.zeros(batch)
    orth = np.zeros(batch)
    for i in range(batch):
        if k == 0:
            continue
        if not (np.all(np.isfinite(h64[i])) and np.all(np.isfinite(t64[i]))):
            factor[i] = orth[i] = np.nan
            continue
        v = np.asfortranarray(h64[i][:, :k])
        qta, _, info = lapack.dormqr("L", "T", v, t64[i], np.asfortranarray(a64[i]), max(1, n) * 64)
        assert info == 0
        r = np.triu(h64[i])
        norm_a = np.abs(a64[i]).sum(axis=0).max()
        diff = np.abs(r - qta).sum(axis=0).max()
        with np.errstate(over="ignore"):  # a zero matrix with a wrong factorization: an infinite factor, failed
            factor[i] = diff / (max(norm_a, np.finfo(np.float64).tiny) * n * EPS32)
        q, _, info = lapack.dorgqr(v, t64[i], max(1, k) * 64)
        assert info == 0
        orth[i] = np.abs(q.T @ q - np.eye(k)).sum(axis=0).max() / (n * EPS32)
    lead = to_numpy(a).shape[:-2]
    return CheckResult(factor.reshape(lead), orth.reshape(lead), factor_gate, orthogonality_gate)


def residuals(xp, a64, h64, t64):
    """(factor, orthogonality) per matrix for float64 arrays of the array module xp (NumPy or CuPy), batched:
    Q^T A by the blocked compact WY form (qrgen.qmatrix.apply_q) against R, and Q (reduced) by
    householder_product; a matrix whose h or tau is not finite gets NaN (its neighbours are computed apart)."""
    from .qmatrix import apply_q, householder_product

    if a64.shape != h64.shape or a64.ndim < 2:
        raise ValueError(f"a and h must have the same shape (..., m, n); got {a64.shape} and {h64.shape}")
    m, n = a64.shape[-2:]
    k = min(m, n)
    lead = a64.shape[:-2]
    if t64.shape != lead + (k,):
        raise ValueError(f"tau must have shape {lead + (k,)}; got {t64.shape}")
    a64, h64, t64 = a64.reshape(-1, m, n), h64.reshape(-1, m, n), t64.reshape(-1, k)
    batch = a64.shape[0]
    if k == 0 or batch == 0:
        return xp.zeros(lead), xp.zeros(lead)
    bad = ~(xp.isfinite(h64).all(axis=(1, 2)) & xp.isfinite(t64).all(axis=1))
    h64 = xp.where(bad[:, None, None], 0.0, h64)  # computed as zero, reported as NaN
    t64 = xp.where(bad[:, None], 0.0, t64)
    qta = apply_q(h64, t64, a64, "L", True)
    norm_a = xp.abs(a64).sum(axis=1).max(axis=1)
    diff = xp.abs(xp.triu(h64) - qta).sum(axis=1).max(axis=1)
    factor = diff / (xp.maximum(norm_a, np.finfo(np.float64).tiny) * n * EPS32)
    q = householder_product(h64, t64)
    gram = xp.matmul(q.transpose(0, 2, 1), q) - xp.eye(k)[None]
    orth = xp.abs(gram).sum(axis=1).max(axis=1) / (n * EPS32)
    factor = xp.where(bad, np.nan, factor)
    orth = xp.where(bad, np.nan, orth)
    return factor.reshape(lead), orth.reshape(lead)
