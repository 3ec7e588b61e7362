"""The Factorizers qrgen.geqrf and the rest make on first use of a shape, kept for the process."""
from __future__ import annotations

import threading

from ..problem import Problem
from ..schedule.files import find
from ..targets import Target
from .factorizer import Factorizer

_FACTORIZERS: dict[tuple, Factorizer] = {}
_FACTORIZERS_LOCK = threading.Lock()


def factorizer_for(m: int, n: int, batch: int, target: Target, precision: str | None = None) -> Factorizer:
    """The process's Factorizer for a shape, batch, target and precision choice (made on first use)."""
    key = (m, n, batch, target, precision)
    with _FACTORIZERS_LOCK:
        fac = _FACTORIZERS.get(key)
        if fac is None:
            schedule, _ = find(Problem(m, n, batch), target, precision=precision)
            fac = Factorizer(m, n, schedule, target)
            _FACTORIZERS[key] = fac
        return fac


def made(m: int, n: int, batch: int, target: Target, precision: str | None = None) -> Factorizer | None:
    """The Factorizer factorizer_for made for these, or None (nothing is made)."""
    return _FACTORIZERS.get((m, n, batch, target, precision))
