"""Panel builders the default heuristic and the tuner share: the kernel that holds a panel's rows and columns on
one block, a cluster or several blocks, within a target's register budget."""
from __future__ import annotations

import math
from dataclasses import replace

from ..plan.family import THREADS, panel_family, register_cap
from ..targets import Target
from .model import Panel, loop_applies

ONE_WARP_ROWS = 32  # the most rows of a lanes panel on one warp (docs/decisions.md#one-warp-rows)
CLUSTER_SLOTS = 4  # the most rows per thread of a rows panel on a cluster (cluster_panel)
CLUSTER_LANE_SLOTS = 16  # rows per warp of lanes panels on clusters (docs/decisions.md#cluster-lanes-panel)
SM90 = Target()


def fits(rows: int, panel: Panel, target: Target = SM90) -> bool:
    """Whether the panel's registers for `rows` rows are within the target's cap."""
    return panel_family(panel.variant).registers(panel, rows) <= register_cap(panel.threads, target.limits)


def one_block_panel(rows: int, width: int, target: Target = SM90) -> Panel | None:
    """The cheapest one-block kernel that holds `rows` x `width` in registers, or None: up to ONE_WARP_ROWS rows a
    lanes panel on one warp, up to 128 rows a warp panel, else a rows panel of at most four rows a thread (fewer
    threads make shorter reductions)."""
    if rows <= ONE_WARP_ROWS and width <= 32:
        return Panel(width, "lanes", 32)
    if rows <= 32 * 4:
        warp = Panel(width, "warp", 32)
        if fits(rows, warp, target):
            return warp
    for threads in THREADS[1:]:
        if math.ceil(rows / threads) > 4 and threads < 512:
            continue
        panel = Panel(width, "rows", threads)
        if fits(rows, panel, target):
            return panel
    return None


def multi_block_panel(rows: int, width: int, target: Target = SM90) -> Panel:
    """Blocks exchanging partial sums through global memory, only for panels no block can hold
    (docs/decisions.md#multi-block-panels)."""
    for blocks in range(2, 1 << 20):
        panel = Panel(width, "rows", 512, blocks)
        if fits(rows, panel, target):
            return panel
    raise ValueError(f"no panel kernel fits {rows} rows")  # pragma: no cover


def cluster_panel(rows: int, width: int, blocks: int, slots: int = CLUSTER_SLOTS, target: Target = SM90):
    """A rows panel over a cluster of `blocks` blocks (blocks=1: on one block, no cluster): the fewest threads per
    block that hold `rows` x `width` with at most `slots` rows per thread (more where registers demand), or None.
    Fewer rows per thread shorten the chain of dependent instructions that each column costs a thread."""
    for threads in THREADS[1:]:
        if math.ceil(math.ceil(rows / blocks) / threads) > slots and threads < 1024:
            continue
        panel = Panel(width, "rows", threads, blocks, cluster=blocks > 1)
        if fits(rows, panel, target):
            return panel
    return None


def lanes_panel(rows: int, width: int, slots: int | str = "auto", blocks: int = 1, target: Target = SM90):
    """A lanes panel for `rows` x `width` with about `slots` rows per warp (more warps where registers demand), or
    None where even 32 warps cannot hold the rows. "auto": one warp up to ONE_WARP_ROWS rows (its loop over columns
    unrolled), 8 rows per warp up to 256 rows, else 16 (docs/decisions.md#lanes-rows-per-warp). blocks > 1: the rows shared
    by a cluster of that many blocks."""
    if slots == "auto":
        slots = rows if rows <= ONE_WARP_ROWS and blocks == 1 else 8 if rows <= 256 else 16
    for warps in range(min(32, max(1, math.ceil(rows / (blocks * slots)))), 33):
        panel = Panel(width, "lanes", 32 * warps, blocks, cluster=blocks > 1)
        if fits(rows, panel, target):
            return panel
    return None


def wide_lanes_panel(width: int) -> Panel:
    """A lanes panel of 33 to 128 columns that is its matrix's last (plan/lanes.py): on one warp, two columns a lane,
    up to 64 columns; past 64, on a warp for each 32 columns."""
    return Panel(width, "lanes", 32 if width <= 64 else 32 * math.ceil(width / 32))


def cluster_lanes_panel(rows: int, width: int, blocks: int, slots: int = CLUSTER_LANE_SLOTS, target: Target = SM90):
    """A panel on a cluster of `blocks` blocks: a lanes panel of about `slots` rows per warp where it fits, else a
    rows panel (cluster_panel; docs/decisions.md#cluster-lanes-panel)."""
    return lanes_panel(rows, width, slots, blocks, target) or cluster_panel(rows, width, blocks, target=target)


def default_panel(rows: int, remaining: int, widths=(32, 16, 8), target: Target = SM90) -> Panel:
    """A panel for `rows` rows with `remaining` columns left: the widest of `widths` that one block holds, else
    several blocks (8 columns wide)."""
    for width in widths:
        panel = one_block_panel(rows, min(width, remaining), target)
        if panel is not None:
            return panel
    return multi_block_panel(rows, min(8, remaining), target)


def tsqr_panel(rows: int, remaining: int, width: int, threads: int, tile: int, slice_: int = 0) -> Panel | None:
    """A tsqr panel of at most `width` of the `remaining` columns, or None where `rows` are under two tiles. slice_:
    its tiles factored as cols panels with warps of at least that many columns (plan/tsqr.cols_slice) where that
    fits, else (and with 0) as rows panels on `threads` threads."""
    from ..plan.cols import cols_threads
    from ..plan.tsqr import cols_slice

    if rows < 2 * tile:
        return None
    width = min(width, remaining)
    cut = cols_slice(width, slice_, tile) if slice_ else 0
    return Panel(width, "tsqr", cols_threads(width, cut) if cut else threads, tile=tile, slice=cut)


def cols_panel(width: int, slice_: int, blocks: int = 1) -> Panel:
    """A cols panel of `width` columns on `blocks` blocks (2: a cluster) with `slice_` columns a warp, or the widest
    slice of plan/cols.SLICES that is not wider than the panel; on one block where the cluster's last block would
    own no columns (a narrow last panel)."""
    from ..plan.cols import SLICES, cols_threads, owns_columns

    slice_ = max((c for c in SLICES if c <= min(slice_, width)), default=SLICES[0])
    blocks = blocks if owns_columns(width, slice_, blocks) else 1
    return Panel(width, "cols", cols_threads(width, slice_, blocks), blocks, slice_, cluster=blocks > 1)


def with_loop(panel: Panel, loop: bool) -> Panel:
    """`panel` with Panel.loop set where its variant has the choice."""
    return replace(panel, loop=loop) if loop_applies(panel) else panel


def one_warp_tail(schedule):
    """`schedule` with every panel of at most ONE_WARP_ROWS rows (and 32 columns) on a lanes panel of one warp, the
    kernel the heuristic gives such a panel: a schedule tuned before that kernel existed may hold such a panel on
    several warps or a cluster."""
    panels, col = [], 0
    for p in schedule.panels:
        rows = schedule.m - col
        one = rows <= ONE_WARP_ROWS and p.width <= 32 and p.variant != "tsqr"
        panels.append(Panel(p.width, "lanes", 32) if one else p)
        col += p.width
    return replace(schedule, panels=tuple(panels))


def with_cluster(schedule, blocks: int, min_rows: int = 0, slots: int = CLUSTER_LANE_SLOTS, every: bool = False,
                 target: Target = SM90):
    """`schedule` with every cluster panel (every=True: also every lanes or rows panel on one block) of at least
    `min_rows` rows on clusters of `blocks` blocks instead (cluster_lanes_panel); panels that fit neither, and the
    others, stay as they are."""
    panels, col = [], 0
    for p in schedule.panels:
        rows = schedule.m - col
        chosen = p.cluster or (every and p.blocks == 1 and p.variant in ("lanes", "rows"))
        q = cluster_lanes_panel(rows, p.width, blocks, slots, target) if chosen and rows >= min_rows else None
        panels.append(with_loop(q, p.loop) if q is not None else p)
        col += p.width
    return replace(schedule, panels=tuple(panels))
