"""The CUDA backend: NVIDIA architectures from sm_80 on, their limits and features."""
from __future__ import annotations

from .records import ASYNC_COPY, CLUSTERS, COOPERATIVE, MBARRIER, TF32_MMA, Arch, Backend, Limits

GRID_YZ = 65535  # CUDA's limit on a launch's grid.y and grid.z (grid.x goes to 2^31 - 1)
_AMPERE = frozenset({ASYNC_COPY, TF32_MMA, COOPERATIVE, MBARRIER})
_HOPPER = _AMPERE | {CLUSTERS}


def _limits(shared_kib: int, sm_shared_kib: int, threads: int = 1024, clusters: tuple[int, int] = (0, 0)) -> Limits:
    return Limits(shared_bytes=shared_kib * 1024, sm_shared_bytes=sm_shared_kib * 1024, registers_per_sm=65536,
                  registers_per_thread=255, threads_per_block=threads, simd_width=32,
                  cluster_portable=clusters[0], cluster_max=clusters[1])


# Shared memory per block (opt-in) and per SM, from the CUDA C++ Programming Guide's table of compute capabilities.
ARCHS = {a.name: a for a in (
    Arch("sm_80", _limits(163, 164), _AMPERE),
    Arch("sm_86", _limits(99, 100), _AMPERE),
    Arch("sm_87", _limits(163, 164), _AMPERE),
    Arch("sm_89", _limits(99, 100), _AMPERE),
    Arch("sm_90", _limits(227, 228, clusters=(8, 16)), _HOPPER),
    Arch("sm_90a", _limits(227, 228, clusters=(8, 16)), _HOPPER),
    Arch("sm_100", _limits(227, 228, clusters=(8, 16)), _HOPPER),
    Arch("sm_103", _limits(227, 228, clusters=(8, 16)), _HOPPER),
    Arch("sm_120", _limits(99, 100, clusters=(8, 8)), _HOPPER),
    Arch("sm_121", _limits(99, 100, clusters=(8, 8)), _HOPPER),
)}

BACKEND = Backend(name="cuda", archs=ARCHS, default_arch="sm_90", template_dir="cuda", suffix=".cu",
                  compiler="qrgen.compile.nvrtc", engine="qrgen.run.cuda_engine",
                  describe_arch="a CUDA architecture such as 'sm_90'")
