"""Evaluators of a schedule: the cost model with the NumPy reference's accuracy (no GPU), and the GPU (compile,
time CUDA-graph replays, check every stress family against the gates with margin)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..problem import Problem
from ..schedule.model import Schedule
from ..targets import Target
from .space import DEFAULT_PARAMS, precision_params, schedule_from_params

TUNE_FACTOR_GATE = 10.0


TUNE_ORTHOGONALITY_GATE = 50.0


class TrialFailed(Exception):
    """A trial that produced no usable result; its message is the recorded reason."""


@dataclass(frozen=True)
class Outcome:
    time_us: float
    factor: float
    orthogonality: float

    @property
    def accurate(self) -> bool:
        return self.factor <= TUNE_FACTOR_GATE and self.orthogonality <= TUNE_ORTHOGONALITY_GATE


class ModelEvaluator:
    """No GPU: time from the cost model; accuracy from the NumPy reference in float32, with the schedule's rounding,
    on one matrix of every stress family at the shape. Shapes past `proxy` rows or columns are judged on a proxy
    of at most proxy x proxy built from the same parameters; the gates scale with n, so a proxy is stricter than
    the real shape for the lower precisions (2048 and 4096 are judged at 1024)."""

    name = "cost model (no GPU)"

    def __init__(self, problem: Problem, proxy: int = 1024, batch: int = 1):
        self.problem = problem
        self.proxy = Problem(min(problem.m, proxy), min(problem.n, proxy), batch)
        self.batch = batch
        self._accuracy: dict[tuple, tuple[float, float]] = {}

    def __call__(self, schedule: Schedule, params: dict) -> Outcome:
        from .costmodel import estimate

        time_us = estimate(schedule, self.problem).total_us
        factor, orth = self.accuracy(schedule, params)
        return Outcome(time_us, factor, orth)

    def accuracy(self, schedule: Schedule, params: dict) -> tuple[float, float]:
        from ..numerics import reference
        from ..numerics.check import check
        from ..numerics.stress import FAMILIES, stress

        if (self.proxy.m, self.proxy.n) == (self.problem.m, self.problem.n):
            proxy_schedule = schedule
        else:
            try:
                proxy_schedule = schedule_from_params(self.proxy, params)
            except (ValueError, KeyError):  # the proxy cannot take these panels (or the point is stale): judge the
                # precision on default panels
                proxy_schedule = schedule_from_params(self.proxy, {**DEFAULT_PARAMS, **precision_params(params)})
        key = (proxy_schedule.panels, proxy_schedule.precision)
        if key not in self._accuracy:
            worst_f = worst_o = 0.0
            for i, family in enumerate(FAMILIES):
                a = stress(family, self.proxy.m, self.proxy.n, self.batch, seed=i)
                h, tau = reference.geqrf(a, proxy_schedule, dtype=np.float32)
                f, o = check(a, h, tau).worst()
                worst_f, worst_o = max(worst_f, f), max(worst_o, o)
            self._accuracy[key] = (worst_f, worst_o)
        return self._accuracy[key]


class GPUEvaluator:
    """On the GPU: the schedule's kernels compiled (cached), timed on random batches (events, L2 flushed, median)
    as CUDA-graph replays, so that the host's per-call cost (tens of µs of Python, the same for every schedule)
    does not drown the differences between small schedules, and the gates checked on a batch of every stress
    family. Where a call cannot be captured the eager call is timed instead."""

    def __init__(self, problem: Problem, target: Target, reps: int = 10):
        import cupy

        self.problem, self.target, self.reps = problem, target, reps
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        rng = np.random.default_rng(0)
        shape = (problem.batch, problem.m, problem.n)
        self.inputs = [cupy.asarray(rng.standard_normal(shape, dtype=np.float32)) for _ in range(2)]
        self._hostile = None  # the gates' batch of every stress family, on the GPU once made
        self._accuracy: dict[Schedule, tuple[float, float]] = {}  # checked once per schedule (the final round times
        # its candidates again, not their results)
        self._compiling: dict = {}  # schedule -> Future of its kernels' compilation (prepare)
        self._pool = None

    def prepare(self, schedules: list) -> None:
        """Compile the kernels of trials to come in the background (into the disk cache) while the GPU measures
        the current one."""
        from concurrent.futures import ThreadPoolExecutor

        from ..compile.nvrtc import compile_many
        from ..render.sources import render_all

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qrgen-tune-compile")
        for schedule in schedules:
            if schedule not in self._compiling:
                self._compiling[schedule] = self._pool.submit(
                    lambda sch: compile_many([(r.name, r.source) for r in render_all(sch, self.target)],
                                             self.target), schedule)

    def __call__(self, schedule: Schedule, params: dict) -> Outcome:
        import cupy

        from ..bench import graph_time_us, median_time_us
        from ..numerics.check import check
        from ..numerics.stress import mixed
        from ..run.factorizer import Factorizer

        fac = Factorizer(self.problem.m, self.problem.n, schedule, self.target)
        try:
            pending = self._compiling.pop(schedule, None)
            if pending is not None:
                pending.result()  # its errors are this trial's
            fac.build()
        except RuntimeError as exc:
            raise TrialFailed(f"compile error: {str(exc)[:300]}") from None
        try:
            stream = cupy.cuda.get_current_stream()
            try:
                time_us = graph_time_us(fac, self.inputs, self.reps)
            except cupy.cuda.runtime.CUDARuntimeError:
                raise
            except Exception:  # not capturable: the eager call
                time_us = median_time_us(lambda x: fac.run(x, stream), self.inputs, self.reps, warmup=2)
            if schedule not in self._accuracy:
                if self._hostile is None:  # made once per study: NumPy takes seconds for large matrices
                    a, _ = mixed(self.problem.m, self.problem.n, max(10, min(self.problem.batch, 32)), seed=1)
                    self._hostile = cupy.asarray(a)
                h, tau = fac.run(self._hostile, stream)
                self._accuracy[schedule] = check(self._hostile, h, tau).worst()  # float64 on the GPU
            f, o = self._accuracy[schedule]
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise TrialFailed(f"launch failure: {exc}") from None
        return Outcome(time_us, f, o)


def default_evaluator(problem: Problem, target: Target):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return GPUEvaluator(problem, target)
    except Exception:  # no driver or no device: search over the cost model
        pass
    return ModelEvaluator(problem)
