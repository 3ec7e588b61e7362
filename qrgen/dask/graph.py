"""The graphs: a task per chunk whose results (a tuple) become several dask arrays, and the TSQR tree over row
chunks (qrgen at the leaves and at every combine)."""
from __future__ import annotations

import functools

import numpy as np

from . import blocks

LETTERS = "abcdefghopqrstuvwxyz"  # leading (batch) axes; i, j, k, l, m, n, y, z name core axes below


def meta(a, ndim: int, dtype):
    """An empty array of a's chunk kind (NumPy or CuPy): dask's record of what the chunks are."""
    return a._meta.astype(dtype).reshape((0,) * ndim)


def per_chunk(fn, lead: int, args, outs, dtype, like):
    """fn on each chunk of the leading axes of every (array, core axes) in args, its matrix axes whole (several
    chunks there are joined first); returns a dask array per entry of outs, the core chunks fn's i-th result has."""
    import dask.array as da

    ind = LETTERS[:lead]
    pairs = []
    for k, (arr, core) in enumerate(args):
        pairs += [arr, ind + "ijklmnyz"[2 * k:2 * k + core]]
    pair = da.blockwise(fn, ind, *pairs, concatenate=True, dtype=dtype, meta=np.empty((0,) * lead, dtype=object))
    return [take(pair, i, lead, pair.chunks + tuple(core), dtype, like) for i, core in enumerate(outs)]


def take(pair, i: int, axis: int, chunks: tuple, dtype, like):
    """The i-th result of each of pair's tasks as a dask array with these chunks (new axes from `axis` on)."""
    return pair.map_blocks(blocks.item, i, new_axis=list(range(axis, len(chunks))) if len(chunks) > pair.ndim else
                           None, chunks=chunks, dtype=dtype, meta=meta(like, len(chunks), dtype))


def leaves(a, mode: str, dtype):
    """qr of every row chunk of a (..., M, N) (its columns one chunk): (Q or None, R), R's chunks stacked along
    the rows (min(rows, N) each)."""
    import dask.array as da

    lead, n = a.ndim - 2, a.shape[-1]
    ind = LETTERS[:lead]
    pair = da.blockwise(functools.partial(blocks.qr, mode=mode), ind + "i", a, ind + "ij", concatenate=True,
                        dtype=dtype, meta=np.empty((0,) * (lead + 1), dtype=object))
    rows = tuple(min(c, n) for c in a.chunks[-2])
    r = take(pair, 1 if mode == "reduced" else 0, lead + 1, a.chunks[:-2] + (rows, (n,)), dtype, a)
    q = take(pair, 0, lead + 1, a.chunks, dtype, a) if mode == "reduced" else None
    return q, r


def tsqr(a, with_q: bool, split_every: int, dtype):
    """The TSQR tree of a (..., M, N) over its row chunks: each chunk's R, stacked split_every at a time, factored
    again until one chunk is left; Q (with_q) is each leaf's Q times its block of the Q above it. (Q, R), R (..., k,
    N) in one chunk along its matrix axes."""
    import dask.array as da

    q, r = leaves(a, "reduced" if with_q else "r", dtype)
    sizes = r.chunks[-2]
    if len(sizes) == 1:
        return q, r
    groups = tuple(sum(sizes[i:i + split_every]) for i in range(0, len(sizes), split_every))
    q_up, r_top = tsqr(r.rechunk({r.ndim - 2: groups}), with_q, split_every, dtype)
    if not with_q:
        return None, r_top
    ind = LETTERS[:a.ndim - 2]
    q_up = q_up.rechunk({q_up.ndim - 2: sizes})  # one block per leaf below: splits, no data joined
    q = da.blockwise(blocks.matmul, ind + "ij", q, ind + "ik", q_up, ind + "ij", align_arrays=False,
                     concatenate=True, dtype=dtype, meta=meta(a, a.ndim, dtype))
    return q, r_top


def reconstruct(q, r, dtype):
    """geqrf's (h, tau) from the tree's Q and R: Householder reflectors rebuilt from Q by an LU with signs of its
    top block (blocks.signs, one small host step per matrix) and Q U^-1 on every row chunk where it lies."""
    import dask.array as da

    lead, n = q.ndim - 2, q.shape[-1]
    ind = LETTERS[:lead]
    top = q[..., :n, :].rechunk({lead: n})
    aux = da.blockwise(blocks.signs, ind, top, ind + "ij", r, ind + "kl", concatenate=True, dtype=dtype,
                       meta=np.empty((0,) * lead, dtype=object))
    nb = len(q.chunks[-2])
    first = da.from_array(np.arange(nb) == 0, chunks=1)
    h = da.blockwise(blocks.reflectors, ind + "ij", q, ind + "ij", aux, ind, first, "i", align_arrays=False,
                     concatenate=True, dtype=dtype, meta=meta(q, q.ndim, dtype))
    tau = take(aux, 2, lead, q.chunks[:-2] + ((n,),), dtype, q)
    return h, tau
