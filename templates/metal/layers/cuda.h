// MSL on CUDA (qrgen/compile/msl.py's CUDA layer): a threadgroup is a block, a SIMD group a warp, the threadgroup
// memory argument the block's dynamic shared memory, compiled by NVRTC. The launcher allows Apple's limits only
// (32 KB of threadgroup memory, 1024 threads, no other shared memory), so nothing passes here on CUDA-only
// resources.
#define QRL_FN __device__ __forceinline__
#define kernel static __device__ __forceinline__
__device__ __forceinline__ unsigned qrl_lane() { return threadIdx.x & 31; }
__device__ __forceinline__ float qrl_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ float qrl_nan() { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ unsigned qrl_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float qrl_float(unsigned u) { return __uint_as_float(u); }
#define threadgroup_barrier(flags) __syncthreads()
#define simdgroup_barrier(flags) __syncwarp()
__device__ __forceinline__ float simd_shuffle(float v, unsigned short lane) { return __shfl_sync(0xffffffffu, v, lane); }
__device__ __forceinline__ float simd_shuffle_xor(float v, unsigned short mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
__device__ __forceinline__ float simd_sum(float v) {
  for (int off = 16; off >= 1; off >>= 1) v += simd_shuffle_xor(v, (unsigned short)off);
  return v;
}
namespace metal {}
