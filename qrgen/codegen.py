"""Rendering: (Problem, Target, Schedule) -> kernel source and the launch table that goes with it."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from . import __version__
from .schedule import REGS_PER_SM, Schedule, rows_shared_bytes, whole_shared_bytes

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"

# What differs between backends lives here, not in copied kernels.
BACKENDS = {
    "cuda": {"template": "cuda/qr.cu.j2", "suffix": ".cu"},
}
PRECISION_CODE = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}


@dataclass(frozen=True)
class KernelSpec:
    """One compiled panel kernel: everything here is a compile-time constant of its source."""

    name: str
    variant: str
    width: int
    threads: int
    blocks: int  # blocks per matrix
    slots: int  # rows each thread holds
    vec: int  # floats per global load
    trail: bool  # columns right of the panel exist: write V^T and (VT)^T for the trailing update
    slice: int  # columns per warp (cols), 0 otherwise
    shared_bytes: int  # dynamic shared memory (cols), 0 otherwise
    columns: tuple[int, ...]  # first columns of the panels that use it
    cluster: bool = False  # the blocks of a matrix form one thread-block cluster
    loop: bool = False  # warp and rows: the loop over columns is not unrolled (Panel.loop)
    formq: bool = False  # lanes: writes Q and R (qrgen.qr, mode "reduced") instead of h and tau (fused_q_kernel)


@dataclass(frozen=True)
class Launch:
    """One panel of the schedule: which kernel, where, how many flag arrivals per block it makes, which columns
    its own trailing update covers and where its reflectors go in its aggregate's V^T buffer."""

    kernel: str
    c0: int
    width: int
    rows: int
    threads: int
    blocks: int
    barriers: int
    trail: bool  # the kernel writes V^T and (VT)^T
    shared_bytes: int
    nc: int  # columns right of the panel that its own two GEMMs update (to the end of its aggregate, or reach's)
    v_row: int  # the panel's first row (and column) inside its aggregate's V^T buffer
    v_ld: int  # rows of that buffer (its leading dimension)
    v_bs: int  # floats per matrix in that buffer
    cluster: bool = False  # blocks > 1 as one cluster: no flags, no cooperative launch
    levels: tuple[tuple[int, int], ...] = ()  # a tsqr panel's tree (tsqr_levels): one launch per phase
    tile: int = 0  # a tsqr panel's rows per tile
    inner: int = 0  # a "whole" kernel's columns per panel: the launch factors and updates everything itself


@dataclass(frozen=True)
class Aggregate:
    """Columns [a0, a1) whose merged compact WY form updates columns [c1, n) after its last panel (nc = n - c1 of
    them): c1 is a1, or with Schedule.reach the next aggregate's end (its panels' own products update up to there)."""

    a0: int
    a1: int
    rows: int
    nc: int
    first: int  # panel indices first..last
    last: int
    c1: int


# The panel products of schedule.panel_update "split" (templates/cuda/split.cu.j2): blocks of SPLIT_THREADS,
# SPLIT_TILE rows per shared-memory step (project) or per block (update), 32 columns per block.
SPLIT_THREADS = 256
SPLIT_TILE = 64
# The panel products of schedule.panel_update "fused" (templates/cuda/fused.cu.j2): W = Z^T C and C -= V W in one
# launch, a block of FUSED_THREADS per 32 columns of C per matrix.
FUSED_THREADS = 256
FUSED_MIN_BLOCKS = 2  # resident blocks per SM the compiler plans registers for (128 a thread)
FUSED_ROWS = 32  # rows per projection chunk (at least: 4 per thread group)
FUSED_CLUSTERS = (1, 2, 4, 8)  # blocks per cluster that split the rows (fused_cluster picks one per launch)
FUSED_MIN_ROWS = 128  # rows per block at least, where a fused launch splits the rows over a cluster
FUSED_SHARED_FLOATS = 10240  # for the chunks in flight (40 KiB; W's own beside them)
SM_SHARED_BYTES = 233472  # shared memory of an sm_90 SM (228 KiB), 1 KiB of it reserved per resident block
TMAT_KERNEL = "qr_tmat"
SCALE_KERNEL = "qr_scale"
SCALE_THREADS = 256
TMAT_THREADS = 1024  # threads per matrix (block products over 4x more threads than 256; 64 registers, 0 spills)
# The T kernel (templates/cuda/tmat.cuh.j2) builds T by blocks in shared memory for up to TMAT_BLOCKED_MAX reflectors,
# and for up to TMAT_MAX (schedule.MAX_AGGREGATE, qrgen.qmatrix's blocks) by halves of at most TMAT_BLOCKED_MAX each
# and the corner between them.
TMAT_BLOCKED_MAX = 128
TMAT_MAX = 2 * TMAT_BLOCKED_MAX
TMAT_LD = TMAT_BLOCKED_MAX + 4  # floats between rows of G and T in shared memory: 16-byte aligned, 4 banks apart
TMAT_XLD = 32 + 4  # and of X (32 columns)


# The trailing update's products in tf32x3 (templates/cuda/gemm3.cu.j2, cp.async-pipelined): tiles, warps, K per step,
# steps in flight and resident blocks per SM, per product; measured on the H200 against cuBLAS fp32 (BENCHMARKS.md,
# twelfth session: projections 1.5x with 128 x 64 tiles, updates 1.6x with 64 x 64). project: W = Z^T C, A = Z^T
# with K contiguous; update: C -= V W and (VT)^T = T^T V^T, A = V or T given transposed (M contiguous); gram: an
# aggregate's G = V^T V, A = V^T and B = V given as V^T (both K contiguous), only the tiles that reach G's upper
# part (upper_only). Every kernel can split K into parts written apart (runtime.gram_splits: G of few matrices).
# project64: a projection of at most 64 rows (aggregates of 64) on 64 x 64 tiles, where the 128-row tile would
# compute half its products on zeros (twenty-third session: 640 x 512²'s first aggregate 608 -> 365 µs).
GEMM3 = {
    "project": dict(bm=128, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2, a_mcontig=False,
                    b_kcontig=False, upper_only=False),
    "project64": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=2, a_mcontig=False,
                      b_kcontig=False, upper_only=False),
    "update": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=3, a_mcontig=True,
                   b_kcontig=False, upper_only=False),
    "gram": dict(bm=64, bn=64, bk=32, wm_warps=2, wn_warps=2, stages=3, min_blocks=3, a_mcontig=False,
                 b_kcontig=True, upper_only=True),
}


GEMM3_MIN = 64  # products with a smaller dimension (a panel's own: 32 rows or a depth of 32) stay with cuBLAS


def gemm3_threads(c: dict) -> int:
    """Threads of a gemm3 kernel of configuration `c` (a GEMM3 entry)."""
    return 32 * c["wm_warps"] * c["wn_warps"]


def gemm3_shared_bytes(c: dict) -> int:
    """Dynamic shared memory of a gemm3 kernel of configuration `c`: its stages of A's tile ([k][m] padded by 4, or
    [m][k] by 8) and B's ([k][n] padded by 4, or [n][k] by 8)."""
    a = c["bk"] * (c["bm"] + 4) if c["a_mcontig"] else c["bm"] * (c["bk"] + 8)
    b = c["bn"] * (c["bk"] + 8) if c["b_kcontig"] else c["bk"] * (c["bn"] + 4)
    return 4 * c["stages"] * (a + b)


def gemm3_kinds(schedule: Schedule) -> tuple[str, ...]:
    """The gemm3 kernels a schedule's tf32x3 products can take: "project" and "update" as its precision says, where
    some product is at least GEMM3_MIN in every dimension (an aggregate with columns right of it, or a panel that
    wide); an update in tf32x3 also takes the aggregates' merges ((VT)^T by the update kernel, and G by the gram
    kernel where their Gram precision is fp32), which qr's keep plans run for the last aggregate too. The gram kernel
    also serves an fp32 G of few matrices, its K split over more blocks (runtime.gram_splits), whatever the update."""
    p, aggs = schedule.precision, aggregates(schedule)
    # the projections' rows: each aggregate's width where columns lie right of it, each panel's that the kernels take
    widths = {a.a1 - a.a0 for a in aggs if a.nc > 0} | {w.width for w in schedule.panels if w.width >= GEMM3_MIN}
    projects = {project_kind(w) for w in widths if w >= GEMM3_MIN} if p.project == "tf32x3" else set()
    wide = any(a.a1 - a.a0 >= GEMM3_MIN for a in aggs)  # a G the kernels take
    return tuple(kind for kind, used in (("project", "project" in projects), ("project64", "project64" in projects),
                                         ("update", p.update == "tf32x3" and bool(widths or aggs)),
                                         ("gram", p.gram == "fp32" and wide))
                 if used)


def project_kind(rows: int) -> str:
    """The gemm3 kernel of a projection W = Z^T C with `rows` rows (the aggregate's or panel's width)."""
    return "project64" if rows <= GEMM3["project64"]["bm"] else "project"


def q_precision(width: int) -> str:
    """The precision of qr's two Q products (runtime.drive_q) for a kept block `width` columns wide, whatever the
    schedule's own precisions: tf32x3 (fp32-class accuracy, about 2x cuBLAS's fp32 SGEMM on the H200 at these
    shapes) from GEMM3_MIN columns, the aggregates; fp32 for narrower blocks, the panels, whose products of that
    depth the gemm3 kernels leave to cuBLAS anyway."""
    return "tf32x3" if width >= GEMM3_MIN else "fp32"


def without_idle_tf32x3(schedule: Schedule) -> Schedule:
    """The schedule with fp32 for a tf32x3 stage that none of its products can take (gemm3_kinds): the same launches
    (such products run in fp32 through cuBLAS either way), written as what they are, so that the tuner measures such
    points once."""
    p, kinds = schedule.precision, gemm3_kinds(schedule)
    project = "fp32" if p.project == "tf32x3" and not {"project", "project64"} & set(kinds) else p.project
    update = "fp32" if p.update == "tf32x3" and "update" not in kinds else p.update
    if (project, update) == (p.project, p.update):
        return schedule
    return dataclasses.replace(schedule, precision=dataclasses.replace(p, project=project, update=update))


def gemm3_name(kind: str) -> str:
    return f"qr_gemm3_{kind}"


def gemm3_kernel(kind: str) -> KernelSpec:
    """The tf32x3 kernel `kind` ("project", "update" or "gram"), the same for every schedule."""
    return KernelSpec(gemm3_name(kind), "gemm3", 0, gemm3_threads(GEMM3[kind]), 1, 0, 4, False, 0,
                      gemm3_shared_bytes(GEMM3[kind]), ())


def render_gemm3(kernel: KernelSpec, arch: str = "sm_90") -> Rendered:
    kind = kernel.name.rsplit("_", 1)[1]
    template = environment().get_template("cuda/gemm3.cu.j2")
    return Rendered(kernel.name, template.render(version=__version__, arch=arch, name=kernel.name, **GEMM3[kind]))


def tmat_shared_bytes(a: int) -> int:
    """Dynamic shared memory of the T kernel for `a` reflectors, its halves (the first min(a, TMAT_BLOCKED_MAX), then
    the rest) rounded up to whole 32-row blocks: G's staging space (the first half's rows: a half's diagonal block of
    G, then the corner's G12), T1 and T2 (rows TMAT_LD floats apart, G's too), X (rows TMAT_XLD apart: the first
    half's rows less one block, or TMAT_BLOCKED_MAX rows for the corner)."""
    if not 1 <= a <= TMAT_MAX:
        raise ValueError(f"the T kernel takes 1 to {TMAT_MAX} reflectors; got {a}")
    h = TMAT_BLOCKED_MAX
    r1, r2 = 32 * -(-min(a, h) // 32), 32 * -(-(a - h) // 32) if a > h else 0
    return 4 * ((2 * r1 + r2) * TMAT_LD + TMAT_XLD * (h if r2 else r1 - 32))


@dataclass(frozen=True)
class Rendered:
    name: str
    source: str


@lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )


def _vec(*values: int) -> int:
    for v in (4, 2, 1):
        if all(x % v == 0 for x in values):
            return v
    return 1


def tsqr_levels(rows: int, width: int, tile: int) -> tuple[tuple[int, int], ...]:
    """The tree of a "tsqr" panel: per level, (its rows, its tiles of `tile` rows); level 0 is the panel, each next
    level the stacked width x width R factors of the last one's tiles, up to the root (one tile)."""
    levels = [(rows, -(-rows // tile))]
    while levels[-1][1] > 1:
        r = levels[-1][1] * width
        levels.append((r, -(-r // tile)))
    return tuple(levels)


@dataclass(frozen=True)
class TsqrLayout:
    """Where a tsqr panel's kernel keeps its tree in the work buffer "ts", in floats from a matrix's start (each
    a multiple of 4): the stacks S_l of levels l >= 1 (stack[l - 1]; the last one is the root's R), each level's
    tau and T, and level 0's first tile's top rows."""

    stack: tuple[int, ...]
    tau: tuple[int, ...]
    t: tuple[int, ...]
    v1: int
    floats: int


def tsqr_layout(levels: tuple[tuple[int, int], ...], width: int) -> TsqrLayout:
    at = 0

    def take(floats):
        nonlocal at
        start, at = at, at + -(-floats // 4) * 4
        return start

    stack = tuple(take(tiles * width * width) for _, tiles in levels)
    tau = tuple(take(tiles * width) for _, tiles in levels)
    t = tuple(take(tiles * width * width) for _, tiles in levels)
    v1 = take(width * width)
    return TsqrLayout(stack, tau, t, v1, at)


@dataclass(frozen=True)
class TsqrPhase:
    """One launch of a tsqr panel's kernel (its arguments after the pointers; offsets in floats within "ts")."""

    kind: int  # 0 factor level 0 (src into h), 1 factor a stack, 2 expand a stack, 3 the final phase
    rows: int  # rows of the level
    tiles: int  # blocks per matrix
    at: int  # the level's stack (kinds 1 and 2)
    out: int  # the next stack (kinds 0 and 1: the tiles' R), the root's R (kind 3)
    tau: int
    t: int
    y: int  # the parent's Q (kinds 2 and 3), -1: the identity (the root)
    v1: int


def tsqr_phases(levels: tuple[tuple[int, int], ...], width: int) -> tuple[TsqrPhase, ...]:
    """The launches of a tsqr panel: each level factored bottom-up, the levels above 0 expanded top-down (the
    root's Y the identity; a level's Q replaces its stack, where its children's Y come from), then the final phase
    over level 0's tiles."""
    lay = tsqr_layout(levels, width)
    top = len(levels) - 1

    def phase(kind, lv, at=0, out=0, y=-1):
        return TsqrPhase(kind, levels[lv][0], levels[lv][1], at, out, lay.tau[lv], lay.t[lv], y, lay.v1)

    return (tuple(phase(0 if lv == 0 else 1, lv, lay.stack[lv - 1] if lv else 0, lay.stack[lv])
                  for lv in range(top + 1))
            + tuple(phase(2, lv, lay.stack[lv - 1], y=lay.stack[lv] if lv < top else -1) for lv in range(top, 0, -1))
            + (phase(3, 0, out=lay.stack[top], y=lay.stack[0] if top else -1),))


def inner_panels(launch: Launch, n: int) -> tuple[tuple[int, int, int], ...]:
    """A "whole" launch's panels in order (Launch.inner columns each, the last one narrower where that does not
    divide its width): (first column, width, columns right of it to n, which its update covers)."""
    return tuple((c, min(launch.inner, launch.width - c), n - c - min(launch.inner, launch.width - c))
                 for c in range(0, launch.width, launch.inner))


def aggregates(schedule: Schedule) -> tuple[Aggregate, ...]:
    """The schedule's aggregates; without aggregation, each panel is its own and nothing follows its last panel.
    With Schedule.reach an aggregate's merged form updates from where the next aggregate ends (a keep plan merges
    every aggregate all the same, for Q)."""
    if not schedule.aggregate:
        return ()
    k, size = min(schedule.m, schedule.n), schedule.aggregate
    starts = schedule.starts()
    out = []
    for a0 in range(0, k, size):
        a1 = min(a0 + size, k)
        c1 = min(a1 + size, k) if schedule.reach and a1 < k else a1
        panels = [i for i, c in enumerate(starts) if a0 <= c < a1]
        out.append(Aggregate(a0, a1, schedule.m - a0, schedule.n - c1, panels[0], panels[-1], c1))
    return tuple(out)


@dataclass(frozen=True)
class Kept:
    """A block reflector a keep plan keeps for Q: a panel, or an aggregate of panels. Its V^T (in buffer "vt") and
    (VT)^T (in `z`: "zt" for a panel, "zg" for an aggregate) are width x rows, from row c0, the chunk's matrices
    width * rows floats apart from nb * offset floats on."""

    c0: int
    width: int
    rows: int
    offset: int
    z: str


def kept_blocks(launches, aggs) -> tuple[Kept, ...]:
    """A keep plan's kept blocks in order: its aggregates where it has them, else its panels."""
    spans = [(a.a0, a.a1 - a.a0, a.rows, "zg") for a in aggs] or [(L.c0, L.width, L.rows, "zt") for L in launches]
    out, at = [], 0
    for c0, width, rows, z in spans:
        out.append(Kept(c0, width, rows, at, z))
        at += width * rows
    return tuple(out)


def plan(schedule: Schedule, keep: bool = False) -> tuple[tuple[KernelSpec, ...], tuple[Launch, ...]]:
    """The distinct kernels a schedule needs, and the launch of each panel in order. keep: every panel writes its
    V^T and (VT)^T, the last ones too, and every aggregate is merged, the last one too, for qr's Q (runtime.drive_q),
    whose products for kept blocks of GEMM3_MIN columns or more take the gemm3 kernels (q_precision)."""
    keys: dict[tuple, list[int]] = {}
    launches = []
    aggs = aggregates(schedule)
    for index, (panel, c0) in enumerate(zip(schedule.panels, schedule.starts())):
        rows = schedule.m - c0
        agg = next((a for a in aggs if a.first <= index <= a.last), None)
        if agg is None:
            nc, v_row, v_ld, v_bs = schedule.n - c0 - panel.width, 0, rows, panel.width * rows
        else:
            width = agg.a1 - agg.a0
            # to where its aggregate's merged form begins: the aggregate's end, or with Schedule.reach the next one's
            nc, v_row, v_ld, v_bs = agg.c1 - c0 - panel.width, c0 - agg.a0, agg.rows, width * agg.rows
        whole = panel.variant == "whole"
        if whole and keep:
            raise ValueError("a 'whole' schedule keeps no reflectors for Q (its panels never leave shared memory): "
                             "no keep plan")
        if whole:
            nc = 0  # its kernel updates every column itself
        trail = keep or nc > 0 or (agg is not None and agg.nc > 0)
        if whole:
            slots = math.ceil(rows / panel.threads)
            vec = _vec(schedule.n)
            shared = whole_shared_bytes(schedule.m, schedule.n, panel.threads, panel.slice)
        elif panel.variant == "lanes":
            slots = math.ceil(rows / (panel.blocks * panel.threads // 32))
            vec = 1
            shared = 0
        elif panel.variant == "cols":
            slots = math.ceil(rows / 32)
            vec = _vec(schedule.n, c0, panel.width, panel.slice)
            shared = cols_shared_bytes(panel.width, slots, trail)
        elif panel.variant == "tsqr":
            slots = panel.tile // panel.threads
            vec = _vec(schedule.n, c0, panel.width)
            shared = 0
        else:
            slots = math.ceil(math.ceil(rows / panel.blocks) / panel.threads)
            vec = _vec(schedule.n, c0, panel.width)
            shared = 0
        levels = tsqr_levels(rows, panel.width, panel.tile) if panel.variant == "tsqr" else ()
        key = (panel.variant, panel.width, panel.threads, panel.blocks, slots, vec, trail, panel.slice, shared,
               panel.cluster, panel.loop)
        keys.setdefault(key, []).append(c0)
        # flag arrivals per block (multi-block panels without a cluster): one per column, one more for G
        barriers = 0 if panel.cluster or whole else panel.width + (1 if panel.width >= 2 and trail else 0)
        launches.append(Launch(kernel=_name(key), c0=c0, width=panel.width, rows=rows, threads=panel.threads,
                               blocks=panel.blocks, barriers=barriers, trail=trail, shared_bytes=shared, nc=nc,
                               v_row=v_row, v_ld=v_ld, v_bs=v_bs, cluster=panel.cluster, levels=levels,
                               tile=panel.tile, inner=panel.slice if whole else 0))
    kernels = [KernelSpec(_name(key), *key[:-2], columns=tuple(cols), cluster=key[-2], loop=key[-1])
               for key, cols in keys.items()]
    fused = None if keep else fused_q_kernel(kernels, launches)
    if fused is not None:
        kernels.append(fused)
    widths = sorted({L.width for L in launches if L.nc > 0})
    if schedule.panel_update == "split":
        kernels += [split_kernel(kind, w) for w in widths for kind in ("project", "update")]
    elif schedule.panel_update == "fused":
        kernels += [fused_kernel(w, cl) for w in widths for cl in FUSED_CLUSTERS]
    if any(a.nc > 0 for a in aggs) or (keep and aggs):
        kernels.append(tmat_kernel())
    if schedule.scaled:
        kernels.append(scale_kernel())
    kinds = set(gemm3_kinds(schedule))
    for block in kept_blocks(launches, aggs) if keep else ():
        if q_precision(block.width) == "tf32x3":
            kinds |= {project_kind(block.width), "update"}  # Q's W = V^T P and P -= (V T) W
    kernels += [gemm3_kernel(kind) for kind in GEMM3 if kind in kinds]
    return tuple(kernels), tuple(launches)


def fused_q_kernel(kernels, launches) -> KernelSpec | None:
    """For a schedule of one lanes panel on one block with nothing right of it (m >= n, n <= 32): the same kernel
    writing Q (m x n) and R (n x n) of qr's reduced mode in one launch, from G, T and V in registers and shared
    memory, instead of geqrf's h and tau followed by Q's blocked products. None for other schedules."""
    if len(launches) != 1 or launches[0].nc or launches[0].cluster:
        return None
    (kernel,) = [k for k in kernels if k.name == launches[0].kernel]
    if kernel.variant != "lanes":
        return None
    return dataclasses.replace(kernel, name=kernel.name + "_q", formq=True, columns=())


def cols_shared_bytes(width: int, slots: int, trail: bool) -> int:
    """Shared memory of a cols panel: every reflector (padded rows), tau, G and T when a trailing update follows,
    and one 8-byte mbarrier per reflector (the layout of panel_cols in templates/cuda/panel_cols.cuh.j2)."""
    floats = width * slots * 32 + width + (2 * width * (width + 1) if trail else 0)
    return 4 * (floats + (floats & 1)) + 8 * width


def _name(key: tuple) -> str:
    variant, width, threads, blocks, slots, vec, trail, slice_, _, cluster, loop = key
    suffix = ("_trail" if trail else "") + ("_loop" if loop else "")
    if variant == "tsqr":
        return f"qr_tsqr_w{width}_t{threads}_s{slots}_v{vec}{suffix}"
    if variant == "cols":
        return f"qr_cols_w{width}_c{slice_}_s{slots}_v{vec}{suffix}"
    if variant == "whole":
        return f"qr_whole_p{slice_}_t{threads}_s{slots}_v{vec}{suffix}"
    if variant == "lanes":
        return f"qr_lanes_w{width}_t{threads}{f'_c{blocks}' if cluster else ''}_s{slots}{suffix}"
    return f"qr_{variant}_w{width}_t{threads}_{'c' if cluster else 'b'}{blocks}_s{slots}_v{vec}{suffix}"


def render(schedule: Schedule, kernel: KernelSpec, arch: str = "sm_90", backend: str = "cuda") -> Rendered:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {backend!r}")
    if kernel.variant in ("project", "update"):
        return render_split(kernel, arch)
    if kernel.variant == "fused":
        return render_fused(kernel, arch)
    if kernel.variant == "tmat":
        return render_tmat(arch)
    if kernel.variant == "gemm3":
        return render_gemm3(kernel, arch)
    if kernel.variant == "scale":
        template = environment().get_template("cuda/scale.cu.j2")
        return Rendered(kernel.name, template.render(version=__version__, arch=arch, k=kernel))
    template = environment().get_template(BACKENDS[backend]["template"])
    source = template.render(
        version=__version__,
        m=schedule.m,
        n=schedule.n,
        k_total=min(schedule.m, schedule.n),
        arch=arch,
        gram_code=PRECISION_CODE[schedule.precision.gram],
        k=kernel,
        min_blocks=whole_min_blocks(kernel) if kernel.variant == "whole" else 1,
    )
    return Rendered(name=kernel.name, source=source)


WHOLE_MIN_REGISTERS = 96  # a "whole" kernel's register cap is at least this, whatever the blocks an SM could hold


def whole_blocks_by_shared(kernel: KernelSpec) -> int:
    """The blocks of a "whole" kernel an SM's shared memory holds (its dynamic and static shared memory each)."""
    return SM_SHARED_BYTES // (kernel.shared_bytes + rows_shared_bytes(kernel.threads // 32, kernel.slice) + 1024)


def whole_min_blocks(kernel: KernelSpec) -> int:
    """The resident blocks per SM a "whole" kernel is compiled for (__launch_bounds__): as many as its shared memory
    allows, down to a register cap of WHOLE_MIN_REGISTERS."""
    return max(1, min(whole_blocks_by_shared(kernel), REGS_PER_SM // (kernel.threads * WHOLE_MIN_REGISTERS)))


def tmat_kernel() -> KernelSpec:
    """The T kernel, the same for every schedule (aggregates, and Q's blocks in qrgen.qmatrix)."""
    return KernelSpec(TMAT_KERNEL, "tmat", 0, TMAT_THREADS, 1, 0, 1, False, 0, tmat_shared_bytes(TMAT_MAX), ())


def scale_kernel() -> KernelSpec:
    """The power-of-two scaling of Schedule.scaled (three phases, one kernel for every schedule)."""
    return KernelSpec(SCALE_KERNEL, "scale", 0, SCALE_THREADS, 1, 0, 4, False, 0, 0, ())


def split_kernel(kind: str, width: int) -> KernelSpec:
    """The "split" panel product `kind` ("project" or "update") for panels of `width` columns."""
    return KernelSpec(split_name(kind, width), kind, width, SPLIT_THREADS, 1, 0, 1, False, 0, 0, ())


def split_name(kind: str, width: int) -> str:
    return f"qr_{kind}_w{width}"


def render_split(kernel: KernelSpec, arch: str = "sm_90") -> Rendered:
    template = environment().get_template("cuda/split.cu.j2")
    return Rendered(kernel.name, template.render(version=__version__, arch=arch, k=kernel, tile=SPLIT_TILE))


def fused_kernel(width: int, cluster: int = 1) -> KernelSpec:
    """The "fused" panel products (W = Z^T C, then C -= V W, one launch) for panels of `width` columns; with
    cluster > 1 the rows split over a cluster of that many blocks."""
    return KernelSpec(fused_name(width, cluster), "fused", width, FUSED_THREADS, cluster, 0, 1, False, 0,
                      fused_layout(width, cluster)["shared_bytes"], (), cluster=cluster > 1)


def fused_name(width: int, cluster: int = 1) -> str:
    return f"qr_fused_w{width}" + (f"_c{cluster}" if cluster > 1 else "")


def fused_layout(width: int, cluster: int = 1) -> dict:
    """The fused kernel's shapes for panels of `width` columns: W's rows padded to a power of two from 4 (whole 4 x 4
    thread tiles that divide the block: wp); rows per projection chunk (FUSED_ROWS, or 4 per thread group where
    there are more groups: rt1) and per update chunk (rt2); as many chunks in flight (2 to 4: s1, s2) as
    FUSED_SHARED_FLOATS hold; the blocks per cluster (cl); its dynamic shared memory (the FusedShared of
    templates/cuda/fused.cu.j2)."""
    wp = max(4, 1 << (width - 1).bit_length())
    groups = FUSED_THREADS // (wp // 4 * 8)
    rt1 = max(FUSED_ROWS, 4 * groups)
    rt2 = 4 * FUSED_THREADS // 8
    s1 = max(2, min(4, FUSED_SHARED_FLOATS // (wp * (rt1 + 4) + rt1 * 32)))
    s2 = max(2, min(4, FUSED_SHARED_FLOATS // (wp * (rt2 + 4))))
    union = max(s1 * (wp * (rt1 + 4) + rt1 * 32), groups * wp * 32, s2 * wp * (rt2 + 4))
    w, wt = wp * 32, (wp * 32 if cluster > 1 else 0)  # W, and the cluster's total W
    return dict(wp=wp, rt1=rt1, rt2=rt2, s1=s1, s2=s2, cl=cluster, shared_bytes=4 * (union + w + wt))


def fused_cluster(batch: int, nc: int, rows: int, sms: int) -> int:
    """Blocks per cluster of a fused launch (FUSED_CLUSTERS): the most that keep it within two resident
    blocks per SM, each block FUSED_MIN_ROWS rows or more; 1 where the blocks of 32 columns fill the GPU alone."""
    tiles, cluster = -(-nc // 32), 1
    while (2 * cluster in FUSED_CLUSTERS and batch * tiles * 2 * cluster <= 2 * sms
           and rows >= 2 * cluster * FUSED_MIN_ROWS):
        cluster *= 2
    return cluster


def render_fused(kernel: KernelSpec, arch: str = "sm_90") -> Rendered:
    layout = fused_layout(kernel.width, kernel.blocks)
    template = environment().get_template("cuda/fused.cu.j2")
    return Rendered(kernel.name, template.render(version=__version__, arch=arch, k=kernel, bn=32,
                                                 threads=FUSED_THREADS, min_blocks=FUSED_MIN_BLOCKS, **layout))


def render_tmat(arch: str = "sm_90") -> Rendered:
    template = environment().get_template("cuda/tmat.cu.j2")
    return Rendered(TMAT_KERNEL, template.render(version=__version__, arch=arch, k=tmat_kernel(),
                                                 blocked_max=TMAT_BLOCKED_MAX, tmat_max=TMAT_MAX, ld=TMAT_LD,
                                                 xld=TMAT_XLD))


def render_all(schedule: Schedule, arch: str = "sm_90", backend: str = "cuda", keep: bool = False) -> list[Rendered]:
    """Every kernel of the schedule's plan (a keep plan's where keep), rendered."""
    kernels, _ = plan(schedule, keep)
    return [render(schedule, k, arch, backend) for k in kernels]
