"""Product family "fused" (Schedule.panel_update "fused"): a panel's W = Z^T C and C -= V W in one generated fp32
kernel, W in shared memory, a block of THREADS per 32 columns of C per matrix (templates/cuda/fused.cu.j2); with a
cluster of more than one block the rows split over the cluster."""
from __future__ import annotations

from ..render.environment import environment
from ..targets import CLUSTERS
from ..version import __version__
from .specs import KernelSpec, Rendered

THREADS = 256
MIN_BLOCKS = 2  # resident blocks per SM the compiler plans registers for
ROWS = 32  # rows per projection chunk (at least: 4 per thread group)
CLUSTER_SIZES = (1, 2, 4, 8)  # blocks per cluster that split the rows (cluster() picks one per launch)
MIN_ROWS = 128  # rows per block at least, where a launch splits the rows over a cluster
SHARED_FLOATS = 10240  # for the chunks in flight (40 KiB; W's own beside them)
# zt, zld, zs, vt, vld, vs, c, ldc, cs, rows, nc
SIGNATURE = "PILPILPILII"


def name(width: int, cluster: int = 1) -> str:
    return f"qr_fused_w{width}" + (f"_c{cluster}" if cluster > 1 else "")


def kernel(width: int, cluster: int = 1) -> KernelSpec:
    """The fused products for panels of `width` columns; with cluster > 1 the rows split over that many blocks."""
    return KernelSpec(name(width, cluster), "fused", width, THREADS, cluster, 0, 1, False, 0,
                      layout(width, cluster)["shared_bytes"], (), cluster=cluster > 1)


def signature(spec: KernelSpec) -> str:
    return SIGNATURE


def features(spec: KernelSpec) -> tuple[str, ...]:
    return (CLUSTERS,) if spec.cluster else ()


def cluster_sizes(target) -> tuple[int, ...]:
    """The blocks per cluster a target's fused launches may take: CLUSTER_SIZES with clusters, else 1."""
    return CLUSTER_SIZES if target.has(CLUSTERS) else (1,)


def cluster(batch: int, nc: int, rows: int, sms: int, sizes: tuple[int, ...] = CLUSTER_SIZES) -> int:
    """Blocks per cluster of a launch (of `sizes`): the most that keep it within two resident blocks per SM, each
    block MIN_ROWS rows or more; 1 where the blocks of 32 columns fill the GPU alone."""
    tiles, blocks = -(-nc // 32), 1
    while 2 * blocks in sizes and batch * tiles * 2 * blocks <= 2 * sms and rows >= 2 * blocks * MIN_ROWS:
        blocks *= 2
    return blocks


def layout(width: int, cluster: int = 1) -> dict:
    """The kernel's shapes for panels of `width` columns: W's rows padded to a power of two from 4 (whole 4 x 4
    thread tiles that divide the block: wp); rows per projection chunk (ROWS, or 4 per thread group where there are
    more groups: rt1) and per update chunk (rt2); as many chunks in flight (2 to 4: s1, s2) as SHARED_FLOATS hold;
    the blocks per cluster (cl); its dynamic shared memory (fused.cu.j2's FusedShared)."""
    wp = max(4, 1 << (width - 1).bit_length())
    groups = THREADS // (wp // 4 * 8)
    rt1 = max(ROWS, 4 * groups)
    rt2 = 4 * THREADS // 8
    s1 = max(2, min(4, SHARED_FLOATS // (wp * (rt1 + 4) + rt1 * 32)))
    s2 = max(2, min(4, SHARED_FLOATS // (wp * (rt2 + 4))))
    union = max(s1 * (wp * (rt1 + 4) + rt1 * 32), groups * wp * 32, s2 * wp * (rt2 + 4))
    w, wt = wp * 32, (wp * 32 if cluster > 1 else 0)  # W, and the cluster's total W
    return dict(wp=wp, rt1=rt1, rt2=rt2, s1=s1, s2=s2, cl=cluster, shared_bytes=4 * (union + w + wt))


def render(spec: KernelSpec, schedule, target) -> Rendered:
    template = environment().get_template(f"{target.record.template_dir}/fused.cu.j2")
    return Rendered(spec.name, template.render(version=__version__, arch=target.arch, k=spec, bn=32, threads=THREADS,
                                               min_blocks=MIN_BLOCKS, **layout(spec.width, spec.blocks)))
