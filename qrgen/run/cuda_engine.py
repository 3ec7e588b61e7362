"""The CUDA engine: run/sequence.drive's operations as kernel launches and cuBLAS calls on CuPy's current stream
(and a lookahead's side stream), and factor(), which drives a batch through it chunk by chunk."""
from __future__ import annotations

import contextlib

from ..plan import apply3, fused, rowsplit, scale, tf32x3, tmat, tsqr
from ..plan.family import PANEL_SIGNATURE
from .engine import SkipStages
from .launch import PackedArgs, launch_panel
from .recorded import SYMBOLS, Direct, Recorder, symbolic
from .sequence import drive, drive_q


class CudaEngine:
    """drive()'s operations as kernel launches and cuBLAS calls on CuPy's current stream."""

    def __init__(self, fac, ws, funcs: dict, nb: int, h_ptr: int, tau_ptr: int, src_ptr: int | None,
                 stages: list | None, device_id: int, sink, streams=None):
        import cupy

        self.fac, self.ws, self.funcs, self.stages, self.streams = fac, ws, funcs, stages, streams
        self.cupy = cupy
        self.device_id = device_id
        self.sink = sink  # where the operations go (run/recorded.py: queued now, or recorded)
        self.stream_ptr = cupy.cuda.get_current_stream().ptr
        self.sizes, self.sms = ws.sizes, ws.sms
        self.nb = nb
        # The side stream's GEMMs plan for the SMs a lookahead's panels leave (docs/decisions.md#side-sms); beside
        # the merges of t_late aggregates (no lookahead), for every SM (0)
        self.side_sms = (max(self.sms // 4, self.sms - max(L.blocks for L in fac.launches) * self.nb)
                         if fac.schedule.lookahead else 0)
        self.h_ptr, self.tau_ptr, self.src_ptr = h_ptr, tau_ptr, src_ptr
        self.strides = ws.strides
        self.ptrs = {**ws.ptrs, "h": self.h_ptr}

    def _mark(self, stage, launch):
        if self.stages is None:
            return None
        start, stop = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        start.record()
        self.stages.append((stage, launch, start, stop))
        return stop

    def _done(self, stop):
        if stop is not None:
            stop.record()

    def zero(self, name):
        self.sink.memset(self.ptrs[name], 4 * self.nb * self.strides[name], self.stream_ptr)

    def panel(self, index, L, epoch, v, z):
        _, func = self.funcs[L.kernel]
        src = self.src_ptr if (index == 0 and self.src_ptr is not None) else self.h_ptr
        stop = self._mark("panel", L)
        if L.levels:
            self._tsqr(index, func, L, src, v, z)
            self._done(stop)
            return
        ws = self.ws
        with self.fac.lock:  # the packed values are shared with the fast lane's launches (launch_direct)
            args = ws.panel_args.get(index)
            if args is None:  # the same for every call on this workspace but src, h and tau
                args = ws.panel_args[index] = PackedArgs(PANEL_SIGNATURE, (
                    src, self.h_ptr, self.tau_ptr, ws.ptrs[v[0]] + 4 * v[1], ws.ptrs[z[0]] + 4 * z[1],
                    ws.exchange.data.ptr, ws.flags.data.ptr, epoch, L.c0, L.rows, L.v_ld, L.v_bs, self.nb))
            else:
                args.set(0, src)
                args.set(1, self.h_ptr)
                args.set(2, self.tau_ptr)
                if self.fac.keep:  # the kept regions' offsets scale with the chunk's matrices
                    args.set(3, ws.ptrs[v[0]] + 4 * v[1])
                    args.set(4, ws.ptrs[z[0]] + 4 * z[1])
            launch_panel(func, L, self.nb, self.stream_ptr, args, self.sink)
        self._done(stop)

    def _tsqr(self, index, func, L, src, v, z):
        """A tsqr panel: one launch per phase of plan/tsqr.tsqr_phases, every tile of every matrix a block. Each
        phase's arguments are packed once per workspace; a call rewrites only src, h and tau (and the V^T and (VT)^T
        offsets in keep plans, which scale with the chunk)."""
        ws = self.ws
        packed = ws.tsqr_args.get(index)
        if packed is None:
            packed = ws.tsqr_args[index] = [
                (ph.tiles, PackedArgs(tsqr.SIGNATURE, (
                    src, self.h_ptr, self.tau_ptr, ws.ptrs[v[0]] + 4 * v[1], ws.ptrs[z[0]] + 4 * z[1],
                    ws.ptrs["tsqr_tree"], self.strides["tsqr_tree"], ph.kind, ph.rows, ph.at, ph.out, ph.tau, ph.t, ph.y, ph.v1,
                    L.c0, L.v_ld, L.v_bs))) for ph in tsqr.tsqr_phases(L.levels, L.width)]
        for tiles, args in packed:
            args.set(0, src)
            args.set(1, self.h_ptr)
            args.set(2, self.tau_ptr)
            if self.fac.keep:
                args.set(3, ws.ptrs[v[0]] + 4 * v[1])
                args.set(4, ws.ptrs[z[0]] + 4 * z[1])
            self.sink.kernel(func.ptr, (tiles, self.nb, 1), L.threads, L.shared_bytes, self.stream_ptr, args)

    def tmat(self, agg, side=False):
        _, func = self.funcs[tmat.NAME]
        a = agg.a1 - agg.a0
        stop = self._mark("tmat", None)
        self.launch(func, (self.nb, 1, 1), tmat.threads(a), tmat.shared_bytes(a), tmat.SIGNATURE,
                     (self.ptrs["gram"], self.tau_ptr + 4 * agg.a0, self.ptrs["tmat"], a, self.sizes.gram, self.fac.k),
                     self.streams.side.ptr if side and self.streams is not None else None)
        self._done(stop)

    def scale(self, phase):
        """Schedule.scaled's power-of-two scale per matrix: phase 0, the scale (the input's largest magnitudes)
        then h = the input scaled (the copy into h where h is not yet one: the panels then read h); phase 2, R
        scaled back (plan/scale.py)."""
        _, func = self.funcs[scale.NAME]
        stop = self._mark("scale", None)
        per_matrix = max(1, -(-8 * self.sms // self.nb))  # about 8 blocks per SM over the chunk
        grid = (min(per_matrix, -(-self.fac.m * self.fac.n // (4 * scale.THREADS))), self.nb, 1)
        amax = self.ws.amax.data.ptr
        if phase == 0:
            self.sink.memset(amax, 4 * self.nb, self.stream_ptr)
        src = self.src_ptr if (phase == 0 and self.src_ptr is not None) else self.h_ptr
        for p in ((0, 1) if phase == 0 else (2,)):
            self.launch(func, grid, scale.THREADS, 0, scale.SIGNATURE,
                         (src, self.h_ptr, amax, p, self.fac.m, self.fac.n))
        self.src_ptr = None
        self._done(stop)

    def launch(self, func, grid, threads, shared, signature: str, values, stream=None):
        """One driver call with the arguments packed as it takes them (one packed set per signature, rewritten
        each launch: the driver copies the values when the launch is queued): a few µs of host time where CuPy's
        generic kernel call takes about 10. In stream order, not programmatic
        (docs/decisions.md#stream-order-launches)."""
        args = self.ws.packed.get(signature)
        if args is None:
            args = self.ws.packed[signature] = PackedArgs(signature, values)
        else:
            for i, v in enumerate(values):
                args.set(i, v)
        self.sink.kernel(func.ptr, grid, threads, shared, self.stream_ptr if stream is None else stream, args)

    def fork(self):
        if self.streams is not None:
            self.streams.fork(self.sink)

    def join(self):
        if self.streams is not None:
            self.streams.join(self.sink)

    def mark(self):
        if self.streams is not None:
            self.streams.mark(self.sink)

    def wait_mark(self):
        if self.streams is not None:
            self.streams.wait_mark(self.sink)

    def gemm(self, stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
             precision, via="cublas", side=False, t=None):
        """Row-major C = alpha op(A) op(B) + beta C per matrix, as column-major cuBLAS computes C^T; via "rowsplit":
        a panel's projection (W = Z^T C) or update (C -= V W) by the rowsplit kernels. `side`: on the side lane (its
        own cuBLAS handle and workspace: the two streams' GEMMs run at once), where the plan has two streams. t: an
        aggregate's projection W = T^T Z^T C by a _t kernel (T's buffer, offset, ld and stride; plan.t_fused)."""
        stop = self._mark(stage, None)
        if via == "rowsplit":
            self._split(stage, rows, cols, depth, a, lda, sa, b, ldb, sb, c, ldc, sc)
            self._done(stop)
            return
        side = side and self.streams is not None
        if stage == "gram":  # G in parts (run/buffers.gram_parts), added into the first
            parts = min(self.ws.gram_parts, max(1, depth // tf32x3.PART_ROWS))
            if precision in ("fp32", "tf32x3") and parts > 1 and self.tf32x3_gemm(
                    trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, side,
                    parts):
                self._add_parts(c, rows * ldc, parts, sc, side)
                self._done(stop)
                return
        if precision == "tf32x3":
            parts = self._w_parts(stage, rows, cols, depth, c)
            if self.tf32x3_gemm(trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                                side, parts, t, stage):
                if parts > 1:
                    self._add_parts(c, rows * ldc, parts, sc, side)
                self._done(stop)
                return
            if t is not None:
                raise RuntimeError("an aggregate's projection with T that the tf32x3 kernels do not take "
                                   "(tf32x3.t_fused admitted it)")
            precision = "fp32"  # products the tf32x3 kernels do not take (thin or not 16-byte aligned): cuBLAS fp32
        self.sink.gemm(self.device_id, self.streams.side.ptr if side else self.stream_ptr, trans_a, trans_b, rows,
                       cols, depth, alpha, self.ptrs[a[0]] + 4 * a[1], lda, sa, self.ptrs[b[0]] + 4 * b[1], ldb, sb,
                       beta, self.ptrs[c[0]] + 4 * c[1], ldc, sc, self.nb, precision, slot=int(side),
                       sm_target=self.side_sms if side else 0)
        self._done(stop)

    def tf32x3_gemm(self, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, side,
               parts=1, t=None, stage=""):
        """C = alpha op(A) op(B) + beta C by the tf32x3 kernel for op(A) op(B) = A B (the projection's layout),
        A^T B (the update's) or A B^T (the Gram matrix's), where every pointer is 16-byte aligned and every
        dimension, leading dimension and batch stride a multiple of 4 floats; False (nothing launched) otherwise.
        parts > 1: K in that many parts, part q written q * chunk * sc floats after C (gram_parts, with beta 0).
        t: then C = T^T C by the _t kernel's epilogue (tf32x3.t_fused's aggregates, which its kernels take). stage:
        the engine's stage ("aggregate": (VT)^T, by the merge kernel: tf32x3.route)."""
        ptrs = [self.ptrs[x[0]] + 4 * x[1] for x in (a, b, c)]
        route = tf32x3.route(trans_a, trans_b, rows, cols, depth, ptrs, (lda, ldb, ldc, sa, sb, sc), self.nb * parts,
                             0 if self.fac.schedule.lookahead else self.ws.sms, stage)
        if route is None:
            return False
        kind, signature = tf32x3.kernel_for(route[0], rows, t is not None)
        extra = () if t is None else (self.ptrs[t[0]] + 4 * t[1], t[2], t[3])
        cfg = tf32x3.CONFIGS[kind]
        _, func = self.funcs[tf32x3.name(kind)]
        for da, dc, piece, grid in tf32x3.launches(kind, rows, cols, self.nb * parts, lda, ldc):  # one below 4M rows
            self.launch(func, grid, tf32x3.threads(cfg), tf32x3.shared_bytes(cfg), signature,
                        (ptrs[0] + 4 * da, lda, sa, ptrs[1], ldb, sb, ptrs[2] + 4 * dc, ldc, sc, piece, cols, depth,
                         alpha, beta, parts, self.ws.chunk * sc) + extra,
                        self.streams.side.ptr if side else self.stream_ptr)
        return True

    def _w_parts(self, stage, rows, cols, depth, c) -> int:
        """The parts a projection into "w" splits its K into (run/buffers.w_parts: few matrices, no lookahead; on the
        side stream a t_late aggregate's V^T C), at most as many as the workspace holds; 1 for every other product."""
        if stage != "project" or c[0] != "w" or self.ws.w_parts == 1:
            return 1
        return min(self.ws.w_parts, tf32x3.project_parts(rows, cols, depth, self.nb, self.ws.sms))

    def _add_parts(self, c, floats, parts, stride, side=False):
        """Parts 1 to parts - 1 of a product's `floats` outputs (each the chunk's matrices `stride` floats apart, the
        parts chunk * stride floats apart) added into part 0 at c, as a product with a vector of ones in fp32; `side`:
        on the side lane (gemm's, resolved: the plan has two streams)."""
        base, step = self.ptrs[c[0]] + 4 * c[1], self.ws.chunk * stride
        self.sink.gemm(self.device_id, self.streams.side.ptr if side else self.stream_ptr, False, False, 1, floats,
                       parts - 1, 1.0, self.ptrs["ones"], parts - 1, 0, base + 4 * step, step, stride, 1.0, base,
                       floats, stride, self.nb, "fp32", slot=int(side), sm_target=self.side_sms if side else 0)

    def fused(self, z, zld, zs, v, vld, vs, width, rows, c, nc):
        """A panel's W = Z^T C and C -= V W (C: rows x nc of h from offset c[1]) in one launch of the fused kernel
        (timed as the stage "project")."""
        stop = self._mark("project", None)
        cluster = fused.cluster(self.nb, nc, rows, self.ws.sms, self.fac.fused_clusters)
        name = fused.name(width, cluster)
        _, func = self.funcs[name]
        ptr = self.ptrs
        self.launch(func, (-(-nc // 32), self.nb, cluster), fused.THREADS, self.fac.shared_bytes[name],
                    fused.SIGNATURE,
                     (ptr[z[0]] + 4 * z[1], zld, zs, ptr[v[0]] + 4 * v[1], vld, vs, ptr[c[0]] + 4 * c[1], self.fac.n,
                      self.fac.m * self.fac.n, rows, nc))
        self._done(stop)

    def apply(self, z, zld, zs, v, vld, vs, width, rows, c, nc, side=False) -> bool:
        """An aggregate's W = Z^T C and C -= V W (C: rows x nc of h from offset c[1]) in one launch of the apply3
        kernel (timed as the stage "project"), where the plan has one for `width` whose shared memory holds `rows`
        and every pointer is 16-byte aligned and every dimension and stride a multiple of 4 floats; False (nothing
        launched) otherwise."""
        ptrs = [self.ptrs[x[0]] + 4 * x[1] for x in (z, v, c)]
        shared = apply3.launch_shared(self.fac.shared_bytes, width, rows, ptrs,
                                      (zld, zs, vld, vs, self.fac.n, rows, nc))
        if shared is None:
            return False
        stop = self._mark("project", None)
        _, func = self.funcs[apply3.name(width)]
        self.launch(func, (-(-nc // apply3.BN), self.nb, 1), apply3.THREADS, shared, apply3.SIGNATURE,
                    (ptrs[0], zld, zs, ptrs[1], vld, vs, ptrs[2], self.fac.n, self.fac.m * self.fac.n, rows, nc),
                    self.streams.side.ptr if side and self.streams is not None else None)
        self._done(stop)
        return True

    def _split(self, stage, rows, cols, depth, a, lda, sa, b, ldb, sb, c, ldc, sc):
        ptr = self.ptrs
        tiles = -(-cols // 32)
        if stage == "project":  # W (rows = width, cols) = Z^T (width x depth) C (depth x cols)
            splits, chunk = rowsplit.split_rows(depth, cols, self.ws.chunk, self.ws.sms)  # as the workspace was sized
            _, func = self.funcs[rowsplit.name("project", rows)]
            part = self.ws.buffers["rowsplit_parts"]
            self.launch(func, (tiles, splits, self.nb), rowsplit.THREADS, 0, rowsplit.PROJECT_SIGNATURE,
                         (ptr[a[0]] + 4 * a[1], lda, sa, ptr[b[0]] + 4 * b[1], ldb, sb, part.data.ptr, part.shape[1],
                          ptr[c[0]] + 4 * c[1], ldc, sc, self.ws.counters.data.ptr, depth, cols, chunk))
        else:  # C (rows x cols) -= V (V^T: depth = width x rows) W (width x cols)
            _, func = self.funcs[rowsplit.name("update", depth)]
            self.launch(func, rowsplit.update_grid(rows, cols, self.nb), rowsplit.THREADS, 0,
                        rowsplit.UPDATE_SIGNATURE, (ptr[a[0]] + 4 * a[1], lda, sa, ptr[b[0]] + 4 * b[1], ldb, sb,
                                                ptr[c[0]] + 4 * c[1], ldc, sc, rows, cols))


def factor(fac, h, tau, ws, device_id: int, src=None, stages: list | None = None, skip=(), q=None) -> None:
    """In place on h (batch, m, n), C-contiguous, writing tau (batch, k); on CuPy's current stream. The first panel
    reads src (the input, C-contiguous) instead of h where given. With `stages`, each launch is bracketed by CUDA
    events appended there as (stage, launch, start, stop), stage being "panel", "project", "update", "gram", "tmat"
    or "aggregate"; a lookahead schedule then runs on one stream (each launch timed alone), else on its two streams.
    Otherwise the operations are recorded once per workspace and kind of call (run/recorded.py) and replayed."""
    import cupy

    streams = ws.streams if stages is None else None
    bases = (h.data.ptr, tau.data.ptr, 0 if src is None else src.data.ptr, 0 if q is None else q.data.ptr)
    kind = (src is not None, None if q is None else (q.shape[2], q.strides[0]))
    with streams.from_stream(cupy.cuda.get_current_stream()) if streams else contextlib.nullcontext():
        if stages is not None or skip:
            queue_operations(fac, ws, device_id, h.shape[0], bases, kind, Direct(), streams, stages, skip)
            return
        ops = ws.recorded.get(kind)
        if ops is None:
            recorder = Recorder()
            queue_operations(fac, ws, device_id, h.shape[0], tuple(symbolic(name) for name in SYMBOLS), kind,
                             recorder, streams)
            ops = ws.recorded[kind] = recorder.finish()
        if streams is not None:
            streams.pending = ops.waits  # (a replay that fails midway leaves the caller's stream joined to both)
        ops.run(bases)
        if streams is not None:
            streams.pending = False


def queue_operations(fac, ws, device_id: int, batch: int, bases: tuple, kind: tuple, sink, streams,
                     stages=None, skip=()) -> None:
    """factor's operations into `sink`, chunk by chunk: bases are the addresses of h, tau, src and Q (SYMBOLS'
    order; src and Q's used where `kind` says the call has them), kind factor's (src given, Q's columns and
    matrix stride)."""
    import cupy

    h_ptr, tau_ptr, src_ptr, q_ptr = bases
    has_src, q = kind
    matrix = 4 * fac.m * fac.n  # bytes of a matrix of h and of src
    stream = cupy.cuda.get_current_stream().ptr
    for b0 in range(0, batch, ws.chunk):
        nb = min(ws.chunk, batch - b0)
        if ws.multi_block:  # a memset, not a CuPy kernel (docs/decisions.md#render-index)
            sink.memset(ws.flags.data.ptr, ws.flags.nbytes, stream)
        engine = CudaEngine(fac, ws, ws.funcs, nb, h_ptr + b0 * matrix, tau_ptr + 4 * b0 * fac.k,
                            src_ptr + b0 * matrix if has_src else None, stages, device_id, sink, streams)
        drive(fac, SkipStages(engine, skip) if skip else engine)
        if q is not None:
            engine.ptrs["q"] = q_ptr + b0 * q[1]
            drive_q(fac, engine, q[0])
