"""Test helpers shared by the layers (tests/ is on sys.path through conftest.py): the issue's float64 Q checks."""
import numpy as np

from qrgen.numerics.check import EPS32


def q_gates(a, q, r):
    """The issue's Q checks per matrix, in float64: (factor residual, orthogonality), each in units of n eps32
    (the gates: factor <= 20, orthogonality <= 100)."""
    n = a.shape[-1]
    a64, q64, r64 = (x.astype(np.float64) for x in (a, q, r))
    eye = np.eye(q.shape[-1])
    orth = np.abs(np.swapaxes(q64, -1, -2) @ q64 - eye).sum(axis=-2).max(axis=-1) / (n * EPS32)
    norm_a = np.maximum(np.abs(a64).sum(axis=-2).max(axis=-1), np.finfo(np.float64).tiny)
    factor = np.abs(a64 - q64 @ r64).sum(axis=-2).max(axis=-1) / (norm_a * n * EPS32)
    return factor, orth
