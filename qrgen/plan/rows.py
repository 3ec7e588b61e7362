"""Panel family "rows": `threads` threads in each of `blocks` blocks per matrix share the panel's rows, each thread
holding its rows' columns in registers (templates/cuda/panel_rows.cuh). Blocks > 1 exchange partial sums through
global memory (a cooperative launch), or with cluster=True through each other's shared memory as one cluster."""
from __future__ import annotations

from ..targets import CLUSTERS, COOPERATIVE, MBARRIER
from . import family
from .family import PANEL_SIGNATURE as SIGNATURE  # noqa: F401 (the family's launch parameters)

VARIANT = "rows"
VT_ONLY = False  # a trail kernel writes (VT)^T too
LOOP = True  # Panel.loop: the loop over columns need not be unrolled
CLUSTER = True  # Panel.cluster applies
REG_OVERHEAD = 40  # registers beside the register tile (addresses, loop state, scalars), from ptxas reports


def quick_level(spec) -> str:
    """A first call's NVRTC level: with the loop over columns unrolled, NVRTC's middle level takes about as long as
    -O3 and the quickest one a fraction of it; a loop kernel compiles quickly at the middle level, which runs several
    times faster (docs/decisions.md#first-call-tiers)."""
    return "mid" if spec.loop else "max"


def check(panel) -> None:
    family.check_threads(panel)
    family.check_narrow(panel)
    family.check_no(panel, "tile", "slice")


def slots(panel, rows: int) -> int:
    return family.rows_slots(panel, rows)


def registers(panel, rows: int) -> int:
    return slots(panel, rows) * panel.width + panel.width + REG_OVERHEAD


def shared_bytes_of(warps: int, width: int) -> int:
    """templates/cuda/panel_rows.cuh's Shared, in bytes: red, tot, piv and the coefficients cf by parity, G and T
    (rows padded), tau, one block's receive buffer and the mbarriers (a cluster's receive buffers aside)."""
    return 4 * (warps * 32 + 2 * width * width + 5 * width + 166)


def cluster_words(panel) -> int:
    """A cluster's receive buffers and mbarriers, in floats (0 without a cluster)."""
    return 64 * (panel.blocks + 1) + 4 if panel.cluster else 0


def shared_bytes(panel, rows: int, trail: bool, m: int, n: int) -> int:
    return shared_bytes_of(panel.threads // 32, panel.width) + 4 * cluster_words(panel)


def spec_shared(panel, rows: int, trail: bool, m: int, n: int) -> int:
    return 0


def vec(panel, n: int, c0: int) -> int:
    return family.vec(n, c0, panel.width)


def features(panel) -> tuple[str, ...]:
    if panel.cluster:
        return (CLUSTERS, MBARRIER)
    return (COOPERATIVE,) if panel.blocks > 1 else ()


def name(spec) -> str:
    suffix = ("_trail" if spec.trail else "") + ("_loop" if spec.loop else "")
    return (f"qr_{spec.variant}_w{spec.width}_t{spec.threads}_{'c' if spec.cluster else 'b'}{spec.blocks}"
            f"_s{spec.slots}_v{spec.vec}{suffix}")


def describe(panel) -> str:
    return f" x{panel.blocks} blocks" + (" (cluster)" if panel.cluster else "") if panel.blocks > 1 else ""


def render(spec, schedule, target):
    return family.render_panel(spec, schedule, target)
