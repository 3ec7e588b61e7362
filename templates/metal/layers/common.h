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

template <typename T, int COLS, int ROWS>
struct simdgroup_matrix {
  T e[ROWS * COLS];
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;

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

// d = a b + c on the lane's own elements, each entry's sum over k in order with fused multiply-adds.
template <typename T, int N>
QRL_FN void simdgroup_multiply_accumulate(simdgroup_matrix<T, N, N>& d, const simdgroup_matrix<T, N, N>& a,
                                          const simdgroup_matrix<T, N, N>& b, const simdgroup_matrix<T, N, N>& c) {
  const int lane = (int)qrl_lane();
  simdgroup_matrix<T, N, N> out;
  for (int i = 0; i < N * N; ++i) out.e[i] = qrl_nan();
  for (int e = lane; e < N * N; e += 32) {
    const int i = e / N, j = e % N;
    T s = c.e[e];
    for (int k = 0; k < N; ++k) s = qrl_fma(a.e[i * N + k], b.e[k * N + j], s);
    out.e[e] = s;
  }
  d = out;
}
