// MSL's model beside the barriers, for the translation layers (qrgen/compile/msl.py): the address spaces as nothing,
// MSL's scalar and vector names, mem_flags, and simdgroup matrices. QRL_FN is the layer's function qualifier.
// A simdgroup matrix is spread over the lanes here as on Apple GPUs, in a layout of the layer's own (MSL does not
// expose Apple's): a load gives every lane the whole matrix, a product computes only the lane's own elements (l and
// l + 32 of lane l, the others NaN), a store writes the lane's own. So a product's result serves as an accumulator
// and is stored; used as a product's a or b operand without a store and load between, it gives NaN, and the
// kernel fails its checks here instead of passing by the layer's leave.
#define device
#define threadgroup
#define thread
#define constant const
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;

enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
QRL_FN mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((unsigned)a | (unsigned)b); }

// MSL's half and bfloat as 16-bit storage: float converts to them rounding to nearest, ties to even (past the
// largest finite value to inf; half keeps its subnormals), and they convert back to float exactly. The layers'
// qrl_bits and qrl_float reinterpret a float's bits.
QRL_FN unsigned short qrl_half_bits(float f) {
  const unsigned x = qrl_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // 65520 and up round to inf
  if (ax >= 0x38800000u) {  // a normal half: rebias the exponent, round 13 bits off
    const unsigned m = ax - 0x38000000u;
    return (unsigned short)(sign | ((m + 0x0fffu + ((m >> 13) & 1u)) >> 13));
  }
  const unsigned e = ax >> 23;  // a subnormal half (or zero): units of 2^-24
  if (e < 102u) return (unsigned short)sign;
  const unsigned mant = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
  unsigned q = mant >> shift;
  const unsigned rest = mant & ((1u << shift) - 1u), tie = 1u << (shift - 1u);
  q += (rest > tie || (rest == tie && (q & 1u))) ? 1u : 0u;
  return (unsigned short)(sign | q);
}
QRL_FN float qrl_half_float(unsigned short h) {
  const unsigned sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
  if (e == 31u) return qrl_float(sign | 0x7f800000u | (m << 13));
  if (e == 0u) {
    const float v = (float)m * 5.9604644775390625e-8f;  // m 2^-24
    return sign ? -v : v;
  }
  return qrl_float(sign | ((e + 112u) << 23) | (m << 13));
}
QRL_FN unsigned short qrl_bfloat_bits(float f) {
  const unsigned x = qrl_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
struct half {
  unsigned short bits;
  QRL_FN half() = default;
  QRL_FN explicit half(float f) : bits(qrl_half_bits(f)) {}
  QRL_FN operator float() const { return qrl_half_float(bits); }
};
struct bfloat {
  unsigned short bits;
  QRL_FN bfloat() = default;
  QRL_FN explicit bfloat(float f) : bits(qrl_bfloat_bits(f)) {}
  QRL_FN operator float() const { return qrl_float((unsigned)bits << 16); }
};

// MSL's as_type between float and uint (the bits reinterpreted)
template <typename T, typename F> QRL_FN T as_type(F x);
template <> QRL_FN uint as_type<uint, float>(float x) { return qrl_bits(x); }
template <> QRL_FN float as_type<float, uint>(uint x) { return qrl_float(x); }

template <typename T, int COLS, int ROWS>
struct simdgroup_matrix {
  T e[ROWS * COLS];
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <typename T, int COLS, int ROWS>
QRL_FN simdgroup_matrix<T, COLS, ROWS> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, COLS, ROWS> m;
  for (int i = 0; i < ROWS * COLS; ++i) m.e[i] = value;
  return m;
}

template <typename T, int COLS, int ROWS>
QRL_FN void simdgroup_load(simdgroup_matrix<T, COLS, ROWS>& m, const T* src, ulong elements_per_row = COLS) {
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) m.e[r * COLS + c] = src[r * elements_per_row + c];
}

template <typename T, int COLS, int ROWS>
QRL_FN void simdgroup_store(const simdgroup_matrix<T, COLS, ROWS>& m, T* dst, ulong elements_per_row = COLS) {
  const int lane = (int)qrl_lane();
  for (int i = lane; i < ROWS * COLS; i += 32) dst[(i / COLS) * elements_per_row + i % COLS] = m.e[i];
}

// d = a b + c on the lane's own elements, each entry's sum over k in order with fused multiply-adds in float (a and
// b may be half or bfloat matrices, their products exact in float, accumulated into float c and d, as MSL allows).
template <typename T, typename A, typename B, int N>
QRL_FN void simdgroup_multiply_accumulate(simdgroup_matrix<T, N, N>& d, const simdgroup_matrix<A, N, N>& a,
                                          const simdgroup_matrix<B, N, N>& b, const simdgroup_matrix<T, N, N>& c) {
  const int lane = (int)qrl_lane();
  simdgroup_matrix<T, N, N> out;
  for (int i = 0; i < N * N; ++i) out.e[i] = qrl_nan();
  for (int e = lane; e < N * N; e += 32) {
    const int i = e / N, j = e % N;
    T s = c.e[e];
    for (int k = 0; k < N; ++k) s = qrl_fma((float)a.e[i * N + k], (float)b.e[k * N + j], s);
    out.e[e] = s;
  }
  d = out;
}
