"""Panel family "tsqr", for tall panels of few matrices: a tree of QRs over tiles of `tile` rows (a multiple of
`threads`, at least twice the width), each on one block as a rows panel factors (slice 0) or, with `slice` columns a
warp, as a cols panel does (plan/cols.py: the tile's columns in registers, reflectors in dynamic shared memory),
then Q's columns down the tree and Householder reflectors rebuilt from Q (templates/cuda/tsqr.cuh; on Metal
templates/metal/tsqr.metal.j2, whose threadgroup memory plan/msl.py sizes); one launch per phase of the tree."""
from __future__ import annotations

from dataclasses import dataclass

from ..targets import MBARRIER
from . import cols, family

VARIANT = "tsqr"
VT_ONLY = False  # a trail kernel writes (VT)^T too
LOOP = True
CLUSTER = False
REG_OVERHEAD = 60
MAX_SLOTS = 8  # the most rows per thread of a tile (slice 0: a rows panel holds slots x width floats a thread)
# With cols tiles, at most this many rows a tile (32 a lane), and a thread's rows in the other phases at most this
# many floats (slots x width): past either, ptxas spills the kernel that holds both layouts
MAX_COLS_TILE = 1024
MAX_COLS_HELD = 64
COLS_TILE_LIMITS = f"at most {MAX_COLS_TILE} rows, at most {MAX_COLS_HELD} floats of rows a thread"
# src, h, tau, vt, zt, ts, its stride; kind, rows, at, out, tau_at, t_at, y, v1 (offsets in ts), c0, vld; vbs
SIGNATURE = "PPPPPPL" + "I" * 10 + "L"


def check(panel) -> None:
    family.check_threads(panel)
    if panel.blocks != 1:
        raise ValueError("Panel variant 'tsqr' takes blocks=1 (its tiles are its blocks)")
    if panel.threads < panel.width:
        raise ValueError(f"Panel variant 'tsqr' needs threads >= width; got {panel.threads} threads for "
                         f"width {panel.width}")
    if panel.slice:
        if panel.slice not in cols.SLICES:
            raise ValueError(f"Panel.slice must be 0 (rows tiles) or one of {cols.SLICES} (cols tiles) for variant "
                             f"'tsqr', got {panel.slice!r}")
        threads = cols.cols_threads(panel.width, panel.slice)
        if panel.threads != threads:
            raise ValueError(f"Panel.threads must be 32 * ceil(width / slice) = {threads} for variant 'tsqr' with "
                             f"slice {panel.slice} (a warp a slice), got {panel.threads}")
        if panel.loop:
            raise ValueError("Panel.loop applies to variant 'tsqr' with rows tiles (slice 0) only")
    if not isinstance(panel.tile, int) or not tile_fits(panel.width, panel.threads, panel.tile, panel.slice):
        most = most_slots(panel.width, panel.threads, panel.slice)
        limits = f" (cols tiles: {COLS_TILE_LIMITS})" if panel.slice else ""
        raise ValueError(f"Panel.tile (rows per tile of variant 'tsqr') must be a multiple of threads "
                         f"({panel.threads}), at least twice the width ({2 * panel.width}) and at most "
                         f"{max(most, 1)} x threads{limits}; got {panel.tile!r}")
    family.check_narrow(panel)


def most_slots(width: int, threads: int, slice_: int) -> int:
    """The most rows a thread of a tile (tile / threads): MAX_SLOTS with rows tiles; with cols tiles, within
    MAX_COLS_TILE and MAX_COLS_HELD."""
    return MAX_SLOTS if not slice_ else min(MAX_COLS_HELD // width, MAX_COLS_TILE // threads)


def tile_fits(width: int, threads: int, tile: int, slice_: int) -> bool:
    """Whether tiles of `tile` rows fit a panel: a multiple of threads, at least twice the width, at most
    most_slots rows a thread."""
    return tile >= 2 * width and tile % threads == 0 and tile // threads <= most_slots(width, threads, slice_)


def cols_slice(width: int, at_least: int, tile: int) -> int:
    """The narrowest slice of plan/cols.SLICES, at least `at_least`, on which a tsqr panel of `width` columns and
    tiles of `tile` rows factors its tiles as cols panels (a warp a slice: threads a block count of check_threads,
    the tile fitting); 0 where none does."""
    for slice_ in cols.SLICES:
        threads = cols.cols_threads(width, slice_)
        if slice_ >= at_least and threads in family.THREADS and tile_fits(width, threads, tile, slice_):
            return slice_
    return 0


def slots(panel, rows: int) -> int:
    return panel.tile // panel.threads


def registers(panel, rows: int) -> int:
    # the tile in registers, and a row of V and of Q beside it (products, final phase); with slice, the most of that
    # and of the cols factorization's (a lane's rows of its warp's columns)
    held = slots(panel, rows) * panel.width + 3 * panel.width + REG_OVERHEAD
    if not panel.slice:
        return held
    return max(held, cols.column_registers(panel.tile // 32, panel.slice, panel.threads))


def cols_shared(panel) -> int:
    """The cols tile factorization's dynamic shared memory: every reflector of a tile, tau, G and T, mbarriers."""
    return cols.shared_bytes_of(panel.width, panel.tile // 32, True) if panel.slice else 0


def shared_bytes(panel, rows: int, trail: bool, m: int, n: int) -> int:
    """tsqr.cuh's Shared (the rows panel's, five NB x PITCH blocks, 2 NB), and with slice the cols factorization's."""
    w = panel.width
    static = 4 * (panel.threads // 32 * 32 + 2 * w * w + 5 * w + 96 + 5 * w * ((w + 3) // 4 * 4 + 4) + 2 * w)
    return static + cols_shared(panel)


def spec_shared(panel, rows: int, trail: bool, m: int, n: int) -> int:
    return cols_shared(panel)


def vec(panel, n: int, c0: int) -> int:
    return family.vec(n, c0, panel.width)


def features(panel) -> tuple[str, ...]:
    return (MBARRIER,) if panel.slice else ()


def stream(spec) -> bool:
    """Whether the cols tile factorization's consumers stream reflectors (plan/cols.streams)."""
    return bool(spec.slice) and cols.streams(spec.slots * spec.threads // 32, spec.slice, spec.threads)


def name(spec) -> str:
    suffix = ("_trail" if spec.trail else "") + ("_loop" if spec.loop else "") + ("_st" if stream(spec) else "")
    cut = f"_c{spec.slice}" if spec.slice else ""
    return f"qr_tsqr_w{spec.width}_t{spec.threads}_s{spec.slots}{cut}_v{spec.vec}{suffix}"


def describe(panel) -> str:
    return f", tiles of {panel.tile} rows" + (f" (cols, slice {panel.slice})" if panel.slice else "")


def render(spec, schedule, target):
    return family.render_panel(spec, schedule, target, tsqr_stream=stream(spec))


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


