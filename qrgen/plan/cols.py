"""Panel family "cols": one block per matrix (or, with cluster=True, 2 to 8 blocks of one cluster, each owning an
equal share of the warps); warp w owns columns [w*slice, (w+1)*slice) in registers and takes its turn as producer of
those reflectors, published to shared memory under one mbarrier each and pushed into the blocks whose warps apply
them (templates/cuda/panel_cols.cuh)."""
from __future__ import annotations

import math

from ..targets import CLUSTERS, MBARRIER, cuda
from . import family
from .family import PANEL_SIGNATURE as SIGNATURE  # noqa: F401

VARIANT = "cols"
VT_ONLY = True  # a trail kernel leaves (VT)^T out where no products of its own follow (KernelSpec.vt_only)
LOOP = False
CLUSTER = True
BLOCKS = tuple(range(1, 9))  # blocks a matrix (more than one: one cluster, at most the portable 8)
# registers beside the columns and one reflector: the fewest ptxas fits a panel in under the cap without spilling
# (tests/compile checks the panels this admits)
REG_OVERHEAD = 18
# ... beside the columns alone, where consumers stream the reflector from shared memory (streams)
STREAM_OVERHEAD = 26
SLICES = (2, 4, 8)
# A one-block panel is compiled for as many resident blocks an SM as its registers allow (resident_blocks): the
# column registers the model counts plus this many, at least RESIDENT_MIN_REGISTERS (a small panel's fixed share),
# and for a panel that forms T at least T_OUT_REGISTERS (tests/compile checks that none spills;
# docs/decisions.md#cols-resident)
RESIDENT_HEADROOM = 12
RESIDENT_MIN_REGISTERS = 64
T_OUT_REGISTERS = 96
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32


def check(panel) -> None:
    if panel.slice not in SLICES:
        raise ValueError(f"Panel.slice must be one of {SLICES} for variant 'cols', got {panel.slice!r}")
    if panel.blocks not in BLOCKS or (panel.blocks > 1) != panel.cluster:
        raise ValueError(f"Panel variant 'cols' takes blocks=1, or 2 to {BLOCKS[-1]} blocks with cluster=True; got "
                         f"blocks={panel.blocks!r} with cluster={panel.cluster!r}")
    threads = cols_threads(panel.width, panel.slice, panel.blocks)
    if panel.threads != threads or panel.threads > 1024:
        raise ValueError(f"Panel.threads must be 32 * ceil(ceil(width / slice) / blocks) = {threads} (at most 1024) "
                         f"for variant 'cols', got {panel.threads}")
    if not owns_columns(panel.width, panel.slice, panel.blocks):
        raise ValueError(f"a cols panel of {panel.width} columns with {panel.slice} a warp leaves the last of its "
                         f"{panel.blocks} blocks no columns (it would leave the cluster while the others write to "
                         f"it): take more columns, a narrower slice or one block")
    family.check_no(panel, "tile")


def owns_columns(width: int, slice_: int, blocks: int) -> bool:
    """Whether every block of the panel owns columns (the warps of the last block hold some)."""
    return math.ceil(width / slice_) > (blocks - 1) * cols_threads(width, slice_, blocks) // 32


def cols_threads(width: int, slice_: int, blocks: int = 1) -> int:
    """Threads a block: a warp for each slice of columns, the warps shared by the blocks."""
    return 32 * math.ceil(math.ceil(width / slice_) / blocks)


def slots(panel, rows: int) -> int:
    return math.ceil(rows / 32)


def held_registers(slots_: int, slice_: int) -> int:
    """Registers a thread needs with its columns and a consumed reflector's rows in registers."""
    return slots_ * (slice_ + 1) + slice_ + REG_OVERHEAD


def _default_limits():
    """The default CUDA architecture's limits: a kernel's source (its name, its template values) may not depend on
    the target it is compiled for."""
    return cuda.ARCHS[cuda.BACKEND.default_arch].limits


def streams(slots_: int, slice_: int, threads: int) -> bool:
    """Whether consumers read each reflector from shared memory twice (for the sums, then for the updates) instead
    of holding its rows: where holding them would pass the register cap of `threads` threads (ColsPanel's STREAM;
    the same register file on every CUDA architecture)."""
    return held_registers(slots_, slice_) > family.register_cap(threads, _default_limits())


def column_registers(slots_: int, slice_: int, threads: int) -> int:
    """Registers a thread of a cols factorization needs: its columns and a reflector's rows, or where those pass
    the cap its columns alone (streams)."""
    if streams(slots_, slice_, threads):
        return slots_ * slice_ + STREAM_OVERHEAD
    return held_registers(slots_, slice_)


def registers(panel, rows: int) -> int:
    return column_registers(slots(panel, rows), panel.slice, panel.threads)


def reuses(width: int, slots_: int, blocks: int, trail: bool) -> bool:
    """Whether the later block of a cluster panel reuses the earlier block's reflector slots (ColsPanel's REUSE):
    only where holding every reflector would not fit the default architecture's shared memory (a barrier in the
    later block is its price), on clusters of two without (VT)^T to prepare (trail)."""
    return blocks == 2 and not trail and shared_bytes_of(width, slots_, trail) > _default_limits().shared_bytes


def held(width: int, slots_: int, slice_: int, blocks: int, trail: bool) -> int:
    """Reflectors a block holds in shared memory: every one, or where it reuses slots (reuses) those of one
    block's warps (ColsPanel::HELD)."""
    if not reuses(width, slots_, blocks, trail):
        return width
    return math.ceil(math.ceil(width / slice_) / blocks) * slice_


def shared_bytes_of(width: int, slots_: int, trail: bool, held_: int | None = None, t_out: bool = False) -> int:
    """The held reflectors (padded rows; all of them unless given), every tau, G and T where it forms them (trail:
    for (VT)^T, or with t_out for its aggregate, T then in G's free triangle), and one 8-byte mbarrier per reflector
    (panel_cols's layout)."""
    held_ = width if held_ is None else held_
    floats = held_ * slots_ * 32 + width + (0 if not trail else 1 if t_out else 2) * width * (width + 1)
    return 4 * (floats + (floats & 1)) + 8 * width


def shared_bytes(panel, rows: int, trail: bool, m: int, n: int, t_out: bool = False) -> int:
    s = slots(panel, rows)
    return shared_bytes_of(panel.width, s, trail, held(panel.width, s, panel.slice, panel.blocks, trail), t_out)


spec_shared = shared_bytes


def t_out(panel, rows: int, target) -> bool:
    """Whether a panel that is its aggregate forms G and T itself (ColsPanel's TOUT, docs/decisions.md#cols-t-out):
    on one block, every warp with a whole slice, where G fits the target's shared memory beside every reflector
    (T goes in G's free triangle, the products that form it in the reflectors' place once G is formed)."""
    s = slots(panel, rows)
    return (panel.blocks == 1 and panel.width % panel.slice == 0 and not streams(s, panel.slice, panel.threads)
            and panel.width <= s * 32  # t_join's X where V was (panel_cols)
            and shared_bytes_of(panel.width, s, True, t_out=True) <= target.limits.shared_bytes)


def vec(panel, n: int, c0: int) -> int:
    return family.vec(n, c0, panel.width, panel.slice)


def features(panel) -> tuple[str, ...]:
    return (MBARRIER, CLUSTERS) if panel.cluster else (MBARRIER,)


def spec_reuses(spec) -> bool:
    return reuses(spec.width, spec.slots, spec.blocks, spec.trail and not spec.vt_only)


def name(spec) -> str:
    suffix = (("_vtt" if spec.t_out else "_vt" if spec.vt_only else "_trail" if spec.trail else "")
              + ("_loop" if spec.loop else "")
              + ("_st" if streams(spec.slots, spec.slice, spec.threads) else "") + ("_r" if spec_reuses(spec) else ""))
    return (f"qr_cols_w{spec.width}_c{spec.slice}{f'_x{spec.blocks}' if spec.cluster else ''}_s{spec.slots}"
            f"_v{spec.vec}{suffix}")


def describe(panel) -> str:
    return f" slice {panel.slice}" + (f" x{panel.blocks} blocks (cluster)" if panel.cluster else "")


def resident_blocks(spec) -> int:
    """Blocks an SM the kernel is compiled for (__launch_bounds__): the most whose register cap still holds its
    column registers (with RESIDENT_HEADROOM and its floors) and whose shared memory and threads an SM of the
    default architecture holds; one for a panel on a cluster. So the later, shorter panels of a batch of more
    matrices than SMs share an SM, where an uncapped allocation would leave one block an SM."""
    if spec.blocks > 1:
        return 1
    limits = _default_limits()
    need = max(column_registers(spec.slots, spec.slice, spec.threads) + RESIDENT_HEADROOM, RESIDENT_MIN_REGISTERS,
               T_OUT_REGISTERS if spec.t_out else 0)
    blocks = 1
    while (blocks < BLOCKS_PER_SM and (blocks + 1) * spec.threads <= THREADS_PER_SM
           and family.resident_register_cap(spec.threads, blocks + 1, limits) >= need
           and (blocks + 1) * (spec.shared_bytes + 1024) <= limits.sm_shared_bytes):
        blocks += 1
    return blocks


def render(spec, schedule, target):
    return family.render_panel(spec, schedule, target, resident_blocks(spec),
                               cols_stream=streams(spec.slots, spec.slice, spec.threads), cols_reuse=spec_reuses(spec))
