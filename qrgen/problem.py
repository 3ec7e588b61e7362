"""What is factored (Problem) and what it is compiled for (Target)."""
from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("float32",)
BACKENDS = ("cuda",)
_ARCH = re.compile(r"^sm_\d{2,3}a?$")


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
    def name(self) -> str:
        return f"{self.m}x{self.n}_b{self.batch}"


@dataclass(frozen=True)
class Target:
    """Where kernels run: a backend and an architecture such as sm_90."""

    backend: str = "cuda"
    arch: str = "sm_90"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"Target.backend must be one of {BACKENDS}, got {self.backend!r}")
        if not _ARCH.match(self.arch):
            raise ValueError(f"Target.arch must look like 'sm_90', got {self.arch!r}")

    @property
    def sm(self) -> int:
        return int(self.arch[3:].rstrip("a"))


def parse_shape(text: str) -> tuple[int, int]:
    """'1024x512' -> (1024, 512), with an error that says what is accepted."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ValueError(f"shape must be MxN with positive integers, such as 1024x1024; got {text!r}")
    return int(match.group(1)), int(match.group(2))
