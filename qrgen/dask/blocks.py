"""What one task does to its chunks: qrgen's functions on a chunk where it lies (CuPy chunks through qrgen's GPU
functions, NumPy chunks through qrgen.numerics.numpy_api), and the one small host step of the Householder
reconstruction.

Dask runs tasks on a pool of threads, several at once on one GPU. qrgen keeps its workspaces per stream, so each
thread queues its tasks on a stream of its own (one per thread and device, blocking, so it orders itself after
work on the legacy default stream) and waits for it before the task returns: the next task may read the result
from another thread's stream.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from .. import api
from ..numerics import numpy_api, qmatrix
from ..numerics.reference import tsqr_lu

_local = threading.local()


def on_gpu(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy"


def array_module(x):
    if on_gpu(x):
        import cupy

        return cupy
    if isinstance(x, np.ndarray):
        return np
    raise TypeError(f"qrgen.dask takes dask arrays whose chunks are CuPy or NumPy arrays; a chunk is a "
                    f"{type(x).__module__}.{type(x).__qualname__}")


@contextlib.contextmanager
def placed(x):
    """Run the body on this thread's stream of x's device (CuPy chunks) and wait for it at the end."""
    if not on_gpu(x):
        yield
        return
    import cupy

    streams = _local.__dict__.setdefault("streams", {})
    device = x.device.id
    with cupy.cuda.Device(device):
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = cupy.cuda.Stream()
        with stream:
            yield
        stream.synchronize()


def _call(name: str, x, *args):
    """qrgen's function `name` on chunks whose first is x: the GPU one for CuPy chunks, numpy_api's for NumPy."""
    with placed(x):
        return getattr(api if on_gpu(x) else numpy_api, name)(x, *args)


def geqrf(a):
    return tuple(_call("geqrf", a))


def qr(a, mode: str):
    """qr of a chunk: (Q, R) for "reduced" and "complete", (R,) for "r", (h^T, tau) for "raw"."""
    out = _call("qr", a, mode)
    return (out,) if mode == "r" else tuple(out)


def lstsq(a, b):
    return tuple(_call("lstsq", a, b))


def householder_product(h, tau, complete: bool):
    return (_call("householder_product", h, tau, complete),)


def ormqr(h, tau, c, side: str, transpose: bool):
    return (_call("ormqr", h, tau, c, side, transpose),)


def solve_augmented(r, n: int):
    """From R of [a b] (..., k, n + p): x with R11 x = R12 and the residuals, the squared column norms of R22."""
    lead, cols = r.shape[:-2], r.shape[-1]
    r3 = r.reshape(-1, *r.shape[-2:])
    with placed(r):
        x = qmatrix.solve_upper(r3[:, :n, :n], r3[:, :n, n:])  # it solves a copy
        res = (r3[:, n:, n:] ** 2).sum(axis=1)
    return x.reshape(*lead, n, cols - n), res.reshape(*lead, cols - n)


def matmul(a, b):
    """a @ b (a chunk's Q block times its part of the level above's Q)."""
    with placed(a):
        return array_module(a).matmul(a, b)


def item(pair, i: int):
    return pair[i]


def signs(qtop, r):
    """The host step of rebuilding Householder reflectors from the tree's Q (qrgen.numerics.reference.tsqr_lu):
    from Q's top n x n block and R, the LU with signs Q1 - S = L U in float64, giving (U^-1, the top n rows of h
    (S R on and above the diagonal, L below), tau = -diag(U) S), each as the chunks' kind and dtype."""
    xp = array_module(qtop)
    host = (lambda x: x.get()) if xp is not np else np.asarray
    lead, n = qtop.shape[:-2], qtop.shape[-1]
    lu, s = tsqr_lu(host(qtop).astype(np.float64).reshape(-1, n, n))
    r64 = host(r).astype(np.float64).reshape(-1, n, n)
    u = np.triu(lu)
    top = np.triu(s[:, :, None] * r64) + np.tril(lu, -1)
    tau = -np.diagonal(u, axis1=1, axis2=2) * s
    out = (np.linalg.inv(u), top, tau)
    return tuple(xp.asarray(x.reshape(*lead, *x.shape[1:]).astype(qtop.dtype)) for x in out)


def reflectors(q, aux, first):
    """One row chunk of h from the tree's Q: Q_i U^-1 (the reflectors' rows), the top n rows replaced by `aux`'s
    in the first chunk."""
    uinv, top = aux[0], aux[1]
    with placed(q):
        h = array_module(q).matmul(q, uinv)
        if first[0]:
            n = top.shape[-1]
            h[..., :n, :] = top
    return h
