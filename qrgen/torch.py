"""qrgen inside PyTorch programs: geqrf, qr, householder_product, ormqr and lstsq as torch.library custom ops
(torch.ops.qrgen.*) with fake kernels, so that torch.compile traces them without a graph break and CUDA graphs
(torch.cuda.graph, mode="reduce-overhead") capture them, and with autograd for qr and householder_product by the
formulas torch uses for torch.linalg.qr and torch.linalg.householder_product.

The functions here take and return torch tensors. qrgen.geqrf and the other top-level functions (qrgen.functions)
route a torch tensor here whenever autograd or torch.compile needs the op (an input that requires grad with grad
mode on, or tracing); otherwise they run qrgen.api, the same kernels, without the op's dispatch cost. Importing this
module registers the ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import api

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"qrgen.torch needs torch 2.4 or newer (torch.library.custom_op); this is torch "
                      f"{torch.__version__}")

Tensor = torch.Tensor


# ---- the ops -------------------------------------------------------------------------------------------------------

@torch.library.custom_op("qrgen::geqrf", mutates_args=())
def _geqrf(a: Tensor, precision: Optional[str] = None) -> tuple[Tensor, Tensor]:
    return api.geqrf(a, precision=precision)


@_geqrf.register_fake
def _(a, precision=None):
    _check_fake(a, "a")
    m, n = a.shape[-2:]
    return a.new_empty(a.shape), a.new_empty((*a.shape[:-2], min(m, n)))


@torch.library.custom_op("qrgen::qr", mutates_args=())
def _qr(a: Tensor, mode: str = "reduced", precision: Optional[str] = None) -> tuple[Tensor, Tensor]:
    return api.qr(a, mode, precision=precision)


@_qr.register_fake
def _(a, mode="reduced", precision=None):
    _check_fake(a, "a")
    if mode not in ("reduced", "complete"):
        raise ValueError(f"torch.ops.qrgen.qr takes mode 'reduced' or 'complete'; got {mode!r}")
    m, n = a.shape[-2:]
    rows = m if mode == "complete" else min(m, n)
    return a.new_empty((*a.shape[:-2], m, rows)), a.new_empty((*a.shape[:-2], rows, n))


@torch.library.custom_op("qrgen::householder_product", mutates_args=())
def _householder_product(h: Tensor, tau: Tensor, complete: bool = False, precision: Optional[str] = None) -> Tensor:
    return api.householder_product(h, tau, complete, precision=precision)


@_householder_product.register_fake
def _(h, tau, complete=False, precision=None):
    _check_fake(h, "h")
    m, n = h.shape[-2:]
    return h.new_empty((*h.shape[:-2], m, m if complete else min(m, n)))


@torch.library.custom_op("qrgen::ormqr", mutates_args=())
def _ormqr(h: Tensor, tau: Tensor, c: Tensor, side: str = "L", transpose: bool = False) -> Tensor:
    return api.ormqr(h, tau, c, side, transpose)


@_ormqr.register_fake
def _(h, tau, c, side="L", transpose=False):
    _check_fake(h, "h")
    return c.new_empty(c.shape)


@torch.library.custom_op("qrgen::lstsq", mutates_args=())
def _lstsq(a: Tensor, b: Tensor, precision: Optional[str] = None) -> tuple[Tensor, Tensor]:
    return api.lstsq(a, b, precision=precision)


@_lstsq.register_fake
def _(a, b, precision=None):
    _check_fake(a, "a")
    n = a.shape[-1]
    if b.dim() == a.dim() - 1:
        return b.new_empty((*b.shape[:-1], n)), b.new_empty(b.shape[:-1])
    return b.new_empty((*b.shape[:-2], n, b.shape[-1])), b.new_empty((*b.shape[:-2], b.shape[-1]))


def _check_fake(x, name: str) -> None:
    """What the kernels would refuse, said while tracing."""
    if x.dtype != torch.float32 or x.device.type != "cuda" or x.dim() < 2:
        raise TypeError(f"qrgen's ops take float32 CUDA tensors of shape (..., m, n); {name} is {x.dtype} on "
                        f"{x.device} with shape {tuple(x.shape)}")


# ---- autograd ------------------------------------------------------------------------------------------------------

def _syminvadj(x: Tensor) -> Tensor:
    """X + X^H with its diagonal halved (the adjoint of the map from a triangle to its symmetric part)."""
    out = x + x.mH
    out.diagonal(dim1=-2, dim2=-1).mul_(0.5)
    return out


def _qr_backward_tall(gq, gr, q, r):
    """A's gradient where A = QR with m >= n, reduced (torch's linalg_qr_backward):
    gA = (gQ + Q syminvadj(triu(gR R^H - Q^H gQ))) R^{-H}."""
    k = r.shape[-2]
    m_ = gr @ r.mH if gr is not None else r.new_zeros((*r.shape[:-2], k, k))
    if gq is not None:
        m_ = m_ - q.mH @ gq
    ga = q @ _syminvadj(m_.triu())
    if gq is not None:
        ga = ga + gq
    return torch.linalg.solve_triangular(r.mH, ga, upper=False, left=False)


def _qr_setup(ctx, inputs, output):
    ctx.mode = inputs[1]
    ctx.save_for_backward(*output)


def _qr_backward(ctx, gq, gr):
    q, r = ctx.saved_tensors
    m, n = q.shape[-2], r.shape[-1]
    if ctx.mode == "complete" and m > n:
        raise RuntimeError("the derivative of qr with mode='complete' is not defined for m > n (nor in "
                           "torch.linalg.qr): use mode='reduced'")
    if m >= n:
        return _qr_backward_tall(gq, gr, q, r), None, None
    # m < n: A = [X | Y] with X = Q U square, Y = Q V: the square case for X with gQ + Y gV^H, and gY = Q gV
    u, v = r[..., :m], r[..., m:]
    gu = gr[..., :m] if gr is not None else None
    if gr is not None:
        gv = gr[..., m:]
        gq = (q @ v) @ gv.mH if gq is None else gq + (q @ v) @ gv.mH
        gy = q @ gv
    else:
        gy = torch.zeros_like(v)
    return torch.cat([_qr_backward_tall(gq, gu, q, u), gy], dim=-1), None, None


torch.library.register_autograd("qrgen::qr", _qr_backward, setup_context=_qr_setup)


def _hp_setup(ctx, inputs, output):
    h, tau, complete, _ = inputs
    ctx.complete = complete
    ctx.save_for_backward(h, tau)


def _hp_backward(ctx, gq):
    """torch's own derivative of torch.linalg.householder_product, on the same h and tau (complete: h widened to m
    columns whose reflectors have tau = 0, the identity)."""
    h, tau = ctx.saved_tensors
    m, n = h.shape[-2:]
    with torch.enable_grad():
        hh, tt = h.detach().requires_grad_(), tau.detach().requires_grad_()
        x, t = hh[..., :min(m, n)], tt
        if ctx.complete and x.shape[-1] < m:
            x = torch.nn.functional.pad(x, (0, m - x.shape[-1]))
            t = torch.nn.functional.pad(t, (0, m - t.shape[-1]))
        q = torch.linalg.householder_product(x, t)
        gh, gt = torch.autograd.grad(q, (hh, tt), gq)
    return gh, gt, None, None


torch.library.register_autograd("qrgen::householder_product", _hp_backward, setup_context=_hp_setup)


def _no_derivative(name: str, instead: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"qrgen.{name} has no derivative (torch has none for geqrf either): {instead}")
    return backward


for _name, _instead in (("geqrf", "differentiate qrgen.qr, or qrgen.householder_product of h and tau"),
                        ("ormqr", "form Q with qrgen.householder_product (differentiable) and multiply"),
                        ("lstsq", "solve with qrgen.qr (differentiable) and torch.linalg.solve_triangular")):
    torch.library.register_autograd(f"qrgen::{_name}", _no_derivative(_name, _instead))


# ---- the functions -------------------------------------------------------------------------------------------------

def geqrf(a: Tensor, *, precision: str | None = None) -> tuple[Tensor, Tensor]:
    """qrgen.geqrf as a custom op (torch.ops.qrgen.geqrf)."""
    return torch.ops.qrgen.geqrf(a, precision)


def qr(a: Tensor, mode: str = "reduced", *, precision: str | None = None):
    """qrgen.qr as a custom op; differentiable for "reduced" (and "complete" with m <= n), as torch.linalg.qr."""
    if mode in ("reduced", "complete"):
        return torch.ops.qrgen.qr(a, mode, precision)
    if mode not in api.MODES:
        raise ValueError(f"mode must be one of {api.MODES}, got {mode!r}")
    h, tau = torch.ops.qrgen.geqrf(a, precision)
    if mode == "raw":
        return h.transpose(-1, -2), tau
    return h[..., :min(a.shape[-2:]), :].triu()


def householder_product(h: Tensor, tau: Tensor, complete: bool = False, *, precision: str | None = None) -> Tensor:
    """qrgen.householder_product as a custom op; differentiable in h and tau."""
    return torch.ops.qrgen.householder_product(h, tau, complete, precision)


def ormqr(h: Tensor, tau: Tensor, c: Tensor, side: str = "L", transpose: bool = False, *,
          left: bool | None = None) -> Tensor:
    """qrgen.ormqr as a custom op."""
    return torch.ops.qrgen.ormqr(h, tau, c, side if left is None else ("L" if left else "R"), transpose)


def lstsq(a: Tensor, b: Tensor, *, precision: str | None = None) -> tuple[Tensor, Tensor]:
    """qrgen.lstsq as a custom op."""
    return torch.ops.qrgen.lstsq(a, b, precision)


def routes(*tensors) -> bool:
    """Whether qrgen's top-level functions hand these arguments to the ops: while torch.compile traces, or where
    autograd would record the call. Tensors on "mps" never: the Metal runtime takes them (no ops, no gradients)."""
    if any(isinstance(t, Tensor) and t.device.type == "mps" for t in tensors):
        return False
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)
