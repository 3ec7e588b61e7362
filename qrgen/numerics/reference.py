"""The blocked algorithm of the generated kernels, in NumPy, following a schedule.

float64: the exact reference (no rounding anywhere). float32: the kernels' arithmetic, with each trailing-update
stage's inputs rounded as tf32, bf16 or fp16 would round them (or split in three tf32 products, tf32x3), each
product rounded to float32 once (`matmul`); tests use it to judge schedules and precision choices without a GPU.
"""
from __future__ import annotations

import numpy as np

from ..plan.layout import aggregates
from ..plan.planner import plan
from ..plan.tsqr import tsqr_levels
from ..plan.whole import inner_panels
from ..problem import Problem
from ..schedule.heuristic import default_schedule
from ..targets import Target


def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """x (float32) rounded to the given input precision, returned as float32."""
    if precision == "fp32" or x.dtype != np.float32:
        return x
    if precision == "fp16":
        with np.errstate(over="ignore"):  # past 65504 fp16 overflows to inf, as the hardware does
            return x.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    if precision == "tf32":  # 10 mantissa bits, nearest, ties away from zero (cvt.rna.tf32.f32)
        out = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    elif precision == "bf16":  # 7 mantissa bits, nearest, ties to even
        out = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    else:
        raise ValueError(f"precision must be fp32, tf32, bf16 or fp16; got {precision!r}")
    finite = np.isfinite(x)
    return np.where(finite, out.view(np.float32), x)


def product(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """a @ b with inputs rounded as `precision` says; "tf32x3": a_hi b_hi + a_hi b_lo + a_lo b_hi over tf32 high parts
    (rounded to nearest) and tf32 remainders (truncated), as the tf32x3 kernels split them, the three
    products added in float32, the low parts' product left out."""
    if precision != "tf32x3" or a.dtype != np.float32:
        return matmul(round_to(a, precision), round_to(b, precision))
    a_hi, b_hi = round_to(a, "tf32"), round_to(b, "tf32")
    a_lo, b_lo = _truncate_tf32(a - a_hi), _truncate_tf32(b - b_hi)
    return matmul(a_lo, b_hi) + matmul(a_hi, b_lo) + matmul(a_hi, b_hi)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for NumPy arrays, float32 operands summed in float64 and rounded once: the same bits whatever the
    operands' shapes, strides and the CPU. A float32 BLAS sums in an order that depends on all three (OpenBLAS's
    kernels on an AMD EPYC host made a launch sequence's column pieces and the reference's whole products differ in
    the last bit, which fp16 rounding downstream magnified past the CPU tests' bounds)."""
    if a.dtype == np.float32 and b.dtype == np.float32:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    return np.matmul(a, b)


def _truncate_tf32(x: np.ndarray) -> np.ndarray:
    """x with its 13 low mantissa bits cleared (NaN and inf as they are)."""
    out = (np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), out, x)


def scale_exponents(h: np.ndarray) -> np.ndarray:
    """Per matrix of h (batch, m, n), the e of Schedule.scaled (plan/scale.py): 2^e just above the
    largest magnitude (NaN passed over), clamped to [-125, 126]; 0 where that magnitude is 0 or inf."""
    top = np.fmax.reduce(np.abs(h).reshape(len(h), -1), axis=1, initial=0)
    e = np.frexp(top)[1]  # top = f 2^e, f in [0.5, 1)
    return np.where((top > 0) & np.isfinite(top), np.clip(e, -125, 126), 0)


def scale(h: np.ndarray, e: np.ndarray, inverse: bool = False) -> None:
    """In place: h (batch, m, n) times 2^-e per matrix, or with inverse R's rows from the diagonal times 2^e
    (exact, as the kernel's phases 1 and 2)."""
    if inverse:
        k = min(h.shape[1:])
        upper = np.triu(np.ones((k, h.shape[2]), dtype=bool))
        h[:, :k][:, upper] = np.ldexp(h[:, :k][:, upper], e[:, None].astype(np.int32))
    else:
        h[...] = np.ldexp(h, -e[:, None, None].astype(np.int32))


def panel_factor(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unblocked Householder QR of a batch of panels p (batch, rows, width), in place; returns (tau, V)."""
    batch, rows, width = p.shape
    dt = p.dtype
    tau = np.zeros((batch, width), dtype=dt)
    for j in range(width):
        alpha = p[:, j, j].copy()
        tail = p[:, j + 1:, j]
        sigma = np.einsum("bi,bi->b", tail, tail)
        dots = np.einsum("bi,bik->bk", tail, p[:, j + 1:, j + 1:])
        zero = sigma == 0
        norm = np.sqrt(alpha * alpha + sigma)
        beta = np.where(alpha >= 0, -norm, norm)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(zero, 0, (beta - alpha) / beta).astype(dt)
            scale = np.where(zero, 1, 1 / (alpha - beta)).astype(dt)
        beta = np.where(zero, alpha, beta)
        f = t[:, None] * (p[:, j, j + 1:] + scale[:, None] * dots)  # tau * v^T c_k
        p[:, j + 1:, j] *= scale[:, None]
        p[:, j, j] = beta
        p[:, j, j + 1:] -= f
        p[:, j + 1:, j + 1:] -= p[:, j + 1:, j][:, :, None] * f[:, None, :]
        tau[:, j] = t
    v = np.tril(p, -1)
    idx = np.arange(width)
    v[:, idx, idx] = 1
    return tau, v


def tsqr_panel(p: np.ndarray, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """The "tsqr" panel (templates/cuda/tsqr.cuh.j2) on a batch of panels p (batch, rows, width), in place, as the
    kernels do it; returns (tau, V) like panel_factor. A tree of Householder QRs over tiles of `tile` rows (level 0 the
    panel's rows, each next level the stacked R factors of the last), Q's first `width` columns from the tree
    (each tile's compact WY form applied to its block of its parent's Q), then Householder reflectors rebuilt from
    that Q by an LU factorization with signs, Q - [S; 0] = V U (Ballard et al., "Reconstructing Householder vectors
    from tall-skinny QR", 2014): V is unit lower trapezoidal, T = -U S V1^-T, tau = diag(T), R = S R_tree."""

    batch, rows, w = p.shape
    levels = tsqr_levels(rows, w, tile)
    x = p
    facs = []  # per level: (V of its tiles (batch, tiles, tile, w), T of its tiles (batch, tiles, w, w))
    for lrows, tiles in levels:
        t4 = tsqr_tiles(x, lrows, tiles, tile)
        tau, v, tm = tsqr_factor_tiles(t4)
        facs.append((v, tm))
        x = np.triu(t4[:, :, :w]).reshape(batch, tiles * w, w)  # the stacked R factors: the next level's rows
    r_tree = x  # (batch, w, w): the root's R
    y = np.broadcast_to(np.eye(w, dtype=p.dtype), (batch, 1, w, w))  # the root's parent block: I
    for depth, ((v, tm), (lrows, tiles)) in enumerate(zip(reversed(facs), reversed(levels))):
        q = tsqr_expand(v, tm, y).reshape(batch, tiles * tile, w)[:, :lrows]
        if depth < len(levels) - 1:  # the children's blocks (a level above 0 has a multiple of w rows)
            y = q.reshape(batch, -1, w, w)
    u, s = tsqr_lu(q[:, :w])
    tau, v, h, _ = tsqr_reflectors(q, u, s, r_tree)
    p[...] = h
    return tau, v


def tsqr_tiles(x: np.ndarray, rows: int, tiles: int, tile: int) -> np.ndarray:
    """The first `rows` rows of x (batch, >= rows, w) as (batch, tiles, tile, w), zeros past them (a copy)."""
    batch, _, w = x.shape
    pad = np.zeros((batch, tiles * tile, w), dtype=x.dtype)
    pad[:, :rows] = x[:, :rows]
    return pad.reshape(batch, tiles, tile, w)


def tsqr_factor_tiles(t4: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Householder QR of every tile of t4 (batch, tiles, tile, w), in place; (tau, V, T) per tile."""
    batch, tiles, tile, w = t4.shape
    flat = t4.reshape(batch * tiles, tile, w)
    tau, v = panel_factor(flat)
    tm = tmatrix(matmul(v.transpose(0, 2, 1), v), tau)
    return (tau.reshape(batch, tiles, w), v.reshape(batch, tiles, tile, w), tm.reshape(batch, tiles, w, w))


def tsqr_expand(v: np.ndarray, tm: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each tile's Q block, [Y; 0] - V T V1^T Y (V unit lower trapezoidal (..., tile, w), T and Y (..., w, w))."""
    w = v.shape[-1]
    q = -matmul(v, matmul(tm, matmul(np.swapaxes(v[..., :w, :], -1, -2), y)))
    q[..., :w, :] += y
    return q


def tsqr_lu(qtop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LU with signs of Q's top block, Q1 - S = L U without pivoting (every pivot has magnitude at least 1):
    (L below the diagonal and U on and above it in one array, the signs S)."""
    lu = qtop.copy()
    batch, w, _ = lu.shape
    s = np.zeros((batch, w), dtype=lu.dtype)
    for k in range(w):
        d = lu[:, k, k]
        s[:, k] = np.where(d >= 0, -1, 1)
        lu[:, k, k] = d - s[:, k]
        lu[:, k + 1:, k] /= lu[:, k, k][:, None]
        lu[:, k + 1:, k + 1:] -= lu[:, k + 1:, k][:, :, None] * lu[:, k, k + 1:][:, None, :]
    return lu, s


def tsqr_reflectors(q, lu, s, r_root):
    """From the panel's Q (batch, rows, w), the LU with signs of its top block and the tree's R: tau, V (unit lower
    trapezoidal), h's panel (R = S R_root on and above the diagonal, V below) and T = -U S V1^-T."""
    batch, rows, w = q.shape
    u = np.triu(lu)
    v1 = np.tril(lu, -1) + np.eye(w, dtype=q.dtype)
    tail = np.linalg.solve(u.transpose(0, 2, 1), q[:, w:].transpose(0, 2, 1)).transpose(0, 2, 1)  # Q2 U^-1
    tau = (-np.diagonal(u, axis1=1, axis2=2) * s).astype(q.dtype)
    h = np.concatenate([np.triu(s[:, :, None] * r_root) + np.tril(lu, -1), tail], axis=1)
    tm = -np.linalg.solve(v1, (u * s[:, None, :]).transpose(0, 2, 1)).transpose(0, 2, 1)  # T V1^T = -U S
    return tau, np.concatenate([v1, tail], axis=1), h, tm


def tmatrix(gram, tau, xp=np):
    """T with H_0 ... H_{w-1} = I - V T V^T from G = V^T V and tau (LAPACK slarft, forward, columnwise); NumPy
    arrays, or those of the array module xp (CuPy, for the float64 check on the GPU)."""
    batch, w = tau.shape
    t = xp.zeros((batch, w, w), dtype=tau.dtype)
    mm = matmul if xp is np else xp.matmul
    for j in range(w):
        t[:, j, j] = tau[:, j]
        if j:
            t[:, :j, j] = -tau[:, j, None] * mm(t[:, :j, :j], gram[:, :j, j, None])[:, :, 0]
    return t


def geqrf(a: np.ndarray, schedule=None, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(h, tau) of a (..., m, n) in LAPACK's convention, computed panel by panel as the schedule says."""
    a = np.asarray(a)
    if a.ndim < 2:
        raise ValueError(f"a must have shape (..., m, n); got {a.shape}")
    m, n = a.shape[-2:]
    lead = a.shape[:-2]
    k = min(m, n)
    h = np.array(a, dtype=dtype).reshape(int(np.prod(lead, dtype=np.int64)), m, n)  # (-1 fails for empty ones)
    tau = np.zeros((h.shape[0], k), dtype=dtype)
    if h.size == 0:
        return h.reshape(*lead, m, n), tau.reshape(*lead, k)
    schedule = schedule or default_schedule(Problem(m, n, max(1, h.shape[0])))
    if (schedule.m, schedule.n) != (m, n):
        raise ValueError(f"schedule is for {schedule.m}x{schedule.n}, not {m}x{n}")
    prec = schedule.precision
    low = np.dtype(dtype) == np.float32
    rnd = (lambda x, p: round_to(x, p)) if low else (lambda x, p: x)

    def update(v, z, c, project=prec.project, upd=prec.update):  # C -= V (Z^T C), inputs rounded per stage
        wmat = product(np.ascontiguousarray(z.transpose(0, 2, 1)), c, project)
        return c - product(v, wmat, upd)

    # The rowsplit and fused kernels compute the panels' own products in fp32 (schedule.panel_update).
    panel_precision = (("fp32", "fp32") if schedule.panel_update in ("rowsplit", "fused")
                       else (prec.project, prec.update))

    def tmat(v, t, gram):  # T from the Gram matrix (inputs rounded as `gram` says) and tau
        vr = rnd(v, gram)
        return tmatrix(matmul(vr.transpose(0, 2, 1), vr), t)

    def wy(v, t, gram):  # Z = V T
        return matmul(v, tmat(v, t, gram))

    exps = scale_exponents(h) if low and schedule.scaled else None
    if exps is not None:
        scale(h, exps)
    planned = plan(schedule, Target("cpu", "numpy"))
    launches = planned.launches
    after = {a.last: a for a in aggregates(schedule) if a.nc > 0}
    late = {planned.aggregates[i].last for i in planned.t_late}  # W = T^T (V^T C): the projection first
    for index, L in enumerate(launches):
        if L.inner:
            factor_whole(h, tau, L, n)
            continue
        c0, w = L.c0, L.width
        p = np.ascontiguousarray(h[:, c0:, c0:c0 + w])
        t, v = tsqr_panel(p, L.tile) if L.levels else panel_factor(p)
        h[:, c0:, c0:c0 + w] = p
        tau[:, c0:c0 + w] = t
        if L.nc > 0:
            right = slice(c0 + w, c0 + w + L.nc)
            h[:, c0:, right] = update(v, wy(v, t, schedule.panel_gram(index)), h[:, c0:, right], *panel_precision)
        agg = after.get(index)
        if agg is not None:  # the aggregate's reflectors, merged, update the columns from c1 (right of it, or reach's)
            vg = np.tril(h[:, agg.a0:, agg.a0:agg.a1], -1)
            diag = np.arange(agg.a1 - agg.a0)
            vg[:, diag, diag] = 1
            c = h[:, agg.a0:, agg.c1:]
            if index in late:
                tm = tmat(vg, tau[:, agg.a0:agg.a1], prec.gram)
                y = product(np.ascontiguousarray(vg.transpose(0, 2, 1)), c, prec.project)
                h[:, agg.a0:, agg.c1:] = c - product(vg, matmul(tm.transpose(0, 2, 1), y), prec.update)
            else:
                h[:, agg.a0:, agg.c1:] = update(vg, wy(vg, tau[:, agg.a0:agg.a1], prec.gram), c)
    if exps is not None:
        scale(h, exps, inverse=True)
    return h.reshape(*lead, m, n), tau.reshape(*lead, k)


def factor_whole(h: np.ndarray, tau: np.ndarray, launch, n: int) -> None:
    """A "whole" launch (plan/whole.inner_panels) on h (batch, m, n) in place, in h's dtype: each inner panel factored,
    then every column right of it updated as the kernel does, C -= V (T^T (V^T C)) (fp32 inputs throughout)."""
    for c0, w, nc in inner_panels(launch, n):
        p = np.ascontiguousarray(h[:, c0:, c0:c0 + w])
        t, v = panel_factor(p)
        h[:, c0:, c0:c0 + w] = p
        tau[:, c0:c0 + w] = t
        if nc:
            vt = np.ascontiguousarray(v.transpose(0, 2, 1))
            tm = tmatrix(matmul(vt, v), t)
            c = h[:, c0:, c0 + w:]
            h[:, c0:, c0 + w:] = c - matmul(v, matmul(np.ascontiguousarray(tm.transpose(0, 2, 1)), matmul(vt, c)))
