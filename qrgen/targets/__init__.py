"""Where kernels run: a Target names a backend and an architecture; its Backend record holds what differs.

A backend record says how to parse its architectures, each architecture's limits and features, where its templates
live, its source suffix, and (by module path, imported on use) how it compiles, which engine runs a plan and how
arrays come in. Everything that would otherwise be an `if arch == ...` reads a Target.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import cpu, cuda, metal
from .records import (ASYNC_COPY, CLUSTERS, COOPERATIVE, FEATURES, MBARRIER, SIMDGROUP_BFLOAT,  # noqa: F401
                      SIMDGROUP_MATRIX, TF32_MMA, Arch, Backend, Limits)


BACKENDS = {b.name: b for b in (cuda.BACKEND, cpu.BACKEND, metal.BACKEND)}


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"Target.backend must be one of {tuple(BACKENDS)}, got {name!r}")
    return BACKENDS[name]


@dataclass(frozen=True)
class Target:
    """Where kernels run: a backend and one of its architectures (CUDA: 'sm_90'; Metal: 'apple9'; the CPU backend: 'numpy').

    ptx: the kernels are compiled to PTX for `arch` and the driver compiles that for the device: a GPU newer than
    qrgen or the installed NVRTC knows runs the newest architecture both know, with that architecture's limits."""

    backend: str = "cuda"
    arch: str = "sm_90"
    ptx: bool = False

    def __post_init__(self):
        backend(self.backend).arch(self.arch)

    @property
    def record(self) -> Backend:
        return backend(self.backend)

    @property
    def limits(self) -> Limits:
        return self.record.arch(self.arch).limits

    @property
    def features(self) -> frozenset:
        return self.record.arch(self.arch).features

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def sm(self) -> int:
        """A CUDA arch's number (90 for sm_90); 0 on other backends."""
        return int(self.arch[3:].rstrip("a")) if self.arch.startswith("sm_") else 0

    @classmethod
    def parse(cls, text: str) -> "Target":
        """'sm_90' -> Target('cuda', 'sm_90'); 'apple9' -> Target('metal', 'apple9'); 'cpu' or 'numpy' -> the CPU
        backend; 'cuda:sm_80' and the like."""
        if ":" in text:
            name, arch = text.split(":", 1)
            return cls(name, arch)
        if text in ("cpu", "numpy"):
            return cls("cpu", "numpy")
        if text.startswith("apple"):
            return cls("metal", text)
        return cls("cuda", text)
