"""The tensor cores' tf32 rate on Hopper: wgmma (m64n64k8, A from registers, B from shared memory K-major in core
matrices of 8 rows x 16 bytes without swizzle: LBO 128 bytes between the two core matrices along K, SBO 256 between
those along N) against mma.sync m16n8k8, each in a loop over registers and shared memory only, so the figure is the
instruction's rate alone. First one wgmma product is checked against NumPy (inputs already tf32): the operand
layouts and the descriptor a tf32x3 kernel on wgmma would use. Needs an sm_90a build (wgmma exists only there).

    python3 tools/wgmma_probe.py                  # on the GPU machine: the check, then TFLOP/s at 1, 2, 4 blocks an SM
    python3 tools/wgmma_probe.py --compile-only   # no GPU: NVRTC for sm_90a, registers and spills
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import numpy as np

from qrgen.compile.nvrtc import nvrtc_compile, parse_report
from qrgen.render.environment import environment

ARCH = "sm_90a"
HELPERS = environment().get_template("cuda/wgmma.cuh").render()  # wg_desc, wg_tf32, wg_fence, ...
SRC = HELPERS + r'''
__device__ __forceinline__ void mma8(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// D (64 x 64) = A (64 x 8, row-major) B (8 x 64, row-major), one warpgroup; B put K-major in core matrices.
extern "C" __global__ void __launch_bounds__(128) check(const float* a, const float* b, float* d) {
  __shared__ __align__(128) float bs[512];
  const int t = threadIdx.x, w = t >> 5, lane = t & 31, gid = lane >> 2, tig = lane & 3;
  for (int i = t; i < 512; i += 128) {  // (k, n) at core (n / 8, k / 4): n/8 * 64 + k/4 * 32 + n%8 * 4 + k%4 floats
    const int k = i / 64, n = i % 64;
    bs[(n / 8) * 64 + (k / 4) * 32 + (n % 8) * 4 + k % 4] = b[k * 64 + n];
  }
  wg_shared_fence();
  __syncthreads();
  unsigned af[4];
  af[0] = __float_as_uint(a[(16 * w + gid) * 8 + tig]);
  af[1] = __float_as_uint(a[(16 * w + gid + 8) * 8 + tig]);
  af[2] = __float_as_uint(a[(16 * w + gid) * 8 + tig + 4]);
  af[3] = __float_as_uint(a[(16 * w + gid + 8) * 8 + tig + 4]);
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  wg_fence();
  wg_tf32(acc, af, wg_desc(bs, 128, 256), 0);
  wg_commit();
  wg_wait<0>();
  for (int j = 0; j < 8; ++j) {
    d[(16 * w + gid) * 64 + 8 * j + 2 * tig] = acc[4 * j];
    d[(16 * w + gid) * 64 + 8 * j + 2 * tig + 1] = acc[4 * j + 1];
    d[(16 * w + gid + 8) * 64 + 8 * j + 2 * tig] = acc[4 * j + 2];
    d[(16 * w + gid + 8) * 64 + 8 * j + 2 * tig + 1] = acc[4 * j + 3];
  }
}
// Rate: each warpgroup ITER x 8 wgmma m64n64k8 (K 64 from 8 descriptors), a commit and wait per 8.
extern "C" __global__ void __launch_bounds__(256) rate_wg(float* out, int iters) {
  __shared__ __align__(128) float bs[8 * 512];
  const int t = threadIdx.x;
  for (int i = t; i < 8 * 512; i += 256) bs[i] = 1e-3f * (i % 7);
  wg_shared_fence();
  __syncthreads();
  unsigned af[4] = {__float_as_uint(1.0f), __float_as_uint(0.5f), __float_as_uint(0.25f), (unsigned)t};
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  for (int it = 0; it < iters; ++it) {
    wg_fence();
#pragma unroll
    for (int s = 0; s < 8; ++s) wg_tf32(acc, af, wg_desc(bs + s * 512, 128, 256));
    wg_commit();
    wg_wait<0>();
  }
  float sum = 0.0f;
  for (int i = 0; i < 32; ++i) sum += acc[i];
  if (sum == 12345.0f) out[t] = sum;
}
// The same products by mma.sync: per warp 16 rows x 64 columns x K 64 per iteration (8 x 8 m16n8k8).
extern "C" __global__ void __launch_bounds__(256) rate_mma(float* out, int iters) {
  const int t = threadIdx.x;
  unsigned af[4] = {__float_as_uint(1.0f), __float_as_uint(0.5f), __float_as_uint(0.25f), (unsigned)t};
  unsigned bf[8][2];
  for (int j = 0; j < 8; ++j) bf[j][0] = __float_as_uint(1e-3f * j), bf[j][1] = (unsigned)(t + j);
  float acc[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int j = 0; j < 8; ++j) mma8(acc[j], af, bf[j]);
  }
  float sum = 0.0f;
  for (int j = 0; j < 8; ++j) for (int e = 0; e < 4; ++e) sum += acc[j][e];
  if (sum == 12345.0f) out[t] = sum;
}
'''


def compile_probe() -> bytes:
    """The probe's cubin for sm_90a; prints each kernel's registers and spills."""
    cubin, log = nvrtc_compile(SRC, "wgmma_probe", ARCH)
    for line in log.splitlines():
        if "Used" in line:
            print(line.strip())
    regs, spills, stack = parse_report(log)
    if spills or stack:
        raise SystemExit(f"the probe spills ({spills} bytes, stack {stack})")
    return cubin


def run(cubin: bytes, iters: int) -> None:
    import cupy

    mod = cupy.cuda.function.Module()
    mod.load(cubin)
    rng = np.random.default_rng(0)
    tf32 = lambda x: (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)  # noqa: E731
    a = tf32(rng.standard_normal((64, 8)).astype(np.float32))
    b = tf32(rng.standard_normal((8, 64)).astype(np.float32))
    d = cupy.zeros((64, 64), cupy.float32)
    mod.get_function("check")((1,), (128,), (cupy.asarray(a), cupy.asarray(b), d))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs(cupy.asnumpy(d) - ref).max() / np.abs(ref).max())
    print(f"check: one m64n64k8 product, largest error {err:.2e} of the largest entry: "
          f"{'pass' if err < 1e-6 else 'FAIL'}")
    out = cupy.zeros(256, cupy.float32)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    for name in ("rate_wg", "rate_mma"):
        f = mod.get_function(name)
        for per_sm in (1, 2, 4):
            blocks = per_sm * sms
            f((blocks,), (256,), (out, np.int32(10)))
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            f((blocks,), (256,), (out, np.int32(iters)))
            stop.record()
            stop.synchronize()
            ms = cupy.cuda.get_elapsed_time(start, stop)
            flops = blocks * 2 * (64 * 64 * 64 * 2) * iters  # two m64 x n64 x k64 products a block and iteration
            print(f"{name:8s} {per_sm} block(s) an SM: {ms:8.3f} ms, {flops / ms / 1e9:6.1f} TFLOP/s (tf32)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="NVRTC for sm_90a only (no GPU)")
    ap.add_argument("--iters", type=int, default=2000, help="loop iterations per timed launch (default 2000)")
    args = ap.parse_args()
    cubin = compile_probe()
    if not args.compile_only:
        run(cubin, args.iters)


if __name__ == "__main__":
    main()
