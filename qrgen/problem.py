"""What is factored: a batch of matrices of one shape (Problem), and the one syntax for shapes and cases."""
from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("float32",)


@dataclass(frozen=True)
class Problem:
    """A batch of `batch` row-major m x n matrices of `dtype`."""

    m: int
    n: int
    batch: int = 1
    dtype: str = "float32"

    def __post_init__(self):
        for field in ("m", "n", "batch"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Problem.{field} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Problem.dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def k(self) -> int:
        """Number of Householder reflectors, min(m, n)."""
        return min(self.m, self.n)

    @property
    def flops(self) -> float:
        """Floating-point operations of the batch's Householder QR: 2 m n² - 2 n³ / 3 a matrix (m and n swapped where
        m < n)."""
        big, k = max(self.m, self.n), self.k
        return self.batch * (2.0 * big * k * k - 2.0 * k ** 3 / 3)

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}_b{self.batch}"


def parse_shape(text: str) -> tuple[int, int]:
    """'1024x512' -> (1024, 512), with an error that says what is accepted."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ValueError(f"shape must be MxN with positive integers, such as 1024x1024; got {text!r}")
    return int(match.group(1)), int(match.group(2))


def parse_case(text: str) -> tuple[int, int, int]:
    """'60x1024x1024' -> (batch, m, n) = (60, 1024, 1024): the one case syntax of the CLI and the tools."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or min(int(g) for g in match.groups()) < 1:
        raise ValueError(f"a case must be BATCHxMxN with positive integers, such as 60x1024x1024; got {text!r}")
    return tuple(int(g) for g in match.groups())
