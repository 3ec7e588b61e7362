"""Q, Q·C and Qᵀ·C from geqrf's (h, tau), and least squares, on a Metal device (run/msl_devices.py, or the Mac's):
the reflectors in blocks of BLOCK columns, each block's V^T from h (qr_vt), G = V^T V and T (qr_tmat), then
C ← C − V T V^T C (Q·C, the last block first) or C − V T^T V^T C (Qᵀ·C, the first block first) through the GEMM
kernels; least squares by Qᵀ·b and a triangular solve with R (qr_trsm). Every product fp32."""
from __future__ import annotations

from ..plan import msl
from ..render.sources import render
from ..targets import Target

BLOCK = 32
_LOADED: dict = {}


def kernels(device, target: Target) -> dict:
    """The kernels of these functions, loaded once per device and target."""
    key = (id(device), target)
    if key not in _LOADED:
        specs = [msl.gemm_kernel(kind) for kind in msl.GEMM_KINDS] + [msl.tmat_kernel(), *msl.Q_KERNELS]
        _LOADED[key] = {s.name: device.load(s.name, render(s, None, target).source) for s in specs}
    return _LOADED[key]


def _gemm(device, ks, kind, nb, rows, cols, depth, a, lda, sa, b, ldb, sb, c, ldc, sc):
    """One of plan/msl.GEMM_KINDS on operands (buffer, float offset)."""
    tile = msl.GEMM_TILE
    device.dispatch(ks[msl.gemm_name(kind)], (-(-cols // tile), -(-rows // tile), nb), msl.GEMM_THREADS,
                    (a[0], b[0], c[0]), (rows, cols, depth, lda, sa, ldb, sb, ldc, sc, a[1], b[1], c[1]),
                    msl.GEMM_TG_FLOATS)


def apply(device, target: Target, h, tau, c, nb: int, m: int, n: int, p: int, transpose: bool) -> None:
    """C (nb matrices of m x p on the device) ← Q·C, or Qᵀ·C with transpose, Q that of (h, tau), in place."""
    ks = kernels(device, target)
    k = min(m, n)
    blocks = [(c0, min(BLOCK, k - c0)) for c0 in range(0, k, BLOCK)]
    vt, zt = device.empty(nb * BLOCK * m), device.empty(nb * BLOCK * m)
    gram, tm = device.empty(nb * BLOCK * BLOCK), device.empty(nb * BLOCK * BLOCK)
    w = device.empty(nb * BLOCK * p)
    vs, gs = BLOCK * m, BLOCK * BLOCK
    for c0, width in (blocks if transpose else blocks[::-1]):
        rows = m - c0
        device.dispatch(ks["qr_vt"], (-(-rows // msl.VT_THREADS), 1, nb), msl.VT_THREADS, (h, vt),
                        (c0, width, rows, n, m * n, vs), 4)
        _gemm(device, ks, "gram", nb, width, width, rows, (vt, 0), rows, vs, (vt, 0), rows, vs, (gram, 0), width, gs)
        device.dispatch(ks["qr_tmat"], (1, 1, nb), 32 * -(-width // 32), (gram, tau, tm), (width, c0, gs, k), 4)
        # Z = T^T V^T (for Q·C: C -= (V T) V^T C) or T V^T (for Qᵀ·C: C -= (V T^T) V^T C), width x rows
        _gemm(device, ks, "project" if transpose else "aggregate", nb, width, rows, width, (tm, 0), width, gs,
              (vt, 0), rows, vs, (zt, 0), rows, vs)
        _gemm(device, ks, "project", nb, width, p, rows, (vt, 0), rows, vs, (c, c0 * p), p, m * p, (w, 0), p,
              BLOCK * p)
        _gemm(device, ks, "update", nb, rows, p, width, (zt, 0), rows, vs, (w, 0), p, BLOCK * p, (c, c0 * p), p, m * p)


def solve(device, target: Target, h, y, nb: int, m: int, n: int, p: int) -> None:
    """The first n rows of Y (nb matrices of m x p) ← R^-1 of them, R the upper triangle of h's first n rows."""
    ks = kernels(device, target)
    device.dispatch(ks["qr_trsm"], (-(-p // msl.TRSM_THREADS), 1, nb), msl.TRSM_THREADS, (h, y),
                    (n, n, m * n, p, m * p), 4)

