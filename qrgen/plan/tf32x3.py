"""Family "tf32x3": fp32-class products from three tf32 tensor-core products over each input's tf32 high part and
remainder (templates/cuda/tf32x3.cu.j2, cp.async-pipelined), for the trailing update's products where a schedule's
precision says "tf32x3", the aggregates' merges, and Q's products. The kernels are the same for every schedule:

  project    W = Z^T C, A = Z^T with K contiguous
  project64  a projection of at most 64 rows (aggregates of 64), or of at most 128 in a small grid, on 64 x 64 tiles
  update     C -= V W (and Q's P -= (V T) W), A given transposed (M contiguous)
  merge      an aggregate's (VT)^T = T^T V^T, A = T given as it is (T^T, M contiguous): the update's kernel with
             each row tile's K ending at its last row, T^T being lower triangular
  gram       an aggregate's G = V^T V, A = V^T and B = V given as V^T (both K contiguous), only the tiles that
             reach G's upper part
  project_t, project64_t   the projections W = T^T (V^T C) of aggregates whose T they apply in their epilogue
             (t_fused), where the aggregate's merge then forms no (VT)^T

Every kernel can split K into parts written apart (k_parts: G, and the projections, of few matrices: their grids
leave most SMs idle), which the caller adds; a product of more rows than grid.y holds tiles of runs in pieces of
rows (row_pieces)."""
from __future__ import annotations

import dataclasses
import functools

from ..render.environment import environment
from ..targets import ASYNC_COPY, TF32_MMA
from ..targets.cuda import GRID_YZ
from ..version import __version__
from .layout import aggregates
from .specs import KernelSpec, Rendered

# Tiles, warps, K per step, steps in flight and resident blocks per SM, per kernel (docs/decisions.md#gemm3-tiles).
_UPDATE = dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=3, a_mcontig=True, b_kcontig=False,
               upper_only=False)
CONFIGS = {
    "project": dict(bm=128, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2, a_mcontig=False,
                    b_kcontig=False, upper_only=False),
    "project64": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2, a_mcontig=False,
                      b_kcontig=False, upper_only=False),
    "update": _UPDATE,
    "merge": dict(_UPDATE, lower_a=True),  # (VT)^T: each row tile's K ends at its last row
    "gram": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=3, a_mcontig=False,
                 b_kcontig=True, upper_only=True),
}
for _kind in ("project", "project64"):  # the same with the aggregate's T applied in the epilogue (t_fused)
    CONFIGS[_kind + "_t"] = dict(CONFIGS[_kind], t_fused=True)
T_MAX = CONFIGS["project"]["bm"]  # the widest aggregate whose rows of W one block of project_t holds
PART_ROWS = 256  # K a part at least, where a product's K is split (k_parts)
ROW_TILES_MAX = GRID_YZ  # row tiles a launch at most (row_pieces)
SMALL_GRID = 2  # projections of up to 128 rows take 64-row tiles below this many 128-row tiles an SM (project_kind)
MIN = 64  # products with a smaller dimension (a panel's own: 32 rows or a depth of 32) stay with cuBLAS
# a, lda, sa, b, ldb, sb, c, ldc, sc, M, N, K, alpha, beta, parts of K, floats between the parts' outputs
SIGNATURE = "PILPILPILIIIFFIL"
T_SIGNATURE = SIGNATURE + "PIL"  # and T: t, ldt, st (the _t kernels)


def grid(kind: str, rows: int, cols: int, matrices: int) -> tuple[int, int, int] | None:
    """The kernel's grid for a product of rows x cols per matrix (column tiles, row tiles, matrices; for the gram
    kernel the tiles on and above the diagonal, in x: docs/decisions.md#gemm3-gram-upper-grid); None where grid.y or
    grid.z exceeds CUDA's limit (row_pieces keeps grid.y within it; a batch past GRID_YZ: cuBLAS takes those)."""
    cfg = CONFIGS[kind]
    out = (-(-cols // cfg["bn"]), -(-rows // cfg["bm"]), matrices)
    if cfg["upper_only"]:  # the tiles on and above the diagonal only, numbered in x (the kernel's decode)
        out = (out[0] * (out[0] + 1) // 2, 1, matrices)
    return None if max(out[1:]) > GRID_YZ else out


def row_pieces(kind: str, rows: int) -> list[tuple[int, int]]:
    """C's rows [r0, r1) in pieces whose row tiles fit CUDA's grid.y (one piece below 4,194,240 rows), each a
    launch of its own (docs/decisions.md#tsqr-tf32x3)."""
    step = ROW_TILES_MAX * CONFIGS[kind]["bm"]
    return [(r0, min(rows, r0 + step)) for r0 in range(0, max(rows, 1), step)]


def launches(kind: str, rows: int, cols: int, matrices: int, lda: int, ldc: int) -> tuple:
    """The launches of a product of `rows` rows, one per row_pieces piece: (floats from A's start to the piece's
    first row, from C's, its rows, its grid). Cached: the engines ask for every product of every call."""
    return _launches(kind, rows, cols, matrices, lda, ldc, ROW_TILES_MAX)


@functools.lru_cache(maxsize=4096)
def _launches(kind, rows, cols, matrices, lda, ldc, row_tiles_max):  # (row_tiles_max: a key, for tests' patches)
    a_step = 1 if CONFIGS[kind]["a_mcontig"] else lda
    return tuple((r0 * a_step, r0 * ldc, r1 - r0, grid(kind, r1 - r0, cols, matrices))
                 for r0, r1 in row_pieces(kind, rows))


def k_parts(blocks: int, depth: int, sms: int) -> int:
    """Parts to split a product's K (`depth`) into, where its grid of `blocks` fills fewer than two blocks per SM:
    enough for about two, each at least PART_ROWS deep; else 1 (docs/decisions.md#gram-splits)."""
    return max(1, min(depth // PART_ROWS, 2 * sms // max(1, blocks)))


def project_parts(rows: int, cols: int, depth: int, matrices: int, sms: int) -> int:
    """k_parts of a projection W = Z^T C (rows x cols, K = depth) of `matrices` matrices on `sms` SMs, on the grid
    its kernel would have unsplit (docs/decisions.md#tsqr-tf32x3)."""
    out = grid(project_kind(rows, cols, matrices, sms), rows, cols, matrices)
    return k_parts(out[0] * out[1] * out[2], depth, sms) if out else 1


def threads(config: dict) -> int:
    return 32 * config["wm_warps"] * config["wn_warps"]


def shared_bytes(config: dict) -> int:
    """Dynamic shared memory: its stages of A's tile ([k][m] padded by 4, or [m][k] by 8) and B's ([k][n] padded by
    4, or [n][k] by 8)."""
    c = config
    a = c["bk"] * (c["bm"] + 4) if c["a_mcontig"] else c["bm"] * (c["bk"] + 8)
    b = c["bn"] * (c["bk"] + 8) if c["b_kcontig"] else c["bk"] * (c["bn"] + 4)
    epilogue = c["bm"] * (c["bn"] + 4) + c["bm"] * (c["bm"] + 4) if c.get("t_fused") else 0  # W's tile and T
    return 4 * max(c["stages"] * (a + b), epilogue)


def name(kind: str) -> str:
    return f"qr_tf32x3_{kind}"


def kernel(kind: str) -> KernelSpec:
    """The kernel `kind`, the same for every schedule."""
    config = CONFIGS[kind]
    return KernelSpec(name(kind), "tf32x3", 0, threads(config), 1, 0, 4, False, 0, shared_bytes(config), (),
                      kind=kind)


def signature(spec: KernelSpec) -> str:
    return T_SIGNATURE if CONFIGS[spec.kind].get("t_fused") else SIGNATURE


def features(spec: KernelSpec) -> tuple[str, ...]:
    return (TF32_MMA, ASYNC_COPY)


def project_kind(rows: int, cols: int = 0, matrices: int = 0, sms: int = 0) -> str:
    """The kernel of a projection W = Z^T C with `rows` rows (the aggregate's or panel's width) and `cols` columns
    for `matrices` matrices on `sms` SMs: 64-row tiles up to 64 rows, and up to 128 rows where 128-row tiles would
    give the SMs fewer than SMALL_GRID blocks each (docs/decisions.md#gemm3-project64; sms 0: not that rule, as
    beside a lookahead's side stream); else 128-row tiles."""
    if rows <= CONFIGS["project64"]["bm"]:
        return "project64"
    if rows <= 2 * CONFIGS["project64"]["bm"] and sms:
        x, y, z = -(-cols // CONFIGS["project"]["bn"]), -(-rows // CONFIGS["project"]["bm"]), matrices
        if x * y * z < SMALL_GRID * sms:
            return "project64"
    return "project"


def route(trans_a: bool, trans_b: bool, rows: int, cols: int, depth: int, addresses, strides, matrices: int,
          sms: int, stage: str = "") -> tuple[str, tuple[int, int, int]] | None:
    """(kernel kind, grid of a piece of row_pieces) of a product op(A) op(B) that a tf32x3 kernel takes: A B (the
    projection's layout), A^T B (the update's; the merge kernel's for the stage "aggregate", (VT)^T = T^T V^T, whose
    op(A) = T^T is lower triangular: docs/decisions.md#merge-triangle) or A B^T (the Gram matrix's), every operand
    address 16-byte aligned, every dimension and stride (leading dimensions, batch strides) a multiple of 4 floats,
    no dimension below MIN, a grid within CUDA's limits; None otherwise (the engines' fp32 product then). sms:
    project_kind's (0 beside a lookahead)."""
    kind = {(False, False): "project", (True, False): "merge" if stage == "aggregate" else "update",
            (False, True): "gram"}.get((trans_a, trans_b))
    if kind is None or any(a % 16 for a in addresses) or any(v % 4 for v in (rows, cols, depth, *strides)):
        return None
    if min(rows, cols, depth) < MIN:  # a panel's thin products: cuBLAS splits them better
        return None
    if kind == "project":  # small grids on 64-row tiles, except beside a lookahead's side stream
        kind = project_kind(rows, cols, matrices, sms)
    if kind == "merge" and rows > ROW_TILES_MAX * CONFIGS[kind]["bm"]:  # (its row tiles' K: one piece of rows)
        return None
    out = grid(kind, min(rows, ROW_TILES_MAX * CONFIGS[kind]["bm"]), cols, matrices)
    return None if out is None else (kind, out)


def t_fused(schedule, agg, keep: bool = False) -> bool:
    """Whether an aggregate's projection applies its T in the kernel's epilogue, W = T^T (V^T C), so that its merge
    forms no (VT)^T (docs/decisions.md#project-t): a tf32x3 projection of MIN to T_MAX reflectors and at least MIN
    columns, every offset and dimension a multiple of 4 floats (the kernels' alignment); one stream (no lookahead or
    reach: T's buffer does not rotate), the two products (not apply3), and not in qr's keep plans (Q's products
    read (VT)^T)."""
    a = agg.a1 - agg.a0
    return (not keep and schedule.precision.project == "tf32x3" and not schedule.lookahead and not schedule.reach
            and schedule.aggregate_update == "gemm" and MIN <= a <= T_MAX and agg.nc >= MIN
            and all(v % 4 == 0 for v in (schedule.m, schedule.n, agg.a0, agg.a1)))


@functools.lru_cache(maxsize=4096)  # (asked for every aggregate of every call)
def t_fills(rows: int, cols: int, depth: int, matrices: int, sms: int) -> bool:
    """Whether a t_fused aggregate's projection (`rows` reflectors, `cols` columns, K = depth) takes its _t kernel
    for `matrices` matrices on `sms` SMs: always at most 64 reflectors (the same tiles as the plain projection's);
    past 64, where the 128-row tiles' grid, K in project_parts' parts, has at least half as many blocks as SMs (the
    plain projection would take 64-row tiles, twice the blocks, where its grid is small: docs/decisions.md#project-t);
    else the merge forms (VT)^T."""
    if rows <= CONFIGS["project64"]["bm"]:
        return True
    out = grid("project", rows, cols, matrices * project_parts(rows, cols, depth, matrices, sms))
    return out is not None and out[0] * out[1] * out[2] >= sms // 2


def t_kind(kind: str, rows: int) -> str:
    """The _t kernel for a projection of `rows` rows that route gave `kind`: 128-row tiles past 64 rows (its epilogue
    needs every row of W in its block)."""
    return ("project" if rows > CONFIGS[kind]["bm"] else kind) + "_t"


def kernel_for(kind: str, rows: int, t: bool) -> tuple[str, str]:
    """(kernel kind, argument signature) of a product of `rows` rows that route gave `kind`: its _t kernel (t_kind,
    T_SIGNATURE) where it applies T, else the kernel itself (the engines' launches)."""
    return (t_kind(kind, rows), T_SIGNATURE) if t else (kind, SIGNATURE)


def project_kinds(rows: int) -> set[str]:
    """The kernels a projection of `rows` rows may take (project_kind, whatever its columns and batch): those of
    the largest grid and of the smallest."""
    return {project_kind(rows), project_kind(rows, 1, 1, 1)}


def kinds(schedule, keep: bool = False, fused: tuple[int, ...] = ()) -> tuple[str, ...]:
    """The kernels a schedule's tf32x3 products can take: "project" and "update" as its precision says, where some
    product is at least MIN in every dimension (an aggregate with columns right of it, or a panel that wide); an
    update in tf32x3 also takes the aggregates' merges ((VT)^T by the merge kernel, and G by the gram kernel where
    their Gram precision is fp32), which qr's keep plans run for the last aggregate too. The gram kernel also serves
    an fp32 G of few matrices, its K split over more blocks (run/buffers.gram_parts), whatever the update. The
    aggregates whose projections apply T (`fused`: the plan's Plan.t_fused) take the _t kernels (instead, up to 64
    rows); without them, every projection the plain ones."""
    p, aggs = schedule.precision, aggregates(schedule)
    # the projections' rows: each aggregate's width where columns lie right of it (a fused one's past 64 rows too:
    # t_fills may leave it unfused), each panel's that the kernels take
    widths = ({a.a1 - a.a0 for i, a in enumerate(aggs)
               if a.nc > 0 and (i not in fused or a.a1 - a.a0 > CONFIGS["project64"]["bm"])}
              | {w.width for w in schedule.panels if w.width >= MIN})
    projects = set().union(*(project_kinds(w) for w in widths if w >= MIN)) if p.project == "tf32x3" else set()
    projects |= {t_kind(kind, aggs[i].a1 - aggs[i].a0) for i in fused
                 for kind in project_kinds(aggs[i].a1 - aggs[i].a0)}
    wide = any(a.a1 - a.a0 >= MIN for a in aggs)  # a G the kernels take
    merged = any(a.a1 - a.a0 >= MIN and (a.nc > 0 or keep) for a in aggs)  # a (VT)^T they take
    used = projects | ({"update"} if p.update == "tf32x3" and (widths or aggs) else set()) | (
        {"merge"} if p.update == "tf32x3" and merged else set()) | ({"gram"} if p.gram == "fp32" and wide else set())
    return tuple(kind for kind in CONFIGS if kind in used)


def q_precision(width: int) -> str:
    """The precision of qr's two Q products (run/sequence.drive_q) for a kept block `width` columns wide, whatever
    the schedule's own precisions: tf32x3 from MIN columns (the aggregates), fp32 for narrower blocks (the panels),
    whose products of that depth these kernels leave to cuBLAS anyway (docs/decisions.md#q-products-tf32x3)."""
    return "tf32x3" if width >= MIN else "fp32"


def without_idle(schedule):
    """The schedule with fp32 for a tf32x3 stage that none of its products can take (kinds): the same launches (such
    products run in fp32 through cuBLAS either way), written as what they are, so that the tuner measures such
    points once."""
    p, used = schedule.precision, kinds(schedule)
    project = "fp32" if p.project == "tf32x3" and not {k for k in used if k.startswith("project")} else p.project
    update = "fp32" if p.update == "tf32x3" and "update" not in used else p.update
    if (project, update) == (p.project, p.update):
        return schedule
    return dataclasses.replace(schedule, precision=dataclasses.replace(p, project=project, update=update))


def render(spec: KernelSpec, schedule, target) -> Rendered:
    template = environment().get_template(f"{target.record.template_dir}/tf32x3.cu.j2")
    return Rendered(spec.name, template.render(version=__version__, arch=target.arch, name=spec.name,
                                               **{"t_fused": False, "lower_a": False, **CONFIGS[spec.kind]}))
