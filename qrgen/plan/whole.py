"""Panel family "whole": the whole factorization in one kernel, one block of `threads` per matrix holding the matrix
in shared memory (the schedule's only panel, width = min(m, n)): inner panels of `slice` columns factor as rows
panels on the block, each followed by its fp32 update of the columns right of it from shared memory
(templates/cuda/whole.cuh)."""
from __future__ import annotations

import math

from . import family, rows
from .family import PANEL_SIGNATURE as SIGNATURE  # noqa: F401

VARIANT = "whole"
VT_ONLY = False  # a trail kernel writes (VT)^T too
LOOP = True
CLUSTER = False
REG_OVERHEAD = 48
SLICES = (4, 8, 16, 32)  # columns per inner panel
MIN_REGISTERS = 96  # the register cap is at least this, whatever the blocks an SM could hold


def quick_level(spec) -> str:
    """A first call's NVRTC level: the middle one takes as long as -O3 on the whole kernel, the quickest one a
    fraction of it (docs/decisions.md#first-call-tiers)."""
    return "max"


def check(panel) -> None:
    family.check_threads(panel)
    if panel.slice not in SLICES:
        raise ValueError(f"Panel.slice (columns per panel inside the kernel) must be one of {SLICES} "
                         f"for variant 'whole', got {panel.slice!r}")
    if panel.blocks != 1 or panel.cluster:
        raise ValueError("Panel variant 'whole' takes blocks=1 and no cluster")
    family.check_no(panel, "tile")


def slots(panel, rows_: int) -> int:
    return math.ceil(rows_ / panel.threads)


def registers(panel, rows_: int) -> int:
    # an inner panel's rows in registers; in the updates a column of W (acc) and a row of V
    return max(slots(panel, rows_) * panel.slice + panel.slice, 3 * panel.slice) + REG_OVERHEAD


def matrix_shared_bytes(m: int, n: int, threads: int, slice_: int) -> int:
    """The kernel's dynamic shared memory (whole.cuh's layout): the matrix (rows n | 1 floats apart, rounded to
    16 bytes), V (m rows of slice + 4), W's partial sums (threads x slice) and W' (slice x n)."""
    return 4 * ((m * (n | 1) + 3) // 4 * 4 + m * (slice_ + 4) + threads * slice_ + slice_ * n)


def shared_bytes(panel, rows_: int, trail: bool, m: int, n: int) -> int:
    return (matrix_shared_bytes(m, n, panel.threads, panel.slice)
            + rows.shared_bytes_of(panel.threads // 32, panel.slice))


def spec_shared(panel, rows_: int, trail: bool, m: int, n: int) -> int:
    return matrix_shared_bytes(m, n, panel.threads, panel.slice)


def vec(panel, n: int, c0: int) -> int:
    return family.vec(n)


def features(panel) -> tuple[str, ...]:
    return ()


def name(spec) -> str:
    suffix = ("_trail" if spec.trail else "") + ("_loop" if spec.loop else "")
    return f"qr_whole_p{spec.slice}_t{spec.threads}_s{spec.slots}_v{spec.vec}{suffix}"


def describe(panel) -> str:
    return f", panels of {panel.slice} columns"


def blocks_by_shared(spec, limits) -> int:
    """The blocks an SM's shared memory holds (each block's dynamic and static shared memory, 1 KiB reserved)."""
    return limits.sm_shared_bytes // (spec.shared_bytes + rows.shared_bytes_of(spec.threads // 32, spec.slice) + 1024)


def min_blocks(spec, limits) -> int:
    """The resident blocks per SM the kernel is compiled for (__launch_bounds__): as many as its shared memory
    allows, down to a register cap of MIN_REGISTERS."""
    return max(1, min(blocks_by_shared(spec, limits), limits.registers_per_sm // (spec.threads * MIN_REGISTERS)))


def render(spec, schedule, target):
    return family.render_panel(spec, schedule, target, min_blocks(spec, target.limits))


def inner_panels(launch, n: int) -> tuple[tuple[int, int, int], ...]:
    """A whole launch's inner panels in order (Launch.inner columns each, the last one narrower where that does not
    divide its width): (first column, width, columns right of it to n, which its update covers)."""
    return tuple((c, min(launch.inner, launch.width - c), n - c - min(launch.inner, launch.width - c))
                 for c in range(0, launch.width, launch.inner))
