"""qrgen's functions on device arrays: geqrf, and with geqrf's array contract householder_product (Q), ormqr (Q or
Q^T times C without forming Q), qr (numpy.linalg.qr's modes) and lstsq, batched over any leading dimensions.

Inputs are float32 CUDA arrays (torch, CuPy or any __dlpack__ array); results are of the first input's kind, on its
device, queued on the caller's current stream; inputs are not modified. The algorithm of the Q functions is
qrgen.numerics.qmatrix's, which the CPU tests run on NumPy arrays (qrgen.numerics.reference has NumPy entry points);
qr's Q for schedules without wide aggregates comes instead from the factorization's own panels (a keep plan).
"""
from __future__ import annotations

import math

from .numerics import qmatrix
from .plan import tf32x3
from .run import device_ops, fastpath, metal_runtime, replay  # noqa: F401 (device_ops registers the GPU products)
from .run.arrays import as_device_array, on_caller_stream
from .run.factorizer import factor_device, run_wrapped
from .run.launch import device_target
from .run.registry import factorizer_for
from .schedule.files import check_precision


def geqrf(a, *, precision: str | None = None):
    """QR factorization of a batch: a is (..., m, n) float32 on a CUDA device (torch, CuPy or DLPack).

    Returns (h, tau) of a's kind, on its device and current stream, in LAPACK's geqrf convention: h holds R on
    and above the diagonal and the reflectors' tails below it; tau (..., min(m, n)) their scalars. a is not
    modified. Non-contiguous input is accepted (it is copied into h, which is always C-contiguous).
    precision: None runs the shape's schedule as it is (from 2048 columns that may mean tf32 inputs to the
    trailing update's products: within the accuracy gates, about 300 times the backward error of fp32); "fp32"
    runs the same schedule with every product from fp32 inputs.
    """
    if precision is None:
        out = fastpath.fast_geqrf(None, a)
        if out is not None:
            return out
    check_precision(precision)
    if metal_runtime.takes(a):  # MLX arrays, torch tensors on "mps": the Metal backend
        return metal_runtime.geqrf(a, precision=precision)
    arr = as_device_array(a)
    data = arr.data
    if data.ndim < 2:
        raise ValueError(f"qrgen.geqrf needs an array of shape (..., m, n); got shape {tuple(data.shape)}")
    m, n = data.shape[-2:]
    batch = math.prod(data.shape[:-2])
    if m == 0 or n == 0 or batch == 0:
        return run_wrapped(None, arr)
    fac = factorizer_for(m, n, batch, device_target(data.device.id), precision)
    return run_wrapped(fac, arr)


MODES = ("reduced", "complete", "r", "raw")
# qr forms Q from the factorization's kept panels (a rank-width update per panel, few launches) up to this many
# floats of Q, or for one panel; larger Qs, whose time is the GPU's, keep qrgen.qmatrix's blocks of 128 (fewer
# passes over Q). Schedules with aggregates keep their aggregates (64 or 128 wide in the committed schedules)
# instead, up to KEEP_MAX_AGGREGATE columns.
KEEP_MAX_FLOATS = 1 << 23
KEEP_MAX_AGGREGATE = 128


def keeps_q(schedule, launches: int, q_floats: int, exact: bool = False) -> bool:
    """Whether qr forms Q from a keep plan of `schedule` (run/sequence.drive_q) rather than from h and tau by
    qrgen.numerics.qmatrix. Only where every kept T comes from an fp32-class Gram matrix (Precision.gram fp32: the
    aggregates' G then fp32 or tf32x3), since Q's orthogonality is T's accuracy; then for aggregates, for one
    panel, or for a Q of up to KEEP_MAX_FLOATS floats; not for aggregates wider than KEEP_MAX_AGGREGATE
    (docs/decisions.md#keep-plans). exact (qr's precision="fp32"): not where Q's products would take tf32x3
    (plan/tf32x3.q_precision: aggregates of tf32x3.MIN columns or more), since every product is then to be fp32."""
    good_t = schedule.precision.gram == "fp32" or (
        not schedule.aggregate and all(p.variant == "lanes" for p in schedule.panels))
    aggregate = schedule.widest_aggregate
    if aggregate > KEEP_MAX_AGGREGATE or (exact and tf32x3.q_precision(aggregate) != "fp32"):
        return False
    return good_t and (bool(schedule.aggregate) or launches == 1 or q_floats <= KEEP_MAX_FLOATS)


def _arrays(**named):
    out = {}
    for name, value in named.items():
        arr = as_device_array(value)
        if arr.data.ndim < (1 if name in ("tau", "b") else 2):
            raise ValueError(f"{name} needs at least {1 if name in ('tau', 'b') else 2} dimensions; "
                             f"got shape {tuple(arr.data.shape)}")
        out[name] = arr
    devices = {arr.data.device.id for arr in out.values()}
    if len(devices) > 1:
        raise ValueError(f"all arrays must be on one device; got devices {sorted(devices)}")
    return out


def _factorizer(m: int, n: int, batch: int, device: int, factorizer=None, precision: str | None = None):
    if not (batch and m and n):
        return None
    if factorizer is not None:
        return factorizer
    return factorizer_for(m, n, batch, device_target(device), precision)


def _check_shape(m: int, n: int, factorizer, what: str = "a") -> None:
    if factorizer is not None and (m, n) != (factorizer.m, factorizer.n):
        raise ValueError(f"this module is generated for {factorizer.m}x{factorizer.n} matrices; {what} holds {m}x{n}")


def _check_tau(h, tau):
    m, n = h.shape[-2:]
    if tau.shape != h.shape[:-2] + (min(m, n),):
        raise ValueError(f"tau must have shape {h.shape[:-2] + (min(m, n),)} for h of shape {tuple(h.shape)}; "
                         f"got {tuple(tau.shape)}")


def householder_product(h, tau, complete: bool = False, *, precision: str | None = None, factorizer=None):
    """Q of a geqrf result: (..., m, min(m, n)), or (..., m, m) with complete=True. precision: None (the products
    that apply blocks of 64 reflectors or more to Q in tf32x3, near fp32's accuracy and faster:
    docs/decisions.md#q-products-tf32x3) or "fp32" (every product in fp32, cuBLAS). (`factorizer`: a generated module's, which checks the
    shape.)"""
    check_precision(precision)
    if metal_runtime.takes(h):
        return metal_runtime.householder_product(h, tau, complete)
    arrs = _arrays(h=h, tau=tau)
    hd, td = arrs["h"].data, arrs["tau"].data
    _check_tau(hd, td)
    m, n = hd.shape[-2:]
    _check_shape(m, n, factorizer, "h")
    lead = hd.shape[:-2]
    batch = math.prod(lead)
    with on_caller_stream(arrs["h"]) as stream:
        (q,) = replay.call(("householder_product", complete, precision),
                           lambda s, h3, t2: (qmatrix.householder_product(h3, t2, complete,
                                                                          precision=_q_precision(precision)),),
                           (hd.reshape(batch, m, n), td.reshape(batch, -1)), stream)
    return arrs["h"].wrap(q.reshape(*lead, m, q.shape[-1]))


def ormqr(h, tau, c, side: str = "L", transpose: bool = False, *, left: bool | None = None, factorizer=None):
    """op(Q) C (side "L", C of shape (..., m, p)) or C op(Q) (side "R", C of shape (..., p, m)), op(Q) = Q^T when
    transpose, without forming Q; `left` as torch.ormqr takes it (True: side "L", False: "R")."""
    side = side if left is None else ("L" if left else "R")
    if side not in qmatrix.SIDES:
        raise ValueError(f"side must be one of {qmatrix.SIDES}, got {side!r}")
    if metal_runtime.takes(h):
        return metal_runtime.ormqr(h, tau, c, side, transpose)
    arrs = _arrays(h=h, tau=tau, c=c)
    hd, td, cd = arrs["h"].data, arrs["tau"].data, arrs["c"].data
    _check_tau(hd, td)
    m, n = hd.shape[-2:]
    _check_shape(m, n, factorizer, "h")
    lead = hd.shape[:-2]
    axis = -2 if side == "L" else -1
    if cd.shape[:-2] != lead or cd.shape[axis] != m:
        want = "(..., m, p)" if side == "L" else "(..., p, m)"
        raise ValueError(f"c must have shape {want} with the leading dimensions of h {tuple(lead)} and m = {m}; "
                         f"got {tuple(cd.shape)}")
    batch = math.prod(lead)
    with on_caller_stream(arrs["h"]) as stream:
        (out,) = replay.call(("ormqr", side, transpose),
                             lambda s, h3, t2, c3: (qmatrix.apply_q(h3, t2, c3, side, transpose),),
                             (hd.reshape(batch, m, n), td.reshape(batch, -1), cd.reshape(batch, *cd.shape[-2:])),
                             stream)
    return arrs["h"].wrap(out.reshape(cd.shape))


def qr(a, mode: str = "reduced", *, precision: str | None = None, factorizer=None):
    """numpy.linalg.qr's modes, batched: "reduced" (Q (..., m, k), R (..., k, n)), "complete" (Q (..., m, m),
    R (..., m, n)), "r" (R (..., k, n) alone, as NumPy returns it) and "raw" ((h, tau) with h as NumPy gives it,
    (..., n, m): the transpose of geqrf's h, a view without copy). precision: as for qrgen.geqrf."""
    if mode == "reduced" and precision is None:
        out = fastpath.fast_qr(factorizer, a)  # one launch, where an earlier call on this device prepared it
        if out is not None:
            return out
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_precision(precision)
    if metal_runtime.takes(a):
        return metal_runtime.qr(a, mode, precision=precision)
    arr = _arrays(a=a)["a"]
    data = arr.data
    m, n = data.shape[-2:]
    _check_shape(m, n, factorizer)
    lead = data.shape[:-2]
    batch = math.prod(lead)
    fac = _factorizer(m, n, batch, data.device.id, factorizer, precision)
    if mode == "reduced" and fac is not None and fac.fused_q is not None:  # Q and R in one launch
        with on_caller_stream(arr) as stream:
            q, r = fac.run_qr(data.reshape(batch, m, n), stream)
        return arr.wrap(q.reshape(*lead, m, n)), arr.wrap(r.reshape(*lead, n, n))
    qcols = m if mode == "complete" else min(m, n)
    if fac is None or mode == "raw":
        h, tau = factor_device(fac, arr)
        if mode == "raw":
            return arr.wrap(h.swapaxes(-1, -2)), arr.wrap(tau)
        with on_caller_stream(arr):
            out = _q_and_r(h.reshape(batch, m, n), tau.reshape(batch, -1), mode, precision)
    else:
        keep = None
        if mode in ("reduced", "complete") and keeps_q(fac.schedule, len(fac.launches), batch * m * qcols,
                                                         precision == "fp32"):
            keep = fac.keep_variant()

        def run(stream, x):
            if keep is None:
                return _q_and_r(*fac.run(x, stream), mode, precision)
            import cupy  # Q from the factorization's kept panels or aggregates: two GEMMs each (drive_q)

            q = cupy.zeros((batch, m, qcols), dtype=cupy.float32)
            qmatrix.set_diagonal(q, 1)
            h, _ = keep.run(x, stream, q=q)
            return q, qmatrix.r_factor(h, complete=mode == "complete")

        with on_caller_stream(arr) as stream:
            out = replay.call(("qr", fac.serial, mode, precision), run, (data.reshape(batch, m, n),), stream, fac)
    r = arr.wrap(out[-1].reshape(*lead, -1, n))
    return r if mode == "r" else (arr.wrap(out[0].reshape(*lead, m, qcols)), r)


def _q_and_r(h, tau, mode: str, precision: str | None) -> tuple:
    """qr's results from geqrf's h (batch, m, n) and tau (batch, k): (r,) for mode "r", else (q, r)."""
    r = qmatrix.r_factor(h, complete=mode == "complete")
    if mode == "r":
        return (r,)
    return qmatrix.householder_product(h, tau, mode == "complete", precision=_q_precision(precision)), r


def _q_precision(precision: str | None) -> str:
    """householder_product's products for qr's or householder_product's precision argument: tf32x3 unless every
    product is to be fp32 (docs/decisions.md#q-products-tf32x3)."""
    return "fp32" if precision == "fp32" else "tf32x3"


def lstsq(a, b, *, precision: str | None = None, factorizer=None):
    """Least squares for full-rank tall (or square) a (..., m, n): x minimizing ||a x - b||, with b (..., m) or
    (..., m, p); returns (x, residual), residual the squared norm of a x - b per right-hand side. precision: as
    for qrgen.geqrf (the error of x grows with a's condition number times the factorization's backward error)."""
    check_precision(precision)
    if metal_runtime.takes(a):
        return metal_runtime.lstsq(a, b, precision=precision)
    arrs = _arrays(a=a, b=b)
    ad, bd = arrs["a"].data, arrs["b"].data
    m, n = ad.shape[-2:]
    _check_shape(m, n, factorizer)
    vector = qmatrix.lstsq_shapes(tuple(ad.shape), tuple(bd.shape))
    lead = ad.shape[:-2]
    batch = math.prod(lead)
    fac = _factorizer(m, n, batch, ad.device.id, factorizer, precision)
    if fac is None:
        h, tau = factor_device(fac, arrs["a"])
    with on_caller_stream(arrs["a"]) as stream:
        rhs = bd.reshape(batch, m, 1) if vector else bd.reshape(batch, m, -1)
        if fac is None:
            x, res = qmatrix.lstsq(h.reshape(batch, m, n), tau.reshape(batch, -1), rhs)
        else:
            def run(s, a3, b3):
                return qmatrix.lstsq(*fac.run(a3, s), b3)

            x, res = replay.call(("lstsq", fac.serial), run, (ad.reshape(batch, m, n), rhs), stream, fac)
        x = x.reshape(*lead, n) if vector else x.reshape(*lead, n, -1)
        res = res.reshape(*lead) if vector else res.reshape(*lead, -1)
    return arrs["a"].wrap(x), arrs["a"].wrap(res)
