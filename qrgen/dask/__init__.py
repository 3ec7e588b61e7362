"""qrgen on dask.arrays whose chunks are CuPy arrays (qrgen's GPU kernels) or NumPy arrays (qrgen.numerics.numpy_api):
geqrf, qr, lstsq, householder_product and ormqr, lazily, as dask.arrays of the same chunk kind.

A matrix's columns are one chunk. Its rows may be too — then every chunk of the batch (leading) axes is factored
where it lies, one task per chunk, no data moved — or be split into row chunks of at least n rows each: then a
TSQR tree factors each chunk where it lies, stacks their R factors `split_every` at a time and factors them again
until one is left (qrgen at the leaves and at every combine). Q is each leaf's Q times its block of the Q above
(chunked as a's rows), R one chunk, as dask.array.linalg.tsqr gives them; geqrf rebuilds Householder reflectors
from that Q (docs/design.md "Dask") and lstsq factors [a b] by the same tree without forming Q.

Dask does the scheduling: its local schedulers, distributed, and dask-cuda's LocalCUDACluster (a worker per GPU).
"""
from __future__ import annotations

import functools

import numpy as np

from ..numerics import qmatrix
from . import blocks, graph

SPLIT_EVERY = 16  # R factors stacked per combine


def _array(x, name: str, core: int):
    import dask.array as da

    if not isinstance(x, da.Array):
        raise TypeError(f"qrgen.dask takes dask arrays; {name} is a {type(x).__module__}.{type(x).__qualname__} "
                        f"(qrgen.geqrf and the rest take CuPy, torch and NumPy arrays themselves)")
    if x.ndim < core:
        raise ValueError(f"{name} needs at least {core} dimensions; got shape {x.shape}")
    if np.iscomplexobj(x._meta) or x.dtype.kind not in "fiub":
        raise TypeError(f"{name} must be a real numeric array; got dtype {x.dtype}")
    blocks.array_module(x._meta)  # CuPy or NumPy chunks, else a TypeError naming what they are
    if blocks.on_gpu(x._meta) and x.dtype != np.float32:
        raise TypeError(f"{name} has CuPy chunks of {x.dtype}; qrgen's GPU kernels take float32")
    return x


def _dtype(a):
    return np.dtype(np.float32 if a.dtype == np.float32 else np.float64)


def _columns_whole(a, name: str = "a"):
    if len(a.chunks[-1]) > 1:
        raise ValueError(f"{name}'s columns are in {len(a.chunks[-1])} chunks; qrgen.dask needs each matrix's "
                         f"columns in one chunk: {name}.rechunk({{-1: -1}})")


def _tall(a, name: str = "a") -> bool:
    """Whether a's rows are in several chunks (the TSQR tree), each then at least n rows."""
    _columns_whole(a, name)
    rows = a.chunks[-2]
    if len(rows) == 1:
        return False
    if min(rows) < a.shape[-1]:
        raise ValueError(f"{name}'s row chunks must each hold at least n = {a.shape[-1]} rows for the TSQR tree; "
                         f"the smallest holds {min(rows)}: rechunk the rows ({name}.rechunk({{-2: ...}}))")
    return True


def _matrices(fn):
    """Run fn on a batch: a single matrix (2-D) as a batch of one, its results taken back out."""
    @functools.wraps(fn)
    def wrapper(a, *args, **kwargs):
        a = _array(a, fn.__code__.co_varnames[0], 2)  # "a", or "h" for the Q functions
        if a.ndim > 2:
            return fn(a, *args, **kwargs)
        out = fn(a[None], *(_batch_of_one(x) for x in args), **kwargs)
        return tuple(x[0] for x in out) if isinstance(out, tuple) else out[0]
    return wrapper


@_matrices
def geqrf(a, *, split_every: int = SPLIT_EVERY):
    """(h, tau) of a (..., m, n) dask.array in LAPACK's geqrf convention, as qrgen.geqrf gives them."""
    dtype, lead = _dtype(a), a.ndim - 2
    m, n = a.shape[-2:]
    if _tall(a):
        q, r = graph.tsqr(a, True, _split(split_every), dtype)
        return graph.reconstruct(q, r, dtype)
    return tuple(graph.per_chunk(blocks.geqrf, lead, [(a, 2)], [((m,), (n,)), ((min(m, n),),)], dtype, a))


@_matrices
def qr(a, mode: str = "reduced", *, split_every: int = SPLIT_EVERY):
    """numpy.linalg.qr's modes, as qrgen.qr: (Q, R) for "reduced" and "complete", R for "r", (h^T, tau) for
    "raw". Row-chunked a: every mode but "complete" (its Q, m x m, is what a tall matrix is chunked to avoid)."""
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(f"mode must be one of ('reduced', 'complete', 'r', 'raw'), got {mode!r}")
    dtype, lead = _dtype(a), a.ndim - 2
    m, n = a.shape[-2:]
    k = min(m, n)
    if _tall(a):
        if mode == "complete":
            raise ValueError("qr of a row-chunked matrix has no mode 'complete' (Q would be m x m); use 'reduced'")
        if mode == "raw":
            h, tau = geqrf(a, split_every=split_every)
            return h.swapaxes(-1, -2), tau
        q, r = graph.tsqr(a, mode == "reduced", _split(split_every), dtype)
        return r if mode == "r" else (q, r)
    if mode == "raw":
        outs = [((n,), (m,)), ((k,),)]
    else:
        rows = m if mode == "complete" else k
        outs = ([((rows,), (n,))] if mode == "r" else [((m,), (rows,)), ((rows,), (n,))])
    out = graph.per_chunk(functools.partial(blocks.qr, mode=mode), lead, [(a, 2)], outs, dtype, a)
    return out[0] if mode == "r" else tuple(out)


@_matrices
def lstsq(a, b, *, split_every: int = SPLIT_EVERY):
    """(x, residual) of min ||a x - b|| for full-rank a (..., m, n), m >= n, and b (..., m) or (..., m, p), as
    qrgen.lstsq. Row-chunked a: R of [a b] by the TSQR tree (Q never formed), then R11 x = R12."""
    import dask.array as da

    b = _array(b, "b", 1)
    vector = qmatrix.lstsq_shapes(a.shape, b.shape)
    n = a.shape[-1]
    dtype, lead = _dtype(a), a.ndim - 2
    b3 = b[..., None] if vector else b
    p = b3.shape[-1]
    if _tall(a):
        ab = da.concatenate([a, b3.astype(a.dtype).rechunk({lead: a.chunks[-2]})], axis=-1).rechunk({-1: -1})
        _, r = graph.tsqr(ab, False, _split(split_every), dtype)
        x, res = graph.per_chunk(functools.partial(blocks.solve_augmented, n=n), lead, [(r, 2)],
                                 [((n,), (p,)), ((p,),)], dtype, a)
    else:
        x, res = graph.per_chunk(blocks.lstsq, lead, [(a, 2), (b3.rechunk({lead: -1}), 2)],
                                 [((n,), (p,)), ((p,),)], dtype, a)
    return (x[..., 0], res[..., 0]) if vector else (x, res)


@_matrices
def householder_product(h, tau, complete: bool = False):
    """Q of a geqrf result whose matrices are whole chunks: (..., m, min(m, n)), or (..., m, m) with complete."""
    tau = _array(tau, "tau", 1)
    m, n = h.shape[-2:]
    _whole(h, tau)
    cols = m if complete else min(m, n)
    fn = functools.partial(blocks.householder_product, complete=complete)
    return graph.per_chunk(fn, h.ndim - 2, [(h, 2), (tau, 1)], [((m,), (cols,))], _dtype(h), h)[0]


@_matrices
def ormqr(h, tau, c, side: str = "L", transpose: bool = False):
    """op(Q) C (side "L") or C op(Q) (side "R") for a geqrf result whose matrices are whole chunks, as qrgen.ormqr."""
    if side not in ("L", "R"):
        raise ValueError(f"side must be 'L' or 'R', got {side!r}")
    tau, c = _array(tau, "tau", 1), _array(c, "c", 2)
    _whole(h, tau)
    m = h.shape[-2]
    if c.shape[:-2] != h.shape[:-2] or c.shape[-2 if side == "L" else -1] != m:
        want = "(..., m, p)" if side == "L" else "(..., p, m)"
        raise ValueError(f"c must have shape {want} with h's leading dimensions {h.shape[:-2]} and m = {m}; "
                         f"got {c.shape}")
    c = c.rechunk({-1: -1, -2: -1})
    fn = functools.partial(blocks.ormqr, side=side, transpose=transpose)
    out = [tuple((d,) for d in c.shape[-2:])]
    return graph.per_chunk(fn, h.ndim - 2, [(h, 2), (tau, 1), (c, 2)], out, _dtype(h), h)[0]


def _batch_of_one(x):
    import dask.array as da

    return x[None] if isinstance(x, da.Array) else x


def _whole(h, tau):
    if len(h.chunks[-2]) > 1 or len(h.chunks[-1]) > 1:
        raise ValueError("householder_product and ormqr need h's matrices whole in chunks (h.rechunk({-2: -1, "
                         "-1: -1})); for Q of a row-chunked matrix use qrgen.dask.qr(a)")
    if tau.shape != h.shape[:-2] + (min(h.shape[-2:]),):
        raise ValueError(f"tau must have shape {h.shape[:-2] + (min(h.shape[-2:]),)} for h of shape {h.shape}; "
                         f"got {tau.shape}")


def _split(split_every: int) -> int:
    if not isinstance(split_every, int) or split_every < 2:
        raise ValueError(f"split_every must be an integer of at least 2, got {split_every!r}")
    return split_every


__all__ = ["geqrf", "qr", "lstsq", "householder_product", "ormqr", "SPLIT_EVERY"]
