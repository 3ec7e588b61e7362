"""qrgen's top-level functions: a torch tensor that autograd or torch.compile needs goes to the custom ops
(qrgen.torch, torch.ops.qrgen), everything else to qrgen.api, the same kernels without the ops' dispatch cost."""
from __future__ import annotations

import functools

from . import api

TORCH_FACE = None  # qrgen.torch once loaded; False where it cannot load (a torch before 2.4)


def load_torch_face():
    """Import qrgen.torch (registering the custom ops) and keep it here."""
    global TORCH_FACE
    from . import torch as face

    TORCH_FACE = face
    return face


def torch_face(*args, factorizer=None):
    """qrgen.torch where these arguments go to its custom ops (qrgen.torch.routes), else None; the first torch
    tensor seen loads it (a torch without custom ops, before 2.4: qrgen.api, without autograd). A generated
    module's calls (factorizer) run qrgen.api."""
    if factorizer is not None:
        return None
    global TORCH_FACE
    face = TORCH_FACE
    if face is None:
        if not type(args[0]).__module__.startswith("torch"):
            return None
        try:
            face = load_torch_face()
        except ImportError:
            face = TORCH_FACE = False
    return face if face and face.routes(*args) else None


@functools.wraps(api.geqrf)
def geqrf(a, *, precision: str | None = None):
    face = torch_face(a)
    return api.geqrf(a, precision=precision) if face is None else face.geqrf(a, precision=precision)


@functools.wraps(api.qr)
def qr(a, mode: str = "reduced", *, precision: str | None = None, factorizer=None):
    face = torch_face(a, factorizer=factorizer)
    if face is None:
        return api.qr(a, mode, precision=precision, factorizer=factorizer)
    return face.qr(a, mode, precision=precision)


@functools.wraps(api.householder_product)
def householder_product(h, tau, complete: bool = False, *, precision: str | None = None, factorizer=None):
    face = torch_face(h, tau, factorizer=factorizer)
    if face is None:
        return api.householder_product(h, tau, complete, precision=precision, factorizer=factorizer)
    return face.householder_product(h, tau, complete, precision=precision)


@functools.wraps(api.ormqr)
def ormqr(h, tau, c, side: str = "L", transpose: bool = False, *, left: bool | None = None, factorizer=None):
    face = torch_face(h, tau, c, factorizer=factorizer)
    if face is None:
        return api.ormqr(h, tau, c, side, transpose, left=left, factorizer=factorizer)
    return face.ormqr(h, tau, c, side, transpose, left=left)


@functools.wraps(api.lstsq)
def lstsq(a, b, *, precision: str | None = None, factorizer=None):
    face = torch_face(a, b, factorizer=factorizer)
    if face is None:
        return api.lstsq(a, b, precision=precision, factorizer=factorizer)
    return face.lstsq(a, b, precision=precision)
