"""The Metal backend: Apple GPU families (Apple's MTLGPUFamilyApple7 .. Apple10), their limits and features.

Apple documents a threadgroup's limits (32 KB of threadgroup memory, 1024 threads, SIMD groups of 32); it does not
document register files. The register budget below is qrgen's estimate, used only so that the planner keeps a
threadgroup's registers small enough for the Metal compiler to grant the full thread count; a pipeline that gets
fewer threads than a kernel needs is refused at run time with the numbers (run/metal_engine.py)."""
from __future__ import annotations

from .records import SIMDGROUP_BFLOAT, SIMDGROUP_MATRIX, Arch, Backend, Limits

LIMITS = Limits(shared_bytes=32 * 1024, sm_shared_bytes=32 * 1024, registers_per_sm=32768, registers_per_thread=128,
                threads_per_block=1024, simd_width=32)

# Every family from Apple7 on has simdgroup_matrix (8x8 products of float or half inputs, MSL 2.3) and bfloat ones
# (MSL 3.1, macOS 14: Metal's bfloat type is a language version's, not a family's; docs/decisions.md#apple-defaults).
FAMILIES = {
    "apple7": "M1, A14",
    "apple8": "M2, A15, A16",
    "apple9": "M3, M4, A17 Pro, A18",
    "apple10": "M5, A19",
}

ARCHS = {name: Arch(name, LIMITS, frozenset({SIMDGROUP_MATRIX, SIMDGROUP_BFLOAT})) for name in FAMILIES}

BACKEND = Backend(name="metal", archs=ARCHS, default_arch="apple9", template_dir="metal", suffix=".metal",
                  compiler="qrgen.compile.metal", engine="qrgen.run.metal_engine",
                  describe_arch="an Apple GPU family such as 'apple9' (M3, M4)", families="qrgen.plan.msl",
                  heuristic="qrgen.schedule.apple")
