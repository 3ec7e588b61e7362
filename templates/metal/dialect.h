// The dialect layer, Metal's: the neutral names of templates/cuda/dialect.cuh over MSL's own, for the Metal kernel
// families. Kernels pass device memory as `device` pointers and threadgroup memory as one `threadgroup float*`
// kernel argument (its length set by the host), never as threadgroup variables, so that the translation layers
// (qrgen/compile/msl.py) can bind it as they bind buffers.

// Barriers: every thread of the threadgroup (every lane of the SIMD group) arrives before any goes on; their
// threadgroup-memory writes (with _device also their device-memory writes) are visible to each other after it.
inline void block_barrier() { threadgroup_barrier(mem_flags::mem_threadgroup); }
inline void block_barrier_device() { threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup); }
inline void warp_barrier() { simdgroup_barrier(mem_flags::mem_threadgroup); }

// SIMD-group shuffles, every lane taking part: v of lane `lane`, and v of lane (this lane ^ mask).
inline float warp_shuffle(float v, uint lane) { return simd_shuffle(v, (ushort)lane); }
inline float warp_shuffle_xor(float v, uint mask) { return simd_shuffle_xor(v, (ushort)mask); }

// The SIMD group's sum of v, every lane ending with it (MSL leaves the order of the sum open).
inline float warp_sum(float v) { return simd_sum(v); }
