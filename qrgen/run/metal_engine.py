"""The Metal backend's engine: the launch sequence (run/sequence.drive, drive_q) over the Metal kernels of a
schedule's plan (plan/msl.py), dispatched on a device that runs MSL: the Mac's GPU (run/metal_mac.py) or, where
there is none, a translation layer (run/msl_devices.py: the CPU, or CUDA). Every product runs through the Metal
GEMM kernels, with the inputs the sequence names where Metal has them (fp16, bf16), else fp32 (plan/msl.gemm_input);
schedules with fp16 inputs scale each matrix by a power of two first and R back after (the scale kernel).
Dispatches run in order on one queue, so the side-lane operations (fork, join, marks) need nothing."""
from __future__ import annotations

import numpy as np

from ..numerics import qmatrix
from ..plan import msl
from ..plan.planner import plan
from ..plan.tsqr import tsqr_phases
from ..render.sources import render
from ..schedule.files import find
from ..targets import Target
from ..problem import Problem
from .buffers import Sizes, buffer_names
from .sequence import drive, drive_q

APPLE = Target("metal", "apple9")


class MetalFactorizer:
    """A schedule's plan for a Metal target, its kernels loaded on a device (what drive() reads, and the kernels)."""

    def __init__(self, schedule, device, target: Target = APPLE, keep: bool = False, sources: dict | None = None):
        if target.backend != "metal":
            raise ValueError(f"the Metal engine takes a Metal target, got {target.backend} {target.arch}")
        self.m, self.n, self.k = schedule.m, schedule.n, min(schedule.m, schedule.n)
        self.schedule, self.keep, self.device, self.target = schedule, keep, device, target
        self.plan = plan(schedule, target, keep)
        self.launches, self.aggregates, self.kept = self.plan.launches, self.plan.aggregates, self.plan.kept
        sources = sources or {}  # a generated module's, by kernel name; the rest rendered here
        self.kernels = {k.name: device.load(k.name, sources.get(k.name) or render(k, schedule, target).source)
                        for k in self.plan.kernels}


class MetalEngine:
    def __init__(self, fac: MetalFactorizer, h, tau, nb: int):
        self.fac, self.device, self.nb = fac, fac.device, nb
        self.sizes = Sizes.of(fac)
        self.sms = 1  # no side lane
        self.buffers = {"h": h, "tau": tau}
        for name in buffer_names(fac) + ("tmat",):
            self.buffers[name] = self.device.empty(nb * self.sizes.floats(name))
        if fac.schedule.scaled:
            self.buffers["exps"] = self.device.empty(nb, np.int32)  # each matrix's power of two (the scale kernel)

    def _run(self, name: str, grid, threads: int, buffers, args, tg_floats: int) -> None:
        self.device.dispatch(self.fac.kernels[name], grid, threads, buffers, args, tg_floats)

    def zero(self, name: str) -> None:
        self.device.fill(self.buffers[name], 0.0)

    def panel(self, index, L, epoch, v, z):
        spec = self.fac.plan.kernel(L.kernel)
        b = self.buffers
        vt, zt = (b[v[0]], b[z[0]]) if L.trail else (b["h"], b["h"])
        tg_floats = msl.panel_tg_floats(spec, self.fac.m, self.fac.n)
        if L.levels:  # a tsqr panel: a dispatch per phase, a threadgroup per tile of each matrix
            for ph in tsqr_phases(L.levels, L.width):
                self._run(L.kernel, (ph.tiles, self.nb, 1), spec.threads, (b["h"], b["tau"], vt, zt, b["tsqr_tree"]),
                          (ph.kind, ph.rows, ph.at, ph.out, ph.tau, ph.t, ph.y, ph.v1, L.c0, L.v_ld, L.v_bs, v[1],
                           z[1], self.sizes.tsqr_tree), tg_floats)
            return
        self._run(L.kernel, (self.nb, 1, 1), spec.threads, (b["h"], b["tau"], vt, zt),
                  (L.c0, L.rows, L.v_ld, L.v_bs, v[1], z[1]), tg_floats)

    def gemm(self, stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
             precision, via="cublas", side=False):
        kind = msl.STAGE_KIND[stage]
        if (trans_a, trans_b, alpha, beta) != msl.GEMM_KINDS[kind]:
            raise ValueError(f"no Metal GEMM for {stage} with {(trans_a, trans_b, alpha, beta)}")
        tile = msl.GEMM_TILE
        buf = self.buffers
        self._run(msl.gemm_name(kind, precision), (-(-cols // tile), -(-rows // tile), self.nb), msl.GEMM_THREADS,
                  (buf[a[0]], buf[b[0]], buf[c[0]]), (rows, cols, depth, lda, sa, ldb, sb, ldc, sc, a[1], b[1], c[1]),
                  msl.GEMM_TG_FLOATS)

    def tmat(self, agg, side=False):
        a = agg.a1 - agg.a0
        b = self.buffers
        self._run("qr_tmat", (1, 1, self.nb), 32 * -(-a // 32), (b["gram"], b["tau"], b["tmat"]),
                  (a, agg.a0, self.sizes.gram, self.fac.k), 4)

    def fused(self, *args):
        raise ValueError("Metal plans have no fused panel update")

    def scale(self, phase):
        """Phase 0: each matrix's power of two, then h scaled by it (the scale kernel's phases 0 and 1); phase 2: R
        scaled back."""
        m, n, b = self.fac.m, self.fac.n, self.buffers
        groups = msl.scale_threadgroups(m, n)
        for p in ((0, 1) if phase == 0 else (2,)):
            self._run("qr_scale", (groups if p else 1, self.nb, 1), msl.SCALE_THREADS, (b["h"], b["exps"]),
                      (p, m, n, groups), msl.SCALE_THREADS // 32)

    def fork(self):
        pass

    def join(self):
        pass

    def mark(self):
        pass

    def wait_mark(self):
        pass


def _prepare(a, schedule, target):
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    if a.ndim != 3:
        raise ValueError(f"expected a batch of matrices (batch, m, n), got shape {a.shape}")
    batch, m, n = a.shape
    if schedule is None:
        schedule, _ = find(Problem(m, n, batch), target)
    return a, schedule


def factor(fac: MetalFactorizer, a: np.ndarray) -> MetalEngine:
    """Factor a (batch, m, n) float32 on the factorizer's device: the engine, its buffers h and tau on the device."""
    return factor_in(fac, fac.device.array(a.reshape(-1)), fac.device.empty(a.shape[0] * fac.k), a.shape[0])


def factor_in(fac: MetalFactorizer, h, tau, batch: int) -> MetalEngine:
    """Factor the batch of matrices in device array h in place, tau into device array tau: the engine."""
    engine = MetalEngine(fac, h, tau, batch)
    drive(fac, engine)
    return engine


def identity(batch: int, m: int, cols: int) -> np.ndarray:
    """The first cols columns of the m x m identity, batch times (Q's start)."""
    q = np.zeros((batch, m, cols), dtype=np.float32)
    qmatrix.set_diagonal(q, 1)
    return q


def geqrf(a, device, schedule=None, target: Target = APPLE, factorizer: MetalFactorizer | None = None):
    """(h, tau) of a (batch, m, n) float32 by the Metal kernels on `device`, as NumPy arrays (factorizer: one made
    for this schedule and device, reused)."""
    a, schedule = _prepare(a, schedule, target)
    fac = factorizer or MetalFactorizer(schedule, device, target)
    engine = factor(fac, a)
    batch, b = a.shape[0], engine.buffers
    return device.to_host(b["h"]).reshape(a.shape), device.to_host(b["tau"])[:batch * fac.k].reshape(batch, fac.k)


def qr(a, device, schedule=None, target: Target = APPLE, complete: bool = False,
       factorizer: MetalFactorizer | None = None):
    """(Q, R) of a (batch, m, n) float32 by the Metal kernels (a keep plan, then Q from its kept blocks)."""
    a, schedule = _prepare(a, schedule, target)
    fac = factorizer or MetalFactorizer(schedule, device, target, keep=True)
    batch, m, n = a.shape
    engine = factor(fac, a)
    qcols = m if complete else fac.k
    engine.buffers["q"] = device.array(identity(batch, m, qcols).reshape(-1))
    drive_q(fac, engine, qcols)
    hh = device.to_host(engine.buffers["h"]).reshape(a.shape)
    rows = m if complete else fac.k
    return device.to_host(engine.buffers["q"]).reshape(batch, m, qcols), np.triu(hh[:, :rows, :])
