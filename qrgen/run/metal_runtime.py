"""qrgen's functions (geqrf, qr, householder_product, ormqr, lstsq) on the arrays Apple users hold: MLX arrays and
torch tensors on "mps" (and, with an explicit device, NumPy arrays), run by the Metal engine on the Mac's GPU
(run/metal_mac.py), the results of the input's kind. The factorizer of each (shape, target, keep) is made once per
device and kept. Tests pass one of the translation layers (run/msl_devices.py) as the device: everything here but
the Mac device itself runs in CI.

geqrf copies nothing through the host where the device can wrap the memory of the input and of new arrays of its
kind (device.wrap: an MLX array's unified memory on a Mac, NumPy's on the CPU layer): the input is copied into the
new h on the device and factored there, tau written in place. Elsewhere (torch tensors on "mps", whose storage
pointer is an MTLBuffer handle in some torch versions and the memory's address in others, with no public way to
tell; a non-contiguous input; memory Metal will not wrap) and in the other functions, arrays are copied in and
out."""
from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np

from ..problem import Problem
from ..schedule import apple
from ..schedule.files import find
from ..schedule.model import Precision
from ..targets import Target
from . import metal_engine, metal_q

_FACTORIZERS: dict = {}


def takes(a) -> bool:
    """Whether an input is one of the Metal runtime's: an MLX array, or a torch tensor on "mps"."""
    module = type(a).__module__
    if module.startswith("mlx"):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor) and a.device.type == "mps"


def _host(a) -> tuple[np.ndarray, object]:
    """(float32 NumPy copy of the input, a function giving an array of the input's kind from a NumPy array)."""
    module = type(a).__module__
    if module.startswith("mlx"):
        import mlx.core as mx

        if a.dtype != mx.float32:
            raise TypeError(f"qrgen takes float32 arrays; got an MLX array of {a.dtype}")
        return np.array(a, copy=True), mx.array
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        if a.dtype != torch.float32:
            raise TypeError(f"qrgen takes float32 tensors; got {a.dtype}")
        if a.requires_grad and torch.is_grad_enabled():
            raise ValueError("qrgen on Metal has no gradients yet: call it under torch.no_grad() or on a.detach()")
        device = a.device
        return a.detach().cpu().numpy(), lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(device)
    if isinstance(a, np.ndarray):
        if a.dtype != np.float32:
            raise TypeError(f"qrgen takes float32 arrays; got {a.dtype}")
        return np.array(a), np.asarray
    raise TypeError(f"the Metal runtime takes MLX arrays, torch tensors on 'mps' or NumPy arrays; got {module}")


def metal_device(device=None):
    if device is not None:
        return device
    from . import metal_mac

    if not metal_mac.available():
        raise RuntimeError("no Metal device: qrgen's Metal runtime needs macOS with an Apple GPU and PyObjC "
                           "(pip install pyobjc-framework-Metal)")
    return metal_mac.shared_device()


def _target(device, target: Target | None) -> Target:
    """The target given, else the device's GPU family (a translation layer's: the engine's default)."""
    return target or Target("metal", getattr(device, "family", metal_engine.APPLE.arch))


def factorizer(m: int, n: int, batch: int, device, target: Target | None = None, keep: bool = False,
               precision: str | None = None):
    """The Metal factorizer of a shape on a device, made once; precision "fp32": its schedule with every product's
    inputs in fp32 (None: as the schedule says)."""
    target = _target(device, target)
    key = (m, n, batch, target, keep, id(device), precision)
    fac = _FACTORIZERS.get(key)
    if fac is None:
        schedule, _ = find(Problem(m, n, batch), target)
        if keep and any(p.variant == "whole" for p in schedule.panels):  # keeps no reflectors for Q
            schedule = apple.panel_schedule(Problem(m, n, batch), target)
        if precision == "fp32":
            schedule = dataclasses.replace(schedule, precision=Precision())
        fac = _FACTORIZERS[key] = metal_engine.MetalFactorizer(schedule, device, target, keep)
    return fac


def _view(a) -> np.ndarray | None:
    """A NumPy view of a float32 input's memory (no copy), or None where there is none to be had."""
    if type(a).__module__.startswith("mlx"):
        import mlx.core as mx

        if a.dtype != mx.float32:
            return None
        mx.eval(a)
        return np.array(a, copy=False)  # MLX's buffer protocol: the array's own (unified) memory
    return a if isinstance(a, np.ndarray) and a.dtype == np.float32 else None


def _new(a, shape: tuple):
    """A new float32 array of a's kind and its NumPy view (no copy), or None."""
    if type(a).__module__.startswith("mlx"):
        import mlx.core as mx

        out = mx.zeros(shape, dtype=mx.float32)
        mx.eval(out)
        return out, np.array(out, copy=False)
    if isinstance(a, np.ndarray):
        out = np.empty(shape, dtype=np.float32)
        return out, out
    return None


def _geqrf_in_place(a, dev, target, fac, precision):
    """geqrf without host copies (the module's docstring), or None where the memory cannot be wrapped."""
    view = _view(a)
    if view is None or view.ndim < 2 or 0 in view.shape:
        return None
    lead, (m, n) = view.shape[:-2], view.shape[-2:]
    nb = math.prod(lead)
    if fac is not None and (fac.m, fac.n) != (m, n):
        return None
    outputs = _new(a, view.shape), _new(a, lead + (min(m, n),))
    if None in outputs:
        return None
    (h_out, h_view), (tau_out, tau_view) = outputs
    src, h, tau = dev.wrap(view), dev.wrap(h_view), dev.wrap(tau_view)
    if src is None or h is None or tau is None:
        return None
    fac = fac or factorizer(m, n, nb, dev, target, precision=precision)
    dev.copy(src, h)
    metal_engine.factor_in(fac, h, tau, nb)
    dev.synchronize()
    return h_out, tau_out


def _batched(a):
    host, back = _host(a)
    if host.ndim < 2 or 0 in host.shape:
        raise ValueError(f"qrgen needs an array of shape (..., m, n) with m, n and the batch at least 1; got "
                         f"shape {host.shape}")
    lead, (m, n) = host.shape[:-2], host.shape[-2:]
    return host.reshape(math.prod(lead), m, n), lead, back


def geqrf(a, device=None, target: Target | None = None, fac=None, precision: str | None = None):
    """(h, tau) of a (..., m, n) float32 array on the Metal GPU, of the input's kind (fac: a factorizer of a
    generated module, for its shape; precision: as qrgen.geqrf's)."""
    dev = fac.device if fac is not None else metal_device(device)
    done = _geqrf_in_place(a, dev, target, fac, precision)
    if done is not None:
        return done
    x, lead, back = _batched(a)
    if fac is not None and (fac.m, fac.n) != x.shape[1:]:
        raise ValueError(f"this module factors {fac.m}x{fac.n} matrices; got {x.shape[1]}x{x.shape[2]}")
    fac = fac or factorizer(x.shape[1], x.shape[2], x.shape[0], dev, target, precision=precision)
    h, tau = metal_engine.geqrf(x, dev, fac.schedule, fac.target, factorizer=fac)
    return back(h.reshape(lead + h.shape[1:])), back(tau.reshape(lead + tau.shape[1:]))


def qr(a, mode: str = "reduced", device=None, target: Target | None = None, precision: str | None = None):
    """numpy.linalg.qr's "reduced", "complete" and "r" modes on the Metal GPU, of the input's kind."""
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qrgen.qr on Metal takes mode 'reduced', 'complete' or 'r'; got {mode!r}")
    x, lead, back = _batched(a)
    dev = metal_device(device)
    if mode == "r":
        fac = factorizer(x.shape[1], x.shape[2], x.shape[0], dev, target, precision=precision)
        h, _ = metal_engine.geqrf(x, dev, fac.schedule, fac.target, factorizer=fac)
        k = min(x.shape[1:])
        return back(np.triu(h[:, :k, :]).reshape(lead + (k, x.shape[2])))
    fac = factorizer(x.shape[1], x.shape[2], x.shape[0], dev, target, keep=True, precision=precision)
    q, r = metal_engine.qr(x, dev, fac.schedule, fac.target, complete=mode == "complete", factorizer=fac)
    return back(q.reshape(lead + q.shape[1:])), back(r.reshape(lead + r.shape[1:]))


def _factor_pair(h, tau):
    hh, lead, back = _batched(h)
    th, _ = _host(tau)
    k = min(hh.shape[1:])
    if th.shape != lead + (k,):
        raise ValueError(f"tau must have shape {lead + (k,)} for h of shape {lead + hh.shape[1:]}; got {th.shape}")
    return hh, th.reshape(-1, k), lead, back


def householder_product(h, tau, complete: bool = False, device=None, target: Target | None = None):
    """Q (..., m, min(m, n)), or (..., m, m) with complete, of geqrf's (h, tau) on the Metal GPU."""
    hh, th, lead, back = _factor_pair(h, tau)
    nb, m, n = hh.shape
    dev = metal_device(device)
    target = _target(dev, target)
    cols = m if complete else min(m, n)
    hd, td, q = dev.array(hh.reshape(-1)), dev.array(th.reshape(-1)), dev.array(metal_engine.identity(nb, m, cols))
    metal_q.apply(dev, target, hd, td, q, nb, m, n, cols, transpose=False)
    return back(dev.to_host(q)[:nb * m * cols].reshape(lead + (m, cols)))


def ormqr(h, tau, c, side: str = "L", transpose: bool = False, device=None, target: Target | None = None):
    """op(Q) C (side "L", C (..., m, p)) or C op(Q) (side "R", C (..., p, m)), op(Q) = Q^T with transpose."""
    if side not in ("L", "R"):
        raise ValueError(f"side must be 'L' or 'R', got {side!r}")
    hh, th, lead, back = _factor_pair(h, tau)
    cc, clead, _ = _batched(c)
    nb, m, n = hh.shape
    if clead != lead or cc.shape[1 if side == "L" else 2] != m:
        raise ValueError(f"c must have shape {'(..., m, p)' if side == 'L' else '(..., p, m)'} with h's leading "
                         f"dimensions {lead} and m = {m}; got {clead + cc.shape[1:]}")
    # C op(Q) = (op(Q)^T C^T)^T
    x = cc if side == "L" else np.ascontiguousarray(np.swapaxes(cc, 1, 2))
    dev = metal_device(device)
    target = _target(dev, target)
    p = x.shape[2]
    hd, td, xd = dev.array(hh.reshape(-1)), dev.array(th.reshape(-1)), dev.array(x.reshape(-1))
    metal_q.apply(dev, target, hd, td, xd, nb, m, n, p, transpose if side == "L" else not transpose)
    out = dev.to_host(xd)[:nb * m * p].reshape(nb, m, p)
    out = out if side == "L" else np.swapaxes(out, 1, 2)
    return back(np.ascontiguousarray(out).reshape(lead + out.shape[1:]))


def lstsq(a, b, device=None, target: Target | None = None, precision: str | None = None):
    """Least squares for full-rank tall or square a (..., m, n), b (..., m) or (..., m, p): (x, residual), the
    residual the squared norm of a x - b per right-hand side."""
    x3, lead, back = _batched(a)
    bh, _ = _host(b)
    nb, m, n = x3.shape
    if m < n:
        raise ValueError(f"lstsq needs m >= n (full-rank tall or square systems); got {m}x{n}")
    vector = bh.ndim == len(lead) + 1
    if (bh.shape[:-1] if vector else bh.shape[:-2]) != lead or bh.shape[-1 if vector else -2] != m:
        raise ValueError(f"b must have shape (..., m) or (..., m, p) with a's leading dimensions {lead} and m = {m}; "
                         f"got {bh.shape}")
    rhs = np.ascontiguousarray(bh.reshape(nb, m, -1), dtype=np.float32)
    p = rhs.shape[2]
    dev = metal_device(device)
    fac = factorizer(m, n, nb, dev, target, precision=precision)
    engine = metal_engine.factor(fac, x3)
    hd, td = engine.buffers["h"], engine.buffers["tau"]
    yd = dev.array(rhs.reshape(-1))
    metal_q.apply(dev, fac.target, hd, td, yd, nb, m, n, p, transpose=True)
    metal_q.solve(dev, fac.target, hd, yd, nb, m, n, p)
    y = dev.to_host(yd)[:nb * m * p].reshape(nb, m, p)
    x, res = y[:, :n, :], np.sum(y[:, n:, :].astype(np.float64) ** 2, axis=1).astype(np.float32)
    x = x.reshape(lead + (n,)) if vector else x.reshape(lead + (n, p))
    res = res.reshape(lead) if vector else res.reshape(lead + (p,))
    return back(np.ascontiguousarray(x)), back(res)
