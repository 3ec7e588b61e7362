"""The launch sequence, written once over an engine (run/engine.py: the CUDA engine, the NumPy engine): a chunk of
matrices' panels, products, aggregate merges, lookahead and reach (drive), and Q from a keep plan's kept blocks
(drive_q)."""
from __future__ import annotations

from ..plan import tf32x3
from .buffers import reaches


def reads_input(fac) -> bool:
    """Whether the launch sequence may read its input in place of a copy in h (the first panel's src): only where
    one panel is everything, no column right of it. A wide matrix's columns past its panels, and any aggregate's
    update of them, read and write h, which must hold them first; a scaled schedule's scale kernel makes the copy."""
    return len(fac.launches) == 1 and fac.launches[0].width == fac.n and not fac.schedule.scaled


def side_pieces(c0: int, c1: int, rows: int, batch: int, sms: int, waves: int) -> list[tuple[int, int]]:
    """Columns [c0, c1) of a lookahead's side-stream update in pieces of about `waves` waves of 128 x 128 tiles
    over the SMs (whole multiples of 64 columns, at least 128), one GEMM pair each. A piece's last wave drains
    before the next piece may start, so a panel kernel waiting on the main stream gets whole SMs there even where
    stream priorities do not apply (graph replays) or cuBLAS's kernel does not keep to the SM count it was given
    (fp32 GEMMs: docs/decisions.md#lookahead)."""
    width = max(128, waves * sms * 128 * 128 // max(1, rows * batch) // 64 * 64)
    return [(c, min(c + width, c1)) for c in range(c0, c1, width)]


def drive(fac, engine) -> None:
    """The launch sequence of one chunk of matrices, on any engine (run/cuda_engine.py, run/numpy_engine.py).

    Operands are (buffer name, float offset within a matrix); each buffer holds the chunk's matrices at a fixed
    stride. Per panel: its kernel, then W = (V T)^T C and C -= V W on the columns to the end of its aggregate
    (through cuBLAS, the rowsplit kernels or the fused kernel, as the schedule's panel_update says).
    After an aggregate's last panel: G = V^T V, T from G and tau (neither where that panel is the aggregate and
    wrote T itself: Launch.t_out), (V T)^T, then the same two products on the
    columns right of the aggregate (for the plan's t_fused aggregates whose grid fills the GPU, tf32x3.t_fills, no
    (V T)^T: the projection applies T; for its t_late ones, none either: Y = V^T C on the side stream beside G and T,
    then W = T^T Y and the update). With the schedule's lookahead those products are two pairs: the next
    aggregate's columns first, then (engine.fork: on a side stream that waits for everything queued so far) the
    columns past it; the next aggregate's panels, G, T and (V T)^T run meanwhile, and engine.join (the main
    stream waits for the side stream) comes before anything touches those columns again.
    With Schedule.reach each panel's own products run through the next aggregate's columns, and an aggregate's
    merge and all its products (from the next aggregate's end) go to the side stream: first the columns of the
    aggregate after next, then engine.mark(), which the main stream waits for (engine.wait_mark) before the next
    aggregate's first products, which reach into those columns; the rest in pieces. V^T and (VT)^T then rotate over
    three buffers, and the one join is at the end.
    """
    m, n = fac.m, fac.n
    prec = fac.schedule.precision
    sizes = engine.sizes
    via = fac.schedule.panel_update  # how the panels' own products run: "cublas", "rowsplit" or "fused"
    cublas_panels = via == "cublas"
    ahead = fac.schedule.lookahead
    epoch = 0
    aggs = list(fac.aggregates)
    by_last = {a.last: i for i, a in enumerate(aggs) if a.nc > 0 or fac.keep}
    firsts = {a.first for a in aggs if a.nc > 0}
    owner = {p: i for i, a in enumerate(aggs) for p in range(a.first, a.last + 1)}
    pending = False  # side-stream work not yet joined
    reach = reaches(fac)
    marked = False  # reach: a mark queued on the side stream that the main stream has not waited for
    if fac.schedule.scaled:
        engine.scale(0)

    def suffix(index):  # which of the rotating V^T / (V T)^T buffers panel `index` and its aggregate use
        if not ahead or fac.keep:
            return ""
        return ("", "_2", "_3")[owner.get(index, 0) % (3 if reach else 2)]

    def kept_base(index):  # a keep plan: where panel `index`'s kept block begins in "reflectors" (and its wy buffer)
        return engine.nb * fac.kept[owner[index] if aggs else index].offset

    def products(z, zld, zs, v, vld, vs, width, rows, col, nc, w, project, update, how="cublas", side=False,
                 own=False, t=None):
        """W = Z^T C, then C -= V W, on the nc columns of h from offset `col` (rows from the panel's first); own: a
        panel's own products, which SkipStages leaves out for the pseudo-stage "own" (profiling); how "apply": an
        aggregate's, by the apply3 kernel where the plan has one that takes them, else as the two GEMMs; t: T's
        (buffer, offset, ld, stride), applied by the projection, W = T^T Z^T C (Z = V^T: plan.t_fused)."""
        if own and "own" in getattr(engine, "skip", ()):
            return
        if how == "apply":
            if engine.apply(z, zld, zs, v, vld, vs, width, rows, ("h", col), nc, side):
                return
            how = "cublas"
        if how == "fused":
            engine.fused(z, zld, zs, v, vld, vs, width, rows, ("h", col), nc)
            return
        c = ("h", col)
        engine.gemm("project", False, False, width, nc, rows, 1.0, z, zld, zs, c, n, m * n, 0.0, (w, 0), nc,
                    sizes.w, project, via=how, side=side, **({"t": t} if t else {}))
        engine.gemm("update", True, False, rows, nc, width, -1.0, v, vld, vs, (w, 0), nc, sizes.w, 1.0, c, n,
                    m * n, update, via=how, side=side)

    for index, L in enumerate(fac.launches):
        vt = "reflectors" + suffix(index)
        if fac.keep:
            # A keep plan's panel writes its V^T into its kept block's region (a panel's own, or its aggregate's,
            # zero above each panel's rows: all of "reflectors" is zeroed once), and its (VT)^T into its own region
            # where there are no aggregates (an aggregate's comes from the merge).
            if index == 0 and aggs:
                engine.zero("reflectors")
            base = kept_base(index)
            v, z = ("reflectors", L.v_row * L.v_ld + L.v_row + base), ("panel_wy", 0 if aggs else base)
        else:
            if index in firsts:
                engine.zero(vt)  # an aggregate's V^T is zero above each panel's rows
            v, z = (vt, L.v_row * L.v_ld + L.v_row), ("panel_wy", 0)
        if L.t_out:  # the panel writes its aggregate's T, width x width a matrix
            z = ("tmat", 0)
        engine.panel(index, L, epoch, v, z)
        if L.blocks > 1:
            epoch += L.blocks * L.barriers
        if L.nc > 0:
            if marked:
                engine.wait_mark()
                marked = False
            products(z, L.rows, L.width * L.rows, v, L.v_ld, L.v_bs, L.width, L.rows,
                     L.c0 * n + L.c0 + L.width, L.nc, "w", prec.project if cublas_panels else "fp32",
                     prec.update if cublas_panels else "fp32", how=via, own=True)
        i = by_last.get(index)
        if i is None:
            continue
        agg = aggs[i]
        a, rows = agg.a1 - agg.a0, agg.rows
        vbs = a * rows
        if fac.keep:  # the aggregate's kept region, its matrices a * rows floats apart in "reflectors" and "aggregate_wy"
            base = kept_base(index)
            vt_at, zg_at, zg_bs = ("reflectors", base), ("aggregate_wy", base), vbs
        else:
            vt_at, zg_at, zg_bs = (vt, 0), ("aggregate_wy" + suffix(index), 0), sizes.aggregate_wy
        # the merge's products (G = V^T V, (VT)^T = T^T V^T) as three tf32 products where the update takes them
        merge3 = prec.update == "tf32x3"
        if reach:
            engine.fork()
            pending = True
        t_stride = a * a if L.t_out else sizes.gram  # T's floats a matrix in "tmat": the panel's, or the T kernel's
        fuse_t = (i in fac.plan.t_fused and engine.nb <= tf32x3.GRID_YZ  # the projection applies T: no (VT)^T
                  and tf32x3.t_fills(a, agg.nc, rows, engine.nb, engine.sms))
        late = i in fac.plan.t_late  # Y = V^T C on the side stream while G and T form (never t_fused: the plan's rule)
        if late:
            engine.fork()
        if not L.t_out:
            engine.gemm("gram", False, True, a, a, rows, 1.0, vt_at, rows, vbs, vt_at, rows, vbs, 0.0, ("gram", 0), a,
                        sizes.gram, "tf32x3" if merge3 and prec.gram == "fp32" else prec.gram, side=reach)
            engine.tmat(agg, side=reach)
        if fuse_t:
            products(vt_at, rows, vbs, vt_at, rows, vbs, a, rows, agg.a0 * n + agg.a1, agg.nc, "w", prec.project,
                     prec.update, t=("tmat", 0, a, t_stride))
            continue
        if late:  # Y into W's buffer (its K in parts as W's), then W = T^T Y (T^T lower triangular: the merge's
            # kernel) into the (VT)^T buffer, and C -= V W
            c, nc = ("h", agg.a0 * n + agg.a1), agg.nc
            engine.gemm("project", False, False, a, nc, rows, 1.0, vt_at, rows, vbs, c, n, m * n, 0.0, ("w", 0), nc,
                        sizes.w, prec.project, side=True)
            engine.join()
            engine.gemm("aggregate", True, False, a, nc, a, 1.0, ("tmat", 0), a, t_stride, ("w", 0), nc, sizes.w, 0.0,
                        zg_at, nc, zg_bs, "tf32x3" if merge3 else "fp32")
            engine.gemm("update", True, False, rows, nc, a, -1.0, vt_at, rows, vbs, zg_at, nc, zg_bs, 1.0, c, n,
                        m * n, prec.update)
            continue
        engine.gemm("aggregate", True, False, a, rows, a, 1.0, ("tmat", 0), a, t_stride, vt_at, rows, vbs,
                    0.0, zg_at, rows, zg_bs, "tf32x3" if merge3 else "fp32", side=reach)
        if agg.nc == 0:  # a keep plan's last aggregate: merged for Q only
            continue
        args = (zg_at, rows, zg_bs, vt_at, rows, vbs, a, rows)
        row0 = agg.a0 * n
        how = "apply" if fac.schedule.aggregate_update == "fused" else "cublas"
        if reach:
            # the columns the next aggregate's panels reach into (the aggregate after next), then the rest
            near = aggs[i + 2].a1 if i + 2 < len(aggs) else agg.c1
            if near > agg.c1:
                products(*args, row0 + agg.c1, near - agg.c1, "w_side", prec.project, prec.update, how, side=True)
                engine.mark()
                marked = True
            for c0, c1 in side_pieces(near, n, rows, engine.nb, engine.sms, ahead):
                products(*args, row0 + c0, c1 - c0, "w_side", prec.project, prec.update, how, side=True)
            continue
        if pending:
            engine.join()
            pending = False
        nxt = aggs[i + 1] if i + 1 < len(aggs) else None
        if ahead and nxt is not None and nxt.nc > 0:
            near = nxt.a1 - agg.a1
            products(*args, row0 + agg.a1, near, "w", prec.project, prec.update, how)
            engine.fork()
            for c0, c1 in side_pieces(nxt.a1, n, rows, engine.nb, engine.sms, ahead):
                products(*args, row0 + c0, c1 - c0, "w_side", prec.project, prec.update, how, side=True)
            pending = True
        else:
            products(*args, row0 + agg.a1, agg.nc, "w", prec.project, prec.update, how)
    if pending:
        engine.join()
    if fac.schedule.scaled:
        engine.scale(2)


def drive_q(fac, engine, qcols: int) -> None:
    """Q from a keep plan's kept blocks, after drive(): the engine's buffer "q" holds the chunk's (m, qcols)
    matrices, the identity's first qcols columns (qcols = k for qr's reduced Q, m for the complete one). Q =
    H_0 ... H_{k-1} I, the last block first: a block's reflector I - V T V^T (a panel's, or an aggregate's) changes
    only P = Q[c0:, c0:] (the columns left of c0 are still the identity's, zero in its rows), by W = V^T P and then
    P -= (V T) W, the (VT)^T read transposed, in tf32x3.q_precision's precision for the block's width.

    The later blocks have changed only rows and columns from c0 + w on, so P = [[I_w, 0], [0, P22]] and
    W = [V1^T, V2^T P22] (V split after its first w rows): for an aggregate, W's first w columns come from a product
    of depth w (V1^T times P's identity block) and the rest from one of depth rows - w over P22 alone, three GEMMs
    where two would read all of P (the first product shrinks by a third at 1024² with aggregates of 128); a
    panel's block is too narrow for the extra launch to pay, and keeps two."""
    m = fac.m
    for b in reversed(fac.kept):
        base = engine.nb * b.offset
        w, qc = b.width, qcols - b.c0
        precision = tf32x3.q_precision(w)
        q = ("q", b.c0 * qcols + b.c0)
        vt = ("reflectors", base)
        if b.wy == "aggregate_wy":  # W[:, :w] = V1^T I_w; W[:, w:] = V2^T P22 (when P has columns past the block)
            engine.gemm("qproject", False, False, w, w, w, 1.0, vt, b.rows, w * b.rows, q, qcols, m * qcols, 0.0,
                        ("q_w", 0), qc, engine.sizes.q_w, precision)
            if qc > w:
                engine.gemm("qproject", False, False, w, qc - w, b.rows - w, 1.0, ("reflectors", base + w), b.rows,
                            w * b.rows, ("q", (b.c0 + w) * qcols + b.c0 + w), qcols, m * qcols, 0.0, ("q_w", w), qc,
                            engine.sizes.q_w, precision)
        else:
            engine.gemm("qproject", False, False, w, qc, b.rows, 1.0, vt, b.rows, w * b.rows, q, qcols, m * qcols,
                        0.0, ("q_w", 0), qc, engine.sizes.q_w, precision)
        engine.gemm("qupdate", True, False, b.rows, qc, w, -1.0, (b.wy, base), b.rows, w * b.rows, ("q_w", 0), qc,
                    engine.sizes.q_w, 1.0, q, qcols, m * qcols, precision)
