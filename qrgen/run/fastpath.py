"""The fast lane: calls whose whole work is one kernel launch (20 x 32² and the like), where the general path's
host time (DLPack in and out, stream objects, workspace lookups) would exceed the kernel's
(docs/decisions.md#fast-lane). Only for what needs nothing more: a C-contiguous float32 torch.Tensor or
cupy.ndarray (not subclasses) on the current device, a shape whose factorizer is made and has run on this device,
batch and stream. Everything else, the first call included, takes the general path, which checks it."""
from __future__ import annotations

import math
import sys

import numpy as np

from .arrays import torch_stream
from .launch import known_target
from .registry import made

_F32 = np.dtype(np.float32)


def _fast_view(a):
    """(pointer, shape, device, stream pointer, empty) of an input the fast lane takes, else None; empty(shape)
    returns (array of the input's kind, its pointer), allocated as the input's library allocates on that stream."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(a) is cupy.ndarray:
        if a.dtype is not _F32 or a.ndim < 2 or not a.flags.c_contiguous or not a.size:
            return None
        device = a.data.device_id
        if cupy.cuda.runtime.getDevice() != device:
            return None
        return a.data.ptr, a.shape, device, cupy.cuda.get_current_stream().ptr, _cupy_empty
    torch = sys.modules.get("torch")
    if torch is None or type(a) is not torch.Tensor or cupy is None:
        return None
    if (a.dtype is not torch.float32 or not a.is_cuda or a.dim() < 2 or not a.is_contiguous() or not a.numel()
            or a.is_neg()):
        return None
    device = a.get_device()
    if cupy.cuda.runtime.getDevice() != device:
        return None
    stream = torch_stream(torch, device)

    def empty(shape, dev=a.device):
        out = torch.empty(shape, dtype=torch.float32, device=dev)
        return out, out.data_ptr()

    return a.data_ptr(), tuple(a.shape), device, stream, empty


def _cupy_empty(shape):
    import cupy

    out = cupy.empty(shape, dtype=cupy.float32)
    return out, out.data.ptr


def _fast_target(fac, a):
    """(factorizer, pointer, shape, device, stream pointer, empty) of a call the fast lane may take (_fast_view),
    the factorizer being the given one (a generated module's) if its shape matches, else qrgen.geqrf's for the
    device; None where there is none (not made yet) or the input is not for the fast lane."""
    view = _fast_view(a)
    if view is None:
        return None
    ptr, shape, device, stream, empty = view
    m, n = shape[-2:]
    if fac is None:
        target = known_target(device)
        fac = None if target is None else made(m, n, math.prod(shape[:-2]), target)
    elif (fac.m, fac.n) != (m, n):
        fac = None
    return None if fac is None else (fac, ptr, shape, device, stream, empty)


def fast_geqrf(fac, a):
    """(h, tau) by the fast lane, or None where the general path is to run."""
    target = _fast_target(fac, a)
    if target is None or not target[0].one_launch:
        return None
    fac, ptr, shape, device, stream, empty = target
    batch = math.prod(shape[:-2])
    ws = fac.direct_workspace(ptr, batch, device, stream)
    if ws is None:
        return None
    h, h_ptr = empty(shape)
    tau, tau_ptr = empty(shape[:-2] + (fac.k,))
    fac.launch_direct(ws, ptr, batch, device, stream, h_ptr, tau_ptr)
    return h, tau


def fast_qr(fac, a):
    """qr's reduced (q, r) by the fast lane (the fused kernel), or None where the general path is to run."""
    target = _fast_target(fac, a)
    if target is None or target[0].fused_q is None:
        return None
    fac, ptr, shape, device, stream, empty = target
    if device not in fac.q_args or ptr % (4 * fac.direct_vec):
        return None
    q, q_ptr = empty(shape)
    r, r_ptr = empty(shape[:-2] + (fac.n, fac.n))
    fac.launch_qr(device, math.prod(shape[:-2]), ptr, q_ptr, r_ptr, stream)
    return q, r
