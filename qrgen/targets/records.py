"""The records a backend is described by: its architectures' limits and features, and what differs as data."""
from __future__ import annotations

from dataclasses import dataclass, field

# Features a kernel family may need (plan/families declare them; the planner refuses what a target lacks).
CLUSTERS = "clusters"  # thread-block clusters with distributed shared memory (st.async, mapa)
MBARRIER = "mbarrier"  # shared-memory barriers with transaction counts
ASYNC_COPY = "async_copy"  # cp.async global-to-shared copies
TF32_MMA = "tf32_mma"  # tensor-core products with tf32 inputs (mma.sync m16n8k8)
COOPERATIVE = "cooperative"  # cooperative launches (every block of a grid resident at once)
SIMDGROUP_MATRIX = "simdgroup_matrix"  # Metal's 8x8 simdgroup matrix products (float and half inputs)
SIMDGROUP_BFLOAT = "simdgroup_bfloat"  # Metal's 8x8 simdgroup matrices of bfloat inputs (MSL 3.1)
FEATURES = (CLUSTERS, MBARRIER, ASYNC_COPY, TF32_MMA, COOPERATIVE, SIMDGROUP_MATRIX, SIMDGROUP_BFLOAT)


@dataclass(frozen=True)
class Limits:
    """Per-block and per-multiprocessor budgets of one architecture."""

    shared_bytes: int  # dynamic shared memory one block may opt in to
    sm_shared_bytes: int  # shared memory of a multiprocessor (1 KiB of it reserved per resident block)
    registers_per_sm: int
    registers_per_thread: int
    threads_per_block: int
    simd_width: int  # threads of a warp (simdgroup)
    cluster_portable: int = 0  # blocks per cluster every GPU of the arch holds (0: no clusters)
    cluster_max: int = 0  # blocks per cluster the arch allows where the GPU can hold them


@dataclass(frozen=True)
class Arch:
    """One architecture of a backend: its canonical name, limits and features."""

    name: str
    limits: Limits
    features: frozenset = field(default_factory=frozenset)


@dataclass(frozen=True)
class Backend:
    """What differs between backends, as data."""

    name: str
    archs: dict  # canonical arch name -> Arch
    default_arch: str
    template_dir: str  # folder under templates/
    suffix: str  # a rendered source's file suffix
    compiler: str  # module path of its compile function (compile(items, target, ...))
    engine: str  # module path of the engine that runs a plan
    describe_arch: str  # what an arch name looks like, for errors
    # module path of the backend's own kernel families beside the panels (check, product_kernels, render_panel),
    # where they are not CUDA's (plan/planner.py)
    families: str = ""
    heuristic: str = ""  # module path of its default schedule (default_schedule), where it is not CUDA's

    def arch(self, name: str) -> Arch:
        found = self.archs.get(name)
        if found is None:
            raise ValueError(f"unknown {self.name} architecture {name!r}: {self.describe_arch}; known: "
                             f"{', '.join(self.archs)}")
        return found
