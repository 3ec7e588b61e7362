"""The engine protocol that run/sequence.py drives, and SkipStages, an engine that leaves stages out.

An engine holds a chunk of `nb` matrices and its work buffers (`sizes`: run/buffers.Sizes; `sms`: the
multiprocessors its side-stream pieces plan for) and carries out:
  zero(name)                                  zero a work buffer
  panel(index, launch, epoch, v, z)           panel `index`'s kernel, its V^T at operand v and (VT)^T at z
  gemm(stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, precision,
       via="cublas", side=False)            C = alpha op(A) op(B) + beta C per matrix (row-major)
  fused(z, zld, zs, v, vld, vs, width, rows, c, nc)   a panel's two products in one launch
  tmat(aggregate, side=False)                 T of an aggregate from G and tau
  scale(phase)                                Schedule.scaled's power-of-two scaling (phase 0 in, 2 out)
  fork(), join(), mark(), wait_mark()         the side stream's ordering against the main stream
Operands are (buffer name, float offset within a matrix); every buffer holds the chunk's matrices at a fixed
stride. The CUDA engine (run/cuda_engine.py) launches kernels; the NumPy engine (run/numpy_engine.py) computes
what each launch computes.
"""
from __future__ import annotations

from typing import Protocol


class Engine(Protocol):
    nb: int
    sms: int
    sizes: object

    def zero(self, name: str) -> None: ...
    def panel(self, index: int, launch, epoch: int, v: tuple, z: tuple) -> None: ...
    def gemm(self, stage: str, *args, **kwargs) -> None: ...
    def fused(self, *args) -> None: ...
    def tmat(self, aggregate, side: bool = False) -> None: ...
    def scale(self, phase: int) -> None: ...
    def fork(self) -> None: ...
    def join(self) -> None: ...
    def mark(self) -> None: ...
    def wait_mark(self) -> None: ...


STAGES = ("panel", "project", "update", "gram", "tmat", "aggregate", "scale", "own")


class SkipStages:
    """An engine that passes every operation to `engine` except those of the stages named in `skip`: for timing
    a factorization by difference (the result is then wrong; the work of the other stages is the same). "own" names
    the panels' own products (drive's products for a panel, in whatever kernels), "project" and "update" every
    product of that kind."""

    def __init__(self, engine, skip):
        unknown = set(skip) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; the stages are {STAGES}")
        self.engine, self.skip = engine, frozenset(skip)
        self.sizes, self.nb, self.sms = engine.sizes, engine.nb, engine.sms

    def zero(self, name):
        self.engine.zero(name)

    def panel(self, index, launch, epoch, v, z):
        if "panel" not in self.skip:
            self.engine.panel(index, launch, epoch, v, z)

    def fork(self):
        self.engine.fork()

    def join(self):
        self.engine.join()

    def mark(self):
        self.engine.mark()

    def wait_mark(self):
        self.engine.wait_mark()

    def tmat(self, agg, side=False):
        if "tmat" not in self.skip:
            self.engine.tmat(agg, side)

    def scale(self, phase):
        if "scale" not in self.skip:
            self.engine.scale(phase)

    def gemm(self, stage, *args, **kwargs):
        if stage not in self.skip:
            self.engine.gemm(stage, *args, **kwargs)

    def fused(self, *args):
        if not {"project", "update"} & self.skip:
            self.engine.fused(*args)

    def apply(self, *args):
        """True (nothing run) where the products are skipped, else the engine's answer."""
        return bool({"project", "update"} & self.skip) or self.engine.apply(*args)
