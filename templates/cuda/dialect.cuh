// The dialect layer, CUDA's: what kernel bodies need that each GPU backend spells its own way, behind neutral
// names. A Metal port adds templates/metal/dialect.h with the same names over MSL's own (named beside each helper
// below). Each helper is force-inlined and does exactly what the intrinsic it wraps does, with the same mask and
// the same order of operations, so the machine code is the same as with the intrinsic written out. Features only
// some targets have (clusters and distributed shared memory, mbarriers, cp.async, tensor-core mma) are not
// dialect: each has its own header, included by the kernels that use it.

#define QR_FULL_MASK 0xffffffffu  // every lane of the warp takes part

// Shared memory: a block's static shared variable, and its dynamic shared memory as floats, 16-byte aligned
// (MSL: threadgroup; the dynamic part a threadgroup(0) kernel argument). QR_SHARED_VAR(name, type) declares one
// of a kernel whose blocks may form a cluster (the CPU layer, which runs a cluster's blocks together, gives each
// block its own).
#define QR_SHARED __shared__
#define QR_SHARED_VAR(name, ...) __shared__ __VA_ARGS__ name
#define QR_DYNAMIC_SHARED(name) extern __shared__ __align__(16) float name[]

// Barriers: every thread of the block (every lane of the warp) arrives before any goes on, and their shared-memory
// writes are visible to each other after it (MSL: threadgroup_barrier, simdgroup_barrier).
__device__ __forceinline__ void block_barrier() { __syncthreads(); }
__device__ __forceinline__ void warp_barrier() { __syncwarp(); }

// Orders this thread's global-memory writes before its later ones, as other blocks see them (MSL:
// atomic_thread_fence at device scope).
__device__ __forceinline__ void device_fence() { __threadfence(); }

// A global-memory load past this SM's L1, so that it sees what other blocks wrote before a device fence (MSL: a
// load through a coherent(device) pointer).
__device__ __forceinline__ float load_coherent(const float* p) { return __ldcg(p); }

// Relaxed atomics on global memory, returning the old value (MSL: atomic_fetch_add_explicit,
// atomic_fetch_max_explicit).
__device__ __forceinline__ unsigned atomic_add(unsigned* p, unsigned v) { return atomicAdd(p, v); }
__device__ __forceinline__ unsigned atomic_max(unsigned* p, unsigned v) { return atomicMax(p, v); }

// The hardware's reciprocal square root and reciprocal for operands the caller keeps normal, with normal results:
// the values of rsqrtf(x) and __fdividef(1, x), without the rescaling of denormal operands that the compiler puts
// around those (their flush-to-zero forms; MSL: rsqrt, fast::divide, which flush denormals too).
__device__ __forceinline__ float rsqrt_normal(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_normal(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// p ? a : b kept a select: many selects on one lane-dependent condition (a reduce-scatter's halves) otherwise
// become a branch, and the shuffles after it run diverged (docs/decisions.md#lane-select).
__device__ __forceinline__ float lane_select(bool p, float a, float b) {
  float r;
  asm("{\n .reg .pred q;\n setp.ne.u32 q, %3, 0;\n selp.f32 %0, %1, %2, q;\n}" : "=f"(r) : "f"(a), "f"(b),
      "r"(static_cast<unsigned>(p)));
  return r;
}

// Warp shuffles, every lane taking part: v of lane `lane`, and v of lane (this lane ^ mask) (MSL: simd_shuffle,
// simd_shuffle_xor).
__device__ __forceinline__ float warp_shuffle(float v, int lane) { return __shfl_sync(QR_FULL_MASK, v, lane); }
__device__ __forceinline__ float warp_shuffle_xor(float v, int mask) {
  return __shfl_xor_sync(QR_FULL_MASK, v, mask);
}
// v of lane `lane` of this lane's segment of W lanes (W a power of two: the warp as 32 / W independent groups).
template <int W>
__device__ __forceinline__ float segment_shuffle(float v, int lane) { return __shfl_sync(QR_FULL_MASK, v, lane, W); }

// Warp reductions by butterfly (offsets 16, 8, 4, 2, 1), every lane ending with the result: the sum of v, the sums
// of v[0..N) each (the N values' shuffles interleaved at each offset), the maximum of v (fmaxf: NaN passed over).
// MSL's simd_sum and simd_max leave the order of the sum open; a bit-identical port keeps the butterfly.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += warp_shuffle_xor(v, off);
  return v;
}

template <int N>
__device__ __forceinline__ void warp_sum(float (&v)[N]) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += warp_shuffle_xor(v[i], off);
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, warp_shuffle_xor(v, off));
  return v;
}

// x rounded to the product inputs' precision PREC (the codes of qrgen/plan/family.PRECISION_CODE: 0 fp32, 1 tf32,
// 2 bf16, 3 fp16), back in a float: the hardware's conversions, to nearest (tf32: ties away from zero) (MSL:
// conversions through half and bfloat, tf32 by its bits).
template <int PREC>
__device__ __forceinline__ float round_input(float x) {
  if constexpr (PREC == 1) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
  } else if constexpr (PREC == 2) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return __uint_as_float(((unsigned)r) << 16);
  } else if constexpr (PREC == 3) {
    unsigned short r;
    float y;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(r));
    return y;
  } else {
    return x;
  }
}
