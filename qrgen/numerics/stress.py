"""Stress matrices for testing batched QR factorizations on hostile inputs.

``stress(family, m, n, batch, seed)`` returns a float32 array of shape
``(batch, m, n)`` whose matrices all belong to one family; ``mixed(m, n,
batch, seed)`` returns a batch mixing every family at shuffled positions,
with the family name of each matrix.

Everything is drawn from ``np.random.default_rng(seed)``, so equal seeds give
equal data, and every matrix of a batch is a fresh draw.  Generation stays in
float32 (only the per-row or per-column scale vectors are computed in
float64) so that large batches, e.g. 640 x 512 x 512, need no float64 copy.
Every family handles m = 1, n = 1 and tall or wide shapes.
"""
from __future__ import annotations

import numpy as np

__all__ = ["FAMILIES", "stress", "mixed"]

_F32 = np.float32


def _normal(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.standard_normal(shape, dtype=_F32)


def _random(rng, b, m, n):
    """Well-conditioned random matrix: standard normal entries."""
    return _normal(rng, (b, m, n))


def _colscaled(rng, b, m, n):
    """Random, column j scaled by 1e-4 ** (j / (n-1)): scales 1 ... 1e-4."""
    a = _normal(rng, (b, m, n))
    a *= (1e-4 ** (np.arange(n) / max(1, n - 1))).astype(_F32)
    return a


def _rankdef(rng, b, m, n):
    """Exactly rank-deficient: random with the last n//4 columns (at least
    one when n >= 2) set to zero."""
    a = _normal(rng, (b, m, n))
    k = max(1, n // 4) if n >= 2 else 0
    a[:, :, n - k:] = 0
    return a


def _nearrankdef(rng, b, m, n):
    """Nearly rank-deficient: column j copies column j % max(1, n//2) of a
    random matrix, plus 1e-5 * standard normal noise."""
    p = max(1, n // 2)
    base = _normal(rng, (b, m, p))
    a = _normal(rng, (b, m, n))
    a *= 1e-5
    for s in range(0, n, p):  # columns repeat in blocks of p
        w = min(p, n - s)
        a[:, :, s:s + w] += base[:, :, :w]
    return a


def _normspread(rng, b, m, n):
    """Column norms spread over 1e7: column j scaled by
    10 ** (7 j / (n-1) - 3.5), except every 5th column (j % 5 == 4), which
    is scaled by 1.2e-7 (about float32 eps)."""
    j = np.arange(n)
    scale = 10.0 ** (7.0 * j / max(1, n - 1) - 3.5)
    scale[j % 5 == 4] = 1.2e-7
    a = _normal(rng, (b, m, n))
    a *= scale.astype(_F32)
    return a


def _upper(rng, b, m, n):
    """Upper triangular: random above and on the diagonal, zero below."""
    a = _normal(rng, (b, m, n))
    a[:, np.tri(m, n, -1, dtype=bool)] = 0
    return a


def _banded(rng, b, m, n):
    """Banded: random entries where |i - j| <= 2, zero elsewhere."""
    a = _normal(rng, (b, m, n))
    i, j = np.indices((m, n))
    a[:, np.abs(i - j) > 2] = 0
    return a


def _rowscaled(rng, b, m, n):
    """Random, row i scaled by 1e-4 ** (i / (m-1)): scales 1 ... 1e-4."""
    a = _normal(rng, (b, m, n))
    a *= (1e-4 ** (np.arange(m) / max(1, m - 1))).astype(_F32)[:, None]
    return a


def _collinear(rng, b, m, n):
    """Nearly collinear columns: column j = u + 1e-3 * r_j, with u a random
    vector shared by all columns of a matrix and r_j random."""
    u = _normal(rng, (b, m, 1))
    a = _normal(rng, (b, m, n))
    a *= 1e-3
    a += u
    return a


def _zero(rng, b, m, n):
    """All-zero matrix."""
    return np.zeros((b, m, n), dtype=_F32)


_GENERATORS = {
    "random": _random,
    "colscaled": _colscaled,
    "rankdef": _rankdef,
    "nearrankdef": _nearrankdef,
    "normspread": _normspread,
    "upper": _upper,
    "banded": _banded,
    "rowscaled": _rowscaled,
    "collinear": _collinear,
    "zero": _zero,
}

FAMILIES: tuple[str, ...] = tuple(_GENERATORS)


def _check_size(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _check_family(family) -> str:
    if not isinstance(family, str) or family not in _GENERATORS:
        raise ValueError(
            f"unknown stress family {family!r}; expected one of {', '.join(FAMILIES)}")
    return family


def stress(family: str, m: int, n: int, batch: int = 1, seed: int = 0) -> np.ndarray:
    """A float32, C-contiguous array (batch, m, n) of matrices of one family.

    Raises ValueError for an unknown family or for m, n, batch not ints >= 1.
    """
    family = _check_family(family)
    m, n, batch = _check_size("m", m), _check_size("n", n), _check_size("batch", batch)
    rng = np.random.default_rng(seed)
    return np.ascontiguousarray(_GENERATORS[family](rng, batch, m, n), dtype=_F32)


def mixed(m: int, n: int, batch: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """A float32 batch (batch, m, n) mixing all families at random positions.

    Returns the array and the family name of each matrix.  When
    batch >= len(FAMILIES) every family appears at least once.
    """
    m, n, batch = _check_size("m", m), _check_size("n", n), _check_size("batch", batch)
    rng = np.random.default_rng(seed)
    k = len(FAMILIES)
    picks = np.arange(k) if batch >= k else np.empty(0, dtype=np.int64)
    picks = np.concatenate([picks, rng.integers(0, k, size=batch - len(picks))])
    rng.shuffle(picks)
    out = np.empty((batch, m, n), dtype=_F32)
    for f, name in enumerate(FAMILIES):
        where = np.flatnonzero(picks == f)
        if len(where):
            out[where] = _GENERATORS[name](rng, len(where), m, n)
    return out, [FAMILIES[f] for f in picks]
