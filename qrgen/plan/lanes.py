"""Panel family "lanes": one block per matrix (or, with cluster=True, 2 or more blocks of one cluster sharing the
rows); lane c of every warp owns column c, the warps own consecutive row ranges (templates/cuda/panel_lanes.cuh).
The loop over columns is not unrolled, except on one warp (threads=32, blocks=1), where every row is a constant;
there a panel of at most 16 columns that is its matrix's last holds several matrices a warp (pack). A lanes panel
that is its matrix's last may be wider (templates/cuda/panel_lanes_wide.cuh): up to 64 columns on one warp, lane c
owning columns c and 32 + c (its column loop rolled with Panel.loop, else unrolled by two), or up to 128 on a warp
for each 32 columns, lane c of warp w owning column 32w + c; either way a lane holds every row of its columns."""
from __future__ import annotations

import dataclasses
import math

from ..targets import CLUSTERS, MBARRIER
from . import family
from .family import PANEL_SIGNATURE as SIGNATURE  # noqa: F401

VARIANT = "lanes"
VT_ONLY = False  # a trail kernel writes (VT)^T too
LOOP = True  # Panel.loop: on one warp past 32 columns (LanesWide), the column loop rolled, not unrolled by two
CLUSTER = True
REG_OVERHEAD = 24
WIDE_MAX = 64  # columns of a lanes panel on one warp, two a lane (templates/cuda/panel_lanes_wide.cuh) ...
BLOCK_MAX = 128  # ... and columns (and rows) on a block of a warp for each 32 columns, one a lane (there too)
# Registers from ptxas reports beside the one-warp kernel's three arrays (tests/compile: the most rows it admits
# compile without spills) and beside the block kernel's column, at BLOCK_MAX rows.
WIDE_OVERHEAD = 40
BLOCK_OVERHEAD = 90
WIDE_CHUNK = 4  # rows a chunk of the one-warp kernel's column code (LanesWide::CH)


def check(panel) -> None:
    if not isinstance(panel.threads, int) or panel.threads % 32 or not 32 <= panel.threads <= 1024:
        raise ValueError(f"Panel.threads must be a multiple of 32 from 32 to 1024 for variant 'lanes', "
                         f"got {panel.threads!r}")
    if panel.blocks != 1 and not panel.cluster:
        raise ValueError(f"Panel variant 'lanes' takes blocks=1, or 2 or more blocks with cluster=True; got "
                         f"blocks={panel.blocks!r} with cluster={panel.cluster!r}")
    wide = panel.width > 32 and panel.blocks == 1 and (
        (panel.threads == 32 and panel.width <= WIDE_MAX)
        or (panel.threads == 32 * math.ceil(panel.width / 32) and panel.width <= BLOCK_MAX))
    if panel.loop and not (wide and panel.threads == 32):
        raise ValueError(f"Panel.loop applies to a lanes panel past 32 columns on one warp (the column loop rolled "
                         f"rather than unrolled by two); got width {panel.width} on {panel.threads} threads x "
                         f"{panel.blocks} block(s)")
    if panel.width > 32 and not wide:
        raise ValueError(f"Panel.width must be at most 32 for variant 'lanes', or up to {WIDE_MAX} on one warp "
                         f"(threads=32), or up to {BLOCK_MAX} on a warp for each 32 columns (threads = 32 x "
                         f"ceil(width / 32)), on one block; got width {panel.width} on {panel.threads} threads x "
                         f"{panel.blocks} block(s)")
    family.check_no(panel, "tile", "slice")


def check_plan(schedule, index: int, trail: bool) -> None:
    """A lanes panel past 32 columns writes no V^T or T: it must be its matrix's last, with no columns right of it
    and no reflectors kept for Q; with a warp for each 32 columns, of at most BLOCK_MAX rows."""
    panel = schedule.panels[index]
    if panel.width > 32 and trail:
        raise ValueError(f"Schedule.panels[{index}] (lanes, width {panel.width}): a lanes panel past 32 columns must "
                         f"be the last, with no columns right of it and no reflectors kept for Q")
    rows = schedule.m - schedule.starts()[index]
    if panel.width > 32 and panel.threads > 32 and rows > BLOCK_MAX:
        raise ValueError(f"Schedule.panels[{index}] (lanes, width {panel.width} on {panel.threads} threads): a lanes "
                         f"panel with a warp for each 32 columns takes at most {BLOCK_MAX} rows, got {rows}")


def slots(panel, rows: int) -> int:
    if panel.width > 32:  # a lane holds every row of its columns
        return rows
    return math.ceil(rows / (panel.blocks * panel.threads // 32))


def registers(panel, rows: int) -> int:
    if panel.width > 32 and panel.threads > 32:  # its column (the pivot's tail read from shared memory as it is used)
        return slots(panel, rows) + BLOCK_OVERHEAD
    if panel.width > 32:  # its two columns and the broadcast one
        return 3 * slots(panel, rows) + WIDE_OVERHEAD
    # the column's entries, the broadcast column j, the product (V T)^T: three arrays
    return 3 * slots(panel, rows) + REG_OVERHEAD


def shared_bytes(panel, rows: int, trail: bool, m: int, n: int) -> int:
    warps, w = panel.threads // 32, panel.width
    if w > 32:  # LanesWide: registers and shuffles only; LanesBlock: the tail by parity, sigma and the pivot
        return 0 if panel.threads == 32 else 4 * (2 * math.ceil(rows / 4) * 4 + 4)
    return 4 * (2 * warps * 32 + 64 + 2 * w * (w + 1) + w + (64 * (panel.blocks + 1) + 4 if panel.cluster else 1))


def spec_shared(panel, rows: int, trail: bool, m: int, n: int) -> int:
    return 0


def vec(panel, n: int, c0: int) -> int:
    return 1


def features(panel) -> tuple[str, ...]:
    return (CLUSTERS, MBARRIER) if panel.cluster else ()


def wide_code_rows(width: int, rows: int) -> int:
    """The one-warp wide kernel's code size in rows of column code: one copy of a column's code for each chunk of
    WIDE_CHUNK rows that can hold the pivot row, each covering the rows from its chunk down."""
    return sum(rows - WIDE_CHUNK * q for q in range(-(-width // WIDE_CHUNK)))


def pack(panel, trail: bool) -> int:
    """Matrices a block factors: on one warp, a panel of at most 16 columns with nothing right of it (no G, T or
    V^T) takes a segment of 32 / pack lanes (a power of two at least its width) a matrix, so the lanes a narrow
    panel would leave idle factor other matrices (docs/decisions.md#lanes-pack); 1 otherwise."""
    if panel.threads != 32 or panel.blocks != 1 or panel.width > 16 or trail:
        return 1
    return 32 // (1 << (panel.width - 1).bit_length())


def name(spec) -> str:
    suffix = ("_trail" if spec.trail else "") + ("_loop" if spec.loop else "") + (
        f"_p{spec.pack}" if spec.pack > 1 else "")
    return (f"qr_lanes_w{spec.width}_t{spec.threads}{f'_c{spec.blocks}' if spec.cluster else ''}_s{spec.slots}"
            f"{suffix}")


def describe(panel) -> str:
    if panel.width > 32:
        return ", two columns a lane" if panel.threads == 32 else ", a warp for each 32 columns"
    return f" x{panel.blocks} blocks" + (" (cluster)" if panel.cluster else "") if panel.blocks > 1 else ""


def render(spec, schedule, target):
    return family.render_panel(spec, schedule, target)


def fused_q_kernel(kernels, launches):
    """For a schedule of one lanes panel on one block with nothing right of it (m >= n, n <= 32): the same kernel
    writing Q (m x n) and R (n x n) of qr's reduced mode in one launch, from G, T and V in registers and shared
    memory, instead of geqrf's h and tau followed by Q's blocked products. None for other schedules."""
    if len(launches) != 1 or launches[0].nc or launches[0].cluster or launches[0].width > 32:
        return None
    (kernel,) = [k for k in kernels if k.name == launches[0].kernel]
    if kernel.variant != VARIANT:
        return None
    return dataclasses.replace(kernel, name=kernel.name + "_q", formq=True, columns=())
