"""The launch sequence with the CUDA kernels themselves run on the CPU (compile/host.py) and cuBLAS's products as
the NumPy engine computes them: the kernels' own code checked without a GPU, against the gates and the reference."""
from __future__ import annotations

import numpy as np

from ..compile.host import HostKernel
from ..numerics import qmatrix
from ..plan import apply3, fused, rowsplit, scale, tf32x3, tmat, tsqr
from ..plan.family import PANEL_SIGNATURE, panel_grid
from ..targets import Target
from .buffers import w_parts
from .launch import PackedArgs
from .numpy_engine import CpuFactorizer, NumpyEngine
from .sequence import drive, drive_q, reads_input


class HostKernelEngine(NumpyEngine):
    """NumpyEngine whose kernels are the schedule's CUDA kernels for `target`, built for the CPU layer (a ValueError
    names a kernel the layer cannot run): the panels, T of the aggregates, power-of-two scaling, the panels' own
    products (rowsplit, fused), the tf32x3 products and the aggregates' apply3 kernel (tensor-core products
    emulated by the layer: templates/cuda/host/mma_tf32.cuh); cuBLAS's products are NumPy's."""

    def __init__(self, fac: CpuFactorizer, h: np.ndarray, tau: np.ndarray, target: Target, order: int = 0,
                 straggler: int = -1, src: np.ndarray | None = None):
        super().__init__(fac, h, tau)
        # the input, which the first panel reads in place of h where the sequence reads it (sequence.reads_input)
        self.src = src
        # the fibers' turns (compile/host.HostKernel): the order (0, or a seed) and the straggler warp (-1: none)
        self.turns = (order, straggler)
        specs = {k.name: k for k in fac.kernels}
        names = {L.kernel for L in fac.launches} | ({tmat.NAME, scale.NAME} & set(specs))
        names |= {k.name for k in specs.values() if k.variant in rowsplit.KINDS + ("fused", "tf32x3", "apply3")}
        self.kernels = {name: HostKernel(specs[name], fac.schedule, target) for name in names}
        self.target, self.shared = target, {name: specs[name].shared_bytes for name in names}
        # the rowsplit products' partial sums and counters (run/workspace.Workspace's: the counters zero between
        # launches, each launch's last block resetting its own)
        split = [L for L in fac.launches if L.nc > 0] if fac.schedule.panel_update == "rowsplit" else []
        self.parts = np.full((self.nb, max([rowsplit.split_rows(L.rows, L.nc, self.nb, self.sms)[0] * L.width * L.nc
                                            for L in split] + [1])), np.nan, dtype=np.float32)
        self.counters = np.zeros(self.nb * max([-(-L.nc // 32) for L in split] + [1]), dtype=np.uint32)
        # a cooperative panel's blocks exchange through these (run/workspace.Workspace's, the flags zero per call)
        blocks = max(L.blocks for L in fac.launches)
        self.exchange = np.full((self.nb, 2 * blocks * 64), np.nan, dtype=np.float32)
        self.flags = np.zeros(self.nb, dtype=np.uint32)
        # W in parts (run/buffers.w_parts), as the workspace holds it
        self.w_parts = w_parts(fac, self.nb, self.sms)
        if self.w_parts > 1:
            self.buffers["w"] = np.full((self.w_parts * self.nb, self.sizes.w), np.nan, dtype=np.float32)

    def _address(self, name: str, offset: int) -> int:
        return self.buffers[name].ctypes.data + 4 * offset

    def panel(self, index, L, epoch, v, z):
        h = self.buffers["h"]
        src = self.src if index == 0 and self.src is not None else h
        if L.levels:  # a tsqr panel: a launch a phase, every tile of every matrix a block (as run/cuda_engine's)
            tree = self.buffers["tsqr_tree"]
            for ph in tsqr.tsqr_phases(L.levels, L.width):
                args = PackedArgs(tsqr.SIGNATURE, (
                    src.ctypes.data, h.ctypes.data, self.tau.ctypes.data, self._address(*v), self._address(*z),
                    tree.ctypes.data, tree.shape[1], ph.kind, ph.rows, ph.at, ph.out, ph.tau, ph.t, ph.y, ph.v1,
                    L.c0, L.v_ld, L.v_bs))
                self.kernels[L.kernel](args, (ph.tiles, self.nb), L.threads, L.shared_bytes, *self.turns)
            self.log.append(("panel", index, epoch))
            return
        args = PackedArgs(PANEL_SIGNATURE, (
            src.ctypes.data, h.ctypes.data, self.tau.ctypes.data, self._address(*v), self._address(*z),
            self.exchange.ctypes.data, self.flags.ctypes.data, epoch, L.c0, L.rows, L.v_ld, L.v_bs, self.nb))
        self.kernels[L.kernel](args, panel_grid(L, self.nb), L.threads, L.shared_bytes, *self.turns)
        self.log.append(("panel", index, epoch))


    def _tmat(self, agg):
        """T of an aggregate by the T kernel, from G in "gram" into "tmat", as run/cuda_engine's."""
        a = agg.a1 - agg.a0
        stride = self.sizes.gram
        args = PackedArgs(tmat.SIGNATURE, (self._address("gram", 0), self.tau.ctypes.data + 4 * agg.a0,
                                           self._address("tmat", 0), a, stride, self.fac.k))
        self.kernels[tmat.NAME](args, self.nb, tmat.threads(a), tmat.shared_bytes(a), *self.turns)

    def _gemm(self, stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
              precision, via, t=None):
        """A panel's own products by the rowsplit kernels where the schedule says so (as run/cuda_engine's _split),
        the other products in NumPy."""
        if via != "rowsplit":
            # a projection into "w" in parts as run/cuda_engine's _w_parts splits it, the parts added in part order
            parts = (min(self.w_parts, tf32x3.project_parts(rows, cols, depth, self.nb, self.sms))
                     if stage == "project" and c[0] == "w" and self.w_parts > 1 else 1)
            if precision == "tf32x3" and self._tf32x3(trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb,
                                                      sb, beta, c, ldc, sc, parts, t, stage):
                if parts > 1:
                    flat, n = self.buffers["w"].reshape(-1), rows * ldc
                    for b0 in range(self.nb):
                        at = c[1] + b0 * sc
                        for q in range(1, parts):
                            part = at + q * self.nb * sc
                            flat[at:at + n] += flat[part:part + n]
                    self.log.append(("parts", stage, parts))
                return
            assert t is None, "a projection with T that the tf32x3 kernels do not take"
            return super()._gemm(stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c,
                                 ldc, sc, "fp32" if precision == "tf32x3" else precision, via)
        tiles = -(-cols // 32)
        if stage == "project":  # W (rows = width, cols) = Z^T (width x depth) C (depth x cols)
            splits, chunk = rowsplit.split_rows(depth, cols, self.nb, self.sms)
            args = PackedArgs(rowsplit.PROJECT_SIGNATURE, (
                self._address(*a), lda, sa, self._address(*b), ldb, sb, self.parts.ctypes.data, self.parts.shape[1],
                self._address(*c), ldc, sc, self.counters.ctypes.data, depth, cols, chunk))
            self.kernels[rowsplit.name("project", rows)](args, (tiles, splits, self.nb), rowsplit.THREADS, 0,
                                                         *self.turns)
        else:  # C (rows x cols) -= V (V^T: depth = width x rows) W (width x cols)
            args = PackedArgs(rowsplit.UPDATE_SIGNATURE, (self._address(*a), lda, sa, self._address(*b), ldb, sb,
                                                          self._address(*c), ldc, sc, rows, cols))
            self.kernels[rowsplit.name("update", depth)](args, rowsplit.update_grid(rows, cols, self.nb),
                                                        rowsplit.THREADS, 0, *self.turns)

    def _tf32x3(self, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                parts=1, t=None, stage="") -> bool:
        """A product by the tf32x3 kernel where run/cuda_engine's tf32x3_gemm takes it (G in one part; K in `parts`
        parts written nb * sc floats apart; rows in tf32x3.launches' pieces); False where it does not (cuBLAS fp32's
        there, NumPy's here)."""
        ptrs = [self._address(*x) for x in (a, b, c)]
        route = tf32x3.route(trans_a, trans_b, rows, cols, depth, ptrs, (lda, ldb, ldc, sa, sb, sc), self.nb * parts,
                             0 if self.fac.schedule.lookahead else self.sms, stage)
        if route is None:
            return False
        kind, signature = tf32x3.kernel_for(route[0], rows, t is not None)  # (T applied: as run/cuda_engine's)
        extra = () if t is None else (self._address(t[0], t[1]), t[2], t[3])
        cfg = tf32x3.CONFIGS[kind]
        for da, dc, piece, grid in tf32x3.launches(kind, rows, cols, self.nb * parts, lda, ldc):
            args = PackedArgs(signature, (ptrs[0] + 4 * da, lda, sa, ptrs[1], ldb, sb, ptrs[2] + 4 * dc, ldc,
                                          sc, piece, cols, depth, alpha, beta, parts, self.nb * sc) + extra)
            self.kernels[tf32x3.name(kind)](args, grid, tf32x3.threads(cfg), tf32x3.shared_bytes(cfg), *self.turns)
        return True

    def apply(self, z, zld, zs, v, vld, vs, width, rows, c, nc, side=False) -> bool:
        """An aggregate's W = Z^T C and C -= V W by the apply3 kernel where run/cuda_engine's apply takes it (its
        shared memory holds `rows`, every pointer and stride aligned); False otherwise."""
        ptrs = [self._address(*x) for x in (z, v, c)]
        shared = apply3.launch_shared({k.name: k.shared_bytes for k in self.fac.kernels}, width, rows, ptrs,
                                      (zld, zs, vld, vs, self.fac.n, rows, nc))
        if shared is None:
            return False
        args = PackedArgs(apply3.SIGNATURE, (ptrs[0], zld, zs, ptrs[1], vld, vs, ptrs[2], self.fac.n,
                                             self.fac.m * self.fac.n, rows, nc))
        launch = (args, (-(-nc // apply3.BN), self.nb, 1), apply3.THREADS, shared, *self.turns)
        if side:
            self.held.append((self.kernels[apply3.name(width)], launch))
        else:
            self.kernels[apply3.name(width)](*launch)
        self.log.append(("apply", width, rows, nc) + (("side",) if side else ()))
        return True

    def fused(self, z, zld, zs, v, vld, vs, width, rows, c, nc):
        """A panel's W = Z^T C and C -= V W in one launch of the fused kernel, its clusters as run/cuda_engine's."""
        cl = fused.cluster(self.nb, nc, rows, self.sms, fused.cluster_sizes(self.target))
        name = fused.name(width, cl)
        args = PackedArgs(fused.SIGNATURE, (self._address(*z), zld, zs, self._address(*v), vld, vs, self._address(*c),
                                            self.fac.n, self.fac.m * self.fac.n, rows, nc))
        self.kernels[name](args, (-(-nc // 32), self.nb, cl), fused.THREADS, self.shared[name], *self.turns)
        self.log.append(("fused", width, rows, nc))

    def scale(self, phase):
        """Schedule.scaled's scale by the scale kernel's phases (0 and 1 in, 2 out), two blocks a matrix."""
        h = self.buffers["h"]
        if phase == 0:
            self.amax = np.zeros(self.nb, dtype=np.uint32)
        for p in ((0, 1) if phase == 0 else (2,)):
            args = PackedArgs(scale.SIGNATURE, (h.ctypes.data, h.ctypes.data, self.amax.ctypes.data, p, self.fac.m,
                                                self.fac.n))
            self.kernels[scale.NAME](args, (2, self.nb), scale.THREADS, 0, *self.turns)
        self.log.append(("scale", phase))


def qr(a: np.ndarray, schedule, target: Target | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Q, R) of qrgen.qr's reduced mode for a (batch, m, n) float32 array with m >= n, as the CUDA runtime forms
    them: by the fused kernel that writes Q and R in one launch where the plan has one (a one-panel, one-block
    lanes schedule), else by the keep plan's launch sequence and then run/sequence.drive_q, else (no keep plan
    applies) from h and tau by qrgen.qmatrix; the panels are the CUDA kernels run on the CPU."""
    target = target or Target()
    a = np.ascontiguousarray(a, dtype=np.float32)
    batch, m, n = a.shape
    fac = CpuFactorizer(schedule, target=target)
    fused = next((k for k in fac.kernels if k.formq), None)
    if fused is not None:  # the launch of run/factorizer.launch_qr: R where h goes, Q where (VT)^T goes
        L = fac.launches[0]
        q, r = np.full((batch, m, n), np.nan, dtype=np.float32), np.full((batch, n, n), np.nan, dtype=np.float32)
        args = PackedArgs(PANEL_SIGNATURE, (a.ctypes.data, r.ctypes.data, 0, 0, q.ctypes.data, 0, 0, 0, 0, L.rows,
                                            L.v_ld, L.v_bs, batch))
        HostKernel(fused, schedule, target)(args, panel_grid(L, batch), L.threads, L.shared_bytes)
        return q, r
    try:
        fac = CpuFactorizer(schedule, keep=True, target=target)
    except ValueError:
        h, tau = geqrf(a, schedule, target)
        return qmatrix.householder_product(h, tau).astype(np.float32), np.triu(h[:, :n, :])
    h = a.copy()
    engine = HostKernelEngine(fac, h, np.full((batch, fac.k), np.nan, dtype=np.float32), target)
    drive(fac, engine)
    q = np.zeros((batch, m, n), dtype=np.float32)
    q[:, range(n), range(n)] = 1.0
    engine.buffers["q"] = q.reshape(batch, -1)
    drive_q(fac, engine, n)
    assert not engine.held, "side-stream work left unjoined"
    return q, np.triu(h[:, :n, :])


def geqrf(a: np.ndarray, schedule, target: Target | None = None, order: int = 0,
          straggler: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(h, tau) of a (batch, m, n) float32 array by the schedule's launch sequence, its kernels the CUDA kernels for
    `target` (default: the default CUDA target) run on the CPU, their threads taking turns in index order (order
    0) or in orders drawn from the seed `order`; with a straggler, that warp of every group (of those that have it)
    takes its turns only when no other thread can progress."""
    target = target or Target()
    a = np.asarray(a, dtype=np.float32)
    batch, m, n = a.shape
    fac = CpuFactorizer(schedule, target=target)
    # as the CUDA engine: h a copy of the input, or, where the first panel reads the input itself, h not written
    # before it (NaN here, so that a sequence reading a column of h that nothing wrote fails the gates)
    direct = reads_input(fac)
    h = np.full_like(a, np.nan) if direct else a.copy()
    tau = np.full((batch, fac.k), np.nan, dtype=np.float32)  # (as the GPU's: written by the panels only)
    engine = HostKernelEngine(fac, h, tau, target, order, straggler, src=a if direct else None)
    drive(fac, engine)
    assert not engine.held, "side-stream work left unjoined"
    return h, tau
