"""The CPU backend's engine: the GPU launch sequence (run/sequence.drive) run by NumPy: every offset, leading dimension and batch stride the
kernels and cuBLAS calls receive, exercised without a GPU.

The engine stands in for each operation with what the kernel or cuBLAS computes: a panel kernel by the reference's
panel factorization (writing h, tau, V^T at its place in the aggregate's buffer and (V T)^T), a product by a
strided-batched GEMM over flat per-matrix buffers with its inputs rounded as its precision says, the T kernel by
the slarft recurrence. Tests compare the result with the reference, which does the same algorithm on arrays.
A lookahead schedule's side-stream work is held back until the join (or, before a mark, the wait_mark) that waits
for it, the latest point the GPU could run it: an operation queued meanwhile that read its results, or overwrote
what it reads, would change the result.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..numerics import qmatrix
from ..numerics.reference import (factor_whole, matmul, panel_factor, product, round_to, scale, scale_exponents,
                                  tmatrix, tsqr_expand, tsqr_factor_tiles, tsqr_lu, tsqr_reflectors, tsqr_tiles)
from ..plan import apply3
from ..plan.planner import plan
from ..plan.tsqr import tsqr_phases
from ..targets import Target
from .buffers import Sizes, buffer_names
from .sequence import drive, drive_q

CPU = Target("cpu", "numpy")


class CpuFactorizer:
    """What drive() reads of a factorizer: a schedule's plan on the CPU backend."""

    def __init__(self, schedule, keep: bool = False, target: Target = CPU):
        self.m, self.n, self.k = schedule.m, schedule.n, min(schedule.m, schedule.n)
        self.schedule = schedule
        self.keep = keep
        self.plan = plan(schedule, target, keep)
        self.kernels, self.launches = self.plan.kernels, self.plan.launches
        self.aggregates, self.kept = self.plan.aggregates, self.plan.kept


class NumpyEngine:
    def __init__(self, fac: CpuFactorizer, h: np.ndarray, tau: np.ndarray):
        self.fac = fac
        self.sizes = Sizes.of(fac)
        self.nb = h.shape[0]
        self.sms = 132  # the H200's, for the lookahead's side pieces (run/sequence.side_pieces)
        self.tau = tau
        self.buffers = {"h": h.reshape(self.nb, -1)}
        for name in buffer_names(fac):
            self.buffers[name] = np.full((self.nb, self.sizes.floats(name)), np.nan, dtype=np.float32)
        self.buffers["tmat"] = np.full((self.nb, self.sizes.gram), np.nan, dtype=np.float32)
        self.log: list[tuple] = []
        self.held: list = []  # side-lane work not yet run, as (function, args), and marks (the module's docstring)

    def _matrix(self, name: str, offset: int, stride: int, rows: int, cols: int, ld: int) -> np.ndarray:
        """The (nb, rows, cols) view of a buffer: matrix b at offset + b * stride, rows ld floats apart."""
        flat = self.buffers[name].reshape(-1)
        item = flat.itemsize
        assert offset + (self.nb - 1) * stride + (rows - 1) * ld + cols <= flat.size, (name, offset, rows, cols)
        assert cols <= ld, (name, cols, ld)
        return as_strided(flat[offset:], shape=(self.nb, rows, cols), strides=(stride * item, ld * item, item))

    def zero(self, name: str) -> None:
        self.buffers[name][...] = 0.0
        self.log.append(("zero", name))

    def panel(self, index, L, epoch, v, z):
        m, n = self.fac.m, self.fac.n
        h = self.buffers["h"].reshape(self.nb, m, n)
        if L.inner:  # a "whole" kernel: everything inside it, nothing in the buffers
            factor_whole(h, self.tau, L, n)
            self.log.append(("panel", index, epoch))
            return
        if L.levels:
            t, vv, tm = self._tsqr(L, h[:, L.c0:, L.c0:L.c0 + L.width])
        else:
            p = np.ascontiguousarray(h[:, L.c0:, L.c0:L.c0 + L.width])
            t, vv = panel_factor(p)
            h[:, L.c0:, L.c0:L.c0 + L.width] = p
            vr = round_to(vv, self.fac.schedule.panel_gram(index))
            tm = tmatrix(matmul(vr.transpose(0, 2, 1), vr), t)
        self.tau[:, L.c0:L.c0 + L.width] = t
        if L.trail:
            self._matrix(v[0], v[1], L.v_bs, L.width, L.rows, L.v_ld)[...] = vv.transpose(0, 2, 1)
        if L.trail and not L.vt_only:
            zt = matmul(vv, tm).transpose(0, 2, 1)
            self._matrix(z[0], z[1], L.width * L.rows, L.width, L.rows, L.rows)[...] = zt
        if L.t_out:  # the aggregate's T, width x width a matrix
            self._matrix(z[0], z[1], L.width * L.width, L.width, L.width, L.width)[...] = tm
        self.log.append(("panel", index, epoch))

    def _tsqr(self, L, panel):
        """A tsqr panel phase by phase (plan/tsqr.tsqr_phases) through the work buffer "tsqr_tree" at the offsets the kernel
        gets, each phase reading only what earlier phases wrote there (the buffer starts as NaN); returns tau, V
        and the panel's T."""
        w, tile, nb = L.width, L.tile, self.nb
        ts = self.buffers["tsqr_tree"]

        def region(offset, rows, cols=w):  # (nb, rows, cols) at a float offset of each matrix's "tsqr_tree"
            return ts[:, offset:offset + rows * cols].reshape(nb, rows, cols)

        def parent(ph):  # the tiles' Y: the identity at the root
            if ph.y < 0:
                return np.broadcast_to(np.eye(w, dtype=np.float32), (nb, ph.tiles, w, w))
            return region(ph.y, ph.tiles * w).reshape(nb, ph.tiles, w, w)

        def unit_lower(t4):  # V as a factorization left it in place (R on and above the diagonal)
            v = np.tril(t4, -1)
            v[..., :w, :] += np.eye(w, dtype=np.float32)
            return v

        for ph in tsqr_phases(L.levels, w):
            rows, tiles = ph.rows, ph.tiles
            io = panel if ph.kind in (0, 3) else region(ph.at, rows)
            t4 = tsqr_tiles(io, rows, tiles, tile)
            tm = region(ph.t, tiles * w).reshape(nb, tiles, w, w)
            if ph.kind in (0, 1):
                tau, _, tm[...] = tsqr_factor_tiles(t4)
                tm[...] = np.triu(tm)
                region(ph.tau, tiles, w)[...] = tau
                region(ph.out, tiles * w)[...] = np.triu(t4[:, :, :w]).reshape(nb, tiles * w, w)
                if ph.kind == 0:
                    region(ph.v1, w)[...] = t4[:, 0, :w]
                io[...] = t4.reshape(nb, tiles * tile, w)[:, :rows]
                continue
            q = tsqr_expand(unit_lower(t4), tm, parent(ph)).reshape(nb, tiles * tile, w)[:, :rows]
            if ph.kind == 2:
                io[...] = q
                continue
            # the final phase: Q's top block again from level 0's first tile (V1, T, Y0), as every block does
            y0 = parent(ph)[:, 0]
            qtop = tsqr_expand(unit_lower(region(ph.v1, w)), region(ph.t, w), y0)
            lu, s = tsqr_lu(qtop)
            tau, v, hp, tpanel = tsqr_reflectors(q, lu, s, region(ph.out, w))
            panel[...] = hp
        return tau, v, tpanel

    def tmat(self, agg, side=False):
        if side:
            self.held.append((self._tmat, (agg,)))
        else:
            self._tmat(agg)
        self.log.append(("tmat", agg.a0) + (("side",) if side else ()))

    def _tmat(self, agg):
        a = agg.a1 - agg.a0
        g = self._matrix("gram", 0, self.sizes.gram, a, a, a)
        self._matrix("tmat", 0, self.sizes.gram, a, a, a)[...] = tmatrix(np.triu(g, 1), self.tau[:, agg.a0:agg.a1])

    def scale(self, phase):
        h = self.buffers["h"].reshape(self.nb, self.fac.m, self.fac.n)
        if phase == 0:
            self.exps = scale_exponents(h)
        scale(h, self.exps, inverse=phase == 2)
        self.log.append(("scale", phase))

    def fork(self):
        self.log.append(("fork",))

    def join(self):
        self.log.append(("join",))
        self._run_held(len(self.held))

    def mark(self):
        self.log.append(("mark",))
        self.held.append("mark")

    def wait_mark(self):
        """Runs the held work queued before the latest mark (the rest stays held)."""
        self.log.append(("wait_mark",))
        self._run_held(len(self.held) - self.held[::-1].index("mark"))

    def _run_held(self, count):
        run, self.held = self.held[:count], self.held[count:]
        for item in run:
            if item != "mark":
                item[0](*item[1])

    def gemm(self, stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
             precision, via="cublas", side=False, t=None):
        args = (stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                precision, via, t)
        if side:
            self.held.append((self._gemm, args))
        else:
            self._gemm(*args)
        self.log.append(("gemm", stage, precision, via) + (("side",) if side else ()) + (("t",) if t else ()))

    def fused(self, z, zld, zs, v, vld, vs, width, rows, c, nc):
        """The fused kernel: W = Z^T C in fp32, then C -= V W (W never leaves the kernel)."""
        self._two_products(z, zld, zs, v, vld, vs, width, rows, c, nc, "fp32")
        self.log.append(("fused", width, rows, nc))

    def apply(self, z, zld, zs, v, vld, vs, width, rows, c, nc, side=False) -> bool:
        """The apply3 kernel where the plan has one for `width` whose shared memory holds `rows`: W = Z^T C, then
        C -= V W, both in tf32x3 (W rounded to fp32 between); False otherwise, as the CUDA engine answers."""
        if apply3.launch_shared({k.name: k.shared_bytes for k in self.fac.kernels}, width, rows) is None:
            return False
        args = (z, zld, zs, v, vld, vs, width, rows, c, nc, "tf32x3")
        if side:
            self.held.append((self._two_products, args))
        else:
            self._two_products(*args)
        self.log.append(("apply", width, rows, nc) + (("side",) if side else ()))
        return True

    def _two_products(self, z, zld, zs, v, vld, vs, width, rows, c, nc, precision):
        """W = Z^T C, then C -= V W, each product's inputs rounded as `precision` says (W an fp32 array between)."""
        n = self.fac.m * self.fac.n
        zt = self._matrix(z[0], z[1], zs, width, rows, zld)
        vt = self._matrix(v[0], v[1], vs, width, rows, vld)
        mc = self._matrix(c[0], c[1], n, rows, nc, self.fac.n)
        wmat = product(np.ascontiguousarray(zt), np.ascontiguousarray(mc), precision)
        mc[...] = mc - product(np.ascontiguousarray(vt.transpose(0, 2, 1)), wmat, precision)

    def _gemm(self, stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
              precision, via, t=None):
        ma = self._matrix(a[0], a[1], sa, depth if trans_a else rows, rows if trans_a else depth, lda)
        mb = self._matrix(b[0], b[1], sb, cols if trans_b else depth, depth if trans_b else cols, ldb)
        mc = self._matrix(c[0], c[1], sc, rows, cols, ldc)
        opa = ma.transpose(0, 2, 1) if trans_a else ma
        opb = mb.transpose(0, 2, 1) if trans_b else mb
        prod = product(np.ascontiguousarray(opa), np.ascontiguousarray(opb), precision)
        mc[...] = alpha * prod + (beta * mc if beta else 0.0)
        if t:  # an aggregate's projection with its T applied (the _t kernels' epilogue): W = T^T (Z^T C)
            tm = self._matrix(t[0], t[1], t[3], rows, rows, t[2])
            mc[...] = product(np.ascontiguousarray(tm.transpose(0, 2, 1)), np.ascontiguousarray(mc), precision)
        if via == "rowsplit":  # the rowsplit kernels' two patterns only (fp32 FMAs, summed in another order)
            assert precision == "fp32" and ((stage, trans_a, alpha, beta) == ("project", False, 1.0, 0.0) or
                                            (stage, trans_a, alpha, beta) == ("update", True, -1.0, 1.0))


def qr(a: np.ndarray, schedule, complete: bool = False) -> tuple[np.ndarray, np.ndarray, list]:
    """(Q, h, log) of a (batch, m, n) by a keep plan's launch sequence and then run/sequence.drive_q, in NumPy float32:
    Q (batch, m, k), or (batch, m, m) with complete=True."""
    a = np.asarray(a, dtype=np.float32)
    batch, m, n = a.shape
    fac = CpuFactorizer(schedule, keep=True)
    h = a.copy()
    tau = np.zeros((batch, fac.k), dtype=np.float32)
    engine = NumpyEngine(fac, h, tau)
    drive(fac, engine)
    qcols = m if complete else fac.k
    q = np.zeros((batch, m, qcols), dtype=np.float32)
    qmatrix.set_diagonal(q, 1)
    engine.buffers["q"] = q.reshape(batch, -1)
    drive_q(fac, engine, qcols)
    assert not engine.held, "side-stream work left unjoined"
    return q, h, engine.log


def geqrf(a: np.ndarray, schedule) -> tuple[np.ndarray, np.ndarray, list]:
    """(h, tau, log of operations) of a (batch, m, n) by the GPU launch sequence, run in NumPy float32."""
    a = np.asarray(a, dtype=np.float32)
    batch, m, n = a.shape
    fac = CpuFactorizer(schedule)
    h = a.copy()
    tau = np.zeros((batch, fac.k), dtype=np.float32)
    engine = NumpyEngine(fac, h, tau)
    drive(fac, engine)
    assert not engine.held, "side-stream work left unjoined"
    return h, tau, engine.log
