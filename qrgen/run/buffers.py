"""The work buffers a plan needs beside h and tau, and their sizes in floats per matrix.

reflectors      V^T of a panel, or of an aggregate (its panels write into it)
panel_wy        (V T)^T of a panel
w               W of a trailing update, or a t_late aggregate's V^T C (and its parts, w_parts; w_side: the side
                stream's, with lookahead)
gram            G = V^T V of an aggregate (and its parts, gram_parts); tmat: its T
aggregate_wy    (V T)^T of an aggregate (a t_late aggregate's W = T^T (V^T C))
q_w             W of Q's products (keep plans)
tsqr_tree       a tsqr panel's tree (plan/tsqr.tsqr_layout)
With lookahead, an aggregate's reflectors and aggregate_wy rotate over two buffers (_2), three with Schedule.reach
(_3): the side stream still reads one aggregate's while the next one's (and with reach the one after's) panels
write theirs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plan import tf32x3
from ..plan.tsqr import tsqr_layout

# a rotating buffer's size is its first one's
SIZE_OF = {"reflectors_2": "reflectors", "reflectors_3": "reflectors", "aggregate_wy_2": "aggregate_wy",
           "aggregate_wy_3": "aggregate_wy", "w_side": "w", "tmat": "gram"}


@dataclass(frozen=True)
class Sizes:
    """Floats per matrix of each work buffer."""

    reflectors: int
    panel_wy: int
    w: int
    gram: int
    aggregate_wy: int
    q_w: int = 1
    tsqr_tree: int = 1

    def floats(self, name: str) -> int:
        return getattr(self, SIZE_OF.get(name, name))

    @classmethod
    def of(cls, fac) -> "Sizes":
        trail = [L for L in fac.launches if L.trail] or fac.launches
        # a keep plan merges every aggregate, the last one too (for Q); a plain plan those with columns after them
        aggs = [a for a in fac.aggregates if a.nc > 0 or fac.keep]
        kept = sum(b.width * b.rows for b in fac.kept)  # every kept block's region (keep plans)
        return cls(reflectors=max([L.v_bs for L in trail] + [kept]),
                   panel_wy=max([L.width * L.rows for L in trail] + [kept if not fac.aggregates else 0]),
                   q_w=max([b.width * (fac.m - b.c0) for b in fac.kept] + [1]),
                   w=max([L.width * L.nc for L in fac.launches] + [(a.a1 - a.a0) * a.nc for a in aggs] + [1]),
                   gram=max([(a.a1 - a.a0) ** 2 for a in aggs] + [1]),
                   aggregate_wy=max([(a.a1 - a.a0) * a.rows for a in aggs] + [kept if fac.aggregates else 0] + [1]
                                    + [(a.a1 - a.a0) * a.nc for i, a in enumerate(fac.aggregates)
                                       if i in fac.plan.t_late]),
                   tsqr_tree=max([tsqr_layout(L.levels, L.width).floats for L in fac.launches if L.levels] + [1]))


def reaches(fac) -> bool:
    """Whether a plan's panels reach through the next aggregate (Schedule.reach, with two aggregates or more)."""
    return any(a.c1 > a.a1 for a in fac.aggregates)


def buffer_names(fac) -> tuple[str, ...]:
    """The work buffers of a plan (the module's docstring; a keep plan's aggregates have regions of their own, so it
    needs no rotation)."""
    names = ("reflectors", "panel_wy", "w", "gram", "aggregate_wy")
    ahead = fac.schedule.lookahead
    rotate = (() if not ahead or fac.keep else
              ("reflectors_2", "aggregate_wy_2", "reflectors_3", "aggregate_wy_3") if reaches(fac) else
              ("reflectors_2", "aggregate_wy_2"))
    return (names + rotate + (("w_side",) if ahead else ())
            + (("q_w",) if fac.keep else ()) + (("tsqr_tree",) if any(L.levels for L in fac.launches) else ()))


def gram_parts(fac, chunk: int, sms: int) -> int:
    """Parts to split the K (rows of V) of an aggregate's G = V^T V into, for `chunk` matrices: where the tf32x3
    gram kernel can take G (an fp32 Gram precision), tf32x3.k_parts of the matrices' upper 64 x 64 tiles and the
    deepest aggregate (docs/decisions.md#gram-splits). Part q of the chunk's matrices lies q * chunk * sizes.gram
    floats into "gram"; the engine adds the parts into the first before the T kernel reads G. None where the plan has
    no gram kernel (no merge forms G: panels that form it themselves, planner's t_out)."""
    if not any(k.variant == "tf32x3" and k.kind == "gram" for k in fac.kernels):
        return 1
    a = max([agg.a1 - agg.a0 for agg in fac.aggregates] + [1])
    depth = max([agg.rows for agg in fac.aggregates] + [1])
    tiles = tf32x3.grid("gram", a, a, 1)[0]  # the blocks of one matrix's G
    return tf32x3.k_parts(chunk * tiles, depth, sms)


def w_parts(fac, chunk: int, sms: int) -> int:
    """The most parts a projection W = Z^T C into "w" splits its K (rows) into for `chunk` matrices
    (tf32x3.project_parts): where the schedule's projections run on the tf32x3 kernels and no lookahead shares the
    GPU with them, over the aggregates' projections and the panels' own that the kernels take; else 1. Part q of
    the chunk's matrices lies q * chunk * sizes.w floats into "w"; the engine adds the parts into the first
    (docs/decisions.md#tsqr-tf32x3)."""
    s = fac.schedule
    if s.lookahead or s.precision.project != "tf32x3":
        return 1
    products = [(agg.a1 - agg.a0, agg.nc, agg.rows) for agg in fac.aggregates if agg.nc > 0]
    if s.panel_update == "cublas":
        products += [(L.width, L.nc, L.rows) for L in fac.launches if L.nc > 0 and L.width >= tf32x3.MIN]
    return max([tf32x3.project_parts(a, nc, rows, chunk, sms) for a, nc, rows in products] + [1])
