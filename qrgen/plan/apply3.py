"""Family "apply3" (Schedule.aggregate_update "fused"): an aggregate's W = (VT)^T C and C -= V W in one tf32x3
kernel (templates/cuda/apply3.cu.j2), a block per 32 columns of C and matrix holding those columns of C in shared
memory for both products, so that C passes through DRAM once each way and W never leaves the block. One kernel per
aggregate width (a power of two from 64: WIDTHS); the rows are an argument, and the rows a target's shared memory
holds bound what it takes (takes): other aggregates run the two tf32x3 GEMMs (plan/tf32x3.py)."""
from __future__ import annotations

from ..render.environment import environment
from ..targets import ASYNC_COPY, TF32_MMA
from ..version import __version__
from .specs import KernelSpec, Rendered

WIDTHS = (64, 128, 256)
THREADS = 256
BN = 32  # columns of C per block
BK = 32  # rows of C per projection step
STAGES = 3  # Z^T's stages
LEAD = 6  # C's chunks copied ahead of the projection step that reads them
MIN_BLOCKS = 2  # resident blocks per SM the compiler plans registers for
# zt, zld, zs, vt, vld, vs, c, ldc, sc, rows, nc
SIGNATURE = "PILPILPILII"


def name(width: int) -> str:
    return f"qr_apply3_w{width}"


def ring_floats(width: int) -> int:
    """Shared floats after C's rows: Z^T's stages, or the first round's partial W's and W's two tf32 parts."""
    warps_m = width // 32
    part = (THREADS // 32 // warps_m // 2) * warps_m * 1024
    return max(STAGES * width * (BK + 8), part + 2 * width * (BN + 4))


def shared_bytes(width: int, rows: int) -> int:
    """Dynamic shared memory of a launch over `rows` rows: C's 32 columns of every row (in whole steps), then the
    ring."""
    return 4 * (-(-rows // BK) * BK * (BN + 4) + ring_floats(width))


def takes(width: int, rows: int, target) -> bool:
    """Whether the kernel takes an aggregate of `width` columns over `rows` rows on `target`."""
    return (width in WIDTHS and target.has(TF32_MMA) and target.has(ASYNC_COPY)
            and shared_bytes(width, rows) <= target.limits.shared_bytes)


def kernels(schedule, aggs, target) -> list[KernelSpec]:
    """The kernels of a schedule whose aggregate_update is "fused": one per width it takes, launched with the
    shared memory of its most rows."""
    if schedule.aggregate_update != "fused":
        return []
    most: dict[int, int] = {}
    for a in aggs:
        width = a.a1 - a.a0
        if a.nc > 0 and takes(width, a.rows, target):
            most[width] = max(most.get(width, 0), a.rows)
    return [KernelSpec(name(w), "apply3", w, THREADS, 1, 0, 4, False, 0, shared_bytes(w, r), ())
            for w, r in sorted(most.items())]


def launch_shared(shared_by_name: dict, width: int, rows: int, addresses=(), strides=()) -> int | None:
    """A launch's dynamic shared memory for an aggregate of `width` columns over `rows` rows, where the plan (its
    kernels' shared memory by name) has the kernel for `width` and it was sized for those rows, and every operand
    address given is 16-byte aligned and every stride (and dimension) given a multiple of 4 floats; None otherwise
    (the engines then run the two GEMMs)."""
    if any(a % 16 for a in addresses) or any(v % 4 for v in strides):
        return None
    shared = shared_bytes(width, rows)
    return shared if shared <= shared_by_name.get(name(width), -1) else None


def signature(spec: KernelSpec) -> str:
    return SIGNATURE


def features(spec: KernelSpec) -> tuple[str, ...]:
    return (TF32_MMA, ASYNC_COPY)


def render(spec: KernelSpec, schedule, target) -> Rendered:
    template = environment().get_template(f"{target.record.template_dir}/apply3.cu.j2")
    return Rendered(spec.name, template.render(version=__version__, arch=target.arch, name=spec.name,
                                               width=spec.width, bn=BN, threads=THREADS, bk=BK, stages=STAGES,
                                               lead=LEAD, min_blocks=MIN_BLOCKS, ring=ring_floats(spec.width)))
