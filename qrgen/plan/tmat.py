"""Family "tmat": T of a compact WY form from its Gram matrix G = V^T V and tau, the same kernel for every
schedule (the aggregates' merges, and Q's blocks in qrgen.numerics.qmatrix); templates/cuda/tmat.cuh builds T by
blocks in shared memory for up to BLOCKED_MAX reflectors, and for up to MAX by halves of at most BLOCKED_MAX
each and the corner between them."""
from __future__ import annotations

import functools

from ..render.environment import environment
from ..version import __version__
from .specs import KernelSpec, Rendered

NAME = "qr_tmat"
THREADS = 1024  # threads per matrix: the kernel's bound, and its launch for more than SMALL reflectors
# Up to SMALL reflectors a launch takes SMALL_THREADS: its block products have at most 128 tiles of work, and the
# smaller blocks let several matrices share an SM (docs/decisions.md#tmat-small).
SMALL = 64
SMALL_THREADS = 256
BLOCKED_MAX = 128
MAX = 2 * BLOCKED_MAX
LD = BLOCKED_MAX + 4  # floats between rows of G and T in shared memory: 16-byte aligned, 4 banks apart
XLD = 32 + 4  # and of X (32 columns)
# gram, tau, t, reflectors, G's stride, tau's
SIGNATURE = "PPPILI"


def shared_bytes(a: int) -> int:
    """Dynamic shared memory for `a` reflectors, its halves (the first min(a, BLOCKED_MAX), then the rest) rounded
    up to whole 32-row blocks: G's staging space (the first half's rows: a half's diagonal block of G, then the
    corner's G12), T1 and T2 (rows LD floats apart, G's too), X (rows XLD apart: the first half's rows less one
    block, or BLOCKED_MAX rows for the corner)."""
    if not 1 <= a <= MAX:
        raise ValueError(f"the T kernel takes 1 to {MAX} reflectors; got {a}")
    h = BLOCKED_MAX
    r1, r2 = 32 * -(-min(a, h) // 32), 32 * -(-(a - h) // 32) if a > h else 0
    return 4 * ((2 * r1 + r2) * LD + XLD * (h if r2 else r1 - 32))


def threads(a: int) -> int:
    """Threads of the T kernel's launch for `a` reflectors (at most THREADS, its bound: the kernel strides by
    blockDim and needs a warp per 32-row diagonal block of a half)."""
    return SMALL_THREADS if a <= SMALL else THREADS


@functools.cache
def max_reflectors(target) -> int:
    """The most reflectors the T kernel takes on the target: MAX, or fewer (whole blocks of 32) where a block's
    shared memory cannot hold MAX's (GPUs of 99 KB a block take 64)."""
    fits = [a for a in range(32, MAX + 1, 32) if shared_bytes(a) <= target.limits.shared_bytes]
    if not fits:
        raise ValueError(f"the T kernel needs {shared_bytes(32)} bytes of shared memory for 32 reflectors; "
                         f"{target.arch} has {target.limits.shared_bytes}")
    return fits[-1]


def kernel(target) -> KernelSpec:
    """The T kernel's spec, allowed the shared memory of max_reflectors(target) reflectors."""
    return KernelSpec(NAME, "tmat", 0, THREADS, 1, 0, 1, False, 0, shared_bytes(max_reflectors(target)), ())


def signature(spec: KernelSpec) -> str:
    return SIGNATURE


def features(spec: KernelSpec) -> tuple[str, ...]:
    return ()


def render(spec: KernelSpec, schedule, target) -> Rendered:
    template = environment().get_template(f"{target.record.template_dir}/tmat.cu.j2")
    return Rendered(NAME, template.render(version=__version__, arch=target.arch, k=kernel(target), blocked_max=BLOCKED_MAX,
                                          tmat_max=MAX, ld=LD, xld=XLD))
