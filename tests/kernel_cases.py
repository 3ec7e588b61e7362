"""Test helpers shared by the layers (tests/ is on sys.path through conftest.py): schedules whose kernels the
planning tests name, the compile tests build and the GPU tests run (cols and lanes panels), and whether NVRTC is
there."""
import pytest

from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.schedule.panels import lanes_panel, tsqr_panel


def cupy_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("cupy") is not None


# The compile tests skip only where the [cuda] extra is not installed at all (no CuPy); with CuPy there, an NVRTC
# that does not load fails them (test_nvrtc_loads_where_cupy_is_installed says why), so CI cannot go green compiling
# nothing.
needs_nvrtc = pytest.mark.skipif(not cupy_installed(), reason="CuPy is not installed (pip install -e .[cuda])")


def lanes_schedule(m, n, width, slots, aggregate=0, blocks=1):
    """Lanes panels (about `slots` rows per warp) of `width` columns, not straddling aggregates; blocks > 1: on
    clusters of that many blocks."""
    k, panels, col = min(m, n), [], 0
    while col < k:
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        panel = lanes_panel(m - col, min(width, end - col), slots, blocks)
        panels.append(panel)
        col += panel.width
    return Schedule(m, n, tuple(panels), aggregate=aggregate)


COLS_SCHEDULES = [
    Schedule(176, 176, (Panel(96, "cols", 768, 1, 4), Panel(80, "cols", 640, 1, 4))),
    Schedule(100, 100, (Panel(48, "cols", 192, 1, 8), Panel(52, "cols", 224, 1, 8))),
    Schedule(352, 352, tuple(Panel(64, "cols", 512, 1, 4) for _ in range(5)) + (Panel(32, "cols", 256, 1, 4),)),
    Schedule(300, 70, (Panel(64, "cols", 512, 1, 4), Panel(6, "cols", 96, 1, 2))),
    # on clusters of two blocks: the whole matrix; panels whose last block has a warp without columns
    Schedule(176, 176, (Panel(176, "cols", 704, 2, 4, cluster=True),)),
    Schedule(300, 70, (Panel(40, "cols", 96, 2, 8, cluster=True), Panel(30, "cols", 256, 2, 2, cluster=True))),
    # in aggregates: each panel its aggregate's only one (V^T alone: KernelSpec.vt_only) ...
    Schedule(352, 352, (Panel(96, "cols", 384, 2, 4, cluster=True),) * 3
             + (Panel(64, "cols", 256, 2, 4, cluster=True),), aggregate=96),
    # ... and two an aggregate: the first with products of its own ((VT)^T), the second V^T alone
    Schedule(300, 200, (Panel(64, "cols", 256, 2, 4, cluster=True), Panel(64, "cols", 512, 1, 4),
                        Panel(64, "cols", 256, 2, 4, cluster=True), Panel(8, "cols", 128, 1, 2)), aggregate=128),
    # each panel its aggregate on one block, where the panel also forms G and T itself (KernelSpec.t_out): the
    # projections apply T (tf32x3), or the merge forms (VT)^T from it (fp32), 8 and 4 columns a warp
    Schedule(192, 192, (Panel(64, "cols", 256, 1, 8),) * 3, Precision("fp32", "tf32x3", "tf32x3"), aggregate=64),
    Schedule(256, 200, (Panel(64, "cols", 512, 1, 4),) * 3 + (Panel(8, "cols", 64, 1, 4),), aggregate=64),
    # 24 warps: T's last join takes a narrower pair (64 | 32 columns)
    Schedule(256, 160, (Panel(96, "cols", 768, 1, 4), Panel(64, "cols", 512, 1, 4)), aggregate=(96, 64)),
    # on clusters of 3, 4 and 8 blocks (each block pushing its reflectors into every later one): warps that do not
    # split evenly over the blocks, in aggregates; the whole matrix on three; a panel with products of its own on
    # three, prepared by the last block
    Schedule(352, 352, (Panel(128, "cols", 352, 3, 4, cluster=True),
                        Panel(128, "cols", 256, 4, 4, cluster=True), Panel(96, "cols", 96, 8, 4, cluster=True)),
             aggregate=128),
    Schedule(176, 176, (Panel(176, "cols", 480, 3, 4, cluster=True),)),
    Schedule(300, 200, (Panel(64, "cols", 192, 3, 4, cluster=True), Panel(64, "cols", 512, 1, 4),
                        Panel(64, "cols", 256, 2, 4, cluster=True), Panel(8, "cols", 128, 1, 2)),
             aggregate=128),
    # taller than a block's shared memory holds every reflector of: the later block of the cluster reuses the slots
    # of the earlier block's reflectors; at 1,024 rows consumers stream each reflector from shared memory
    # (plan/cols.streams); aggregates of two widths
    Schedule(1024, 192, (Panel(96, "cols", 384, 2, 4, cluster=True),) * 2, aggregate=96),
    Schedule(736, 224, (Panel(96, "cols", 384, 2, 4, cluster=True), Panel(128, "cols", 512, 2, 4, cluster=True)),
             aggregate=(96, 128)),
]

def tsqr_cols_schedule(m, n, width, tile, slice_, aggregate=0):
    """tsqr panels of `width` columns whose tiles of `tile` rows are factored as cols panels (warps of at least
    `slice_` columns: schedule.panels.tsqr_panel)."""
    panels, col = [], 0
    while col < n:
        panels.append(tsqr_panel(m - col, n - col, width, 256, tile, slice_))
        col += panels[-1].width
    return Schedule(m, n, tuple(panels), aggregate=aggregate)


# tsqr panels with cols tiles: a ragged last tile and a last panel of 5 columns on warps of 4, in aggregates; 32
# columns on warps of 4; tiles of 1,024 rows
TSQR_COLS_SCHEDULES = [
    tsqr_cols_schedule(3000, 21, 8, 128, 2, aggregate=16),
    tsqr_cols_schedule(5000, 64, 32, 512, 4, aggregate=32),
    tsqr_cols_schedule(9000, 40, 16, 1024, 2),
]

LANES_SCHEDULES = [
    lanes_schedule(32, 32, 32, 32),
    lanes_schedule(176, 176, 32, 32),
    lanes_schedule(100, 70, 16, 16),
    lanes_schedule(300, 200, 32, 48, aggregate=64),
    lanes_schedule(33, 257, 8, 8),
    lanes_schedule(257, 33, 32, 24),
    lanes_schedule(4096, 64, 32, 32, blocks=8),
    lanes_schedule(1000, 300, 32, 8, aggregate=128, blocks=4),
    lanes_schedule(10, 100, 32, 8, blocks=2),  # a wide matrix: one warp in each of two blocks
    lanes_schedule(48, 80, 16, 48),  # one warp and one block: columns unrolled, each panel with columns right of it
    lanes_schedule(2048, 96, 32, 16, aggregate=64, blocks=16),  # a non-portable cluster of 16 blocks
    # up to 64 columns on one warp, two a lane (LanesWide), as the matrix's last panel: the whole matrix, at the
    # register edge the planner admits (71 rows), with fewer columns than a chunk's multiple, and after a panel
    Schedule(64, 64, (Panel(64, "lanes", 32),)),
    Schedule(71, 64, (Panel(64, "lanes", 32),)),
    Schedule(48, 37, (Panel(37, "lanes", 32),)),
    Schedule(96, 96, (lanes_panel(96, 32), Panel(64, "lanes", 32))),
    # up to 128 columns on a warp for each 32 (LanesBlock): 128², columns not filling the last warp, after a panel
    Schedule(128, 128, (Panel(128, "lanes", 128),)),
    Schedule(96, 70, (Panel(70, "lanes", 96),)),
    Schedule(160, 160, (lanes_panel(160, 32), Panel(128, "lanes", 128))),
]
