// MSL on the CPU (qrgen/compile/msl.py's CPU layer): MSL's names over the fibers of templates/host/fibers.h
// (included before this), a threadgroup's threads as fibers on one host thread. Metal's behaviour at a barrier that
// not every thread reaches is undefined; here it is an error. Built with the host's C++ compiler.

#define QRL_FN inline
#define kernel static inline
inline unsigned qrl_lane() { return (unsigned)(qrl::G->current & 31); }
inline float qrl_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float qrl_nan() { return __builtin_nanf(""); }
inline unsigned qrl_bits(float f) {
  unsigned u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
inline float qrl_float(unsigned u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

namespace metal {
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float abs(float x) { return __builtin_fabsf(x); }
}  // namespace metal

#define threadgroup_barrier(flags) qrl::tg_barrier()
#define simdgroup_barrier(flags) qrl::sg_barrier()
inline float simd_shuffle(float v, unsigned short lane) { return qrl::exchange(v, lane); }
inline float simd_shuffle_xor(float v, unsigned short mask) { return qrl::exchange(v, (qrl::G->current & 31) ^ mask); }
inline float simd_sum(float v) {  // every lane adds the 32 values in lane order
  const float* all = qrl::exchange_all(v);
  float s = 0.0f;
  for (int i = 0; i < 32; ++i) s += all[i];
  return s;
}
struct uint3 {
  unsigned x, y, z;
};
