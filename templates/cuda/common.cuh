// Device helpers of the panel and T kernels, over the dialect (dialect.cuh, included before this): warp
// reduce-scatter, Householder reflectors, vector loads and stores, rows of T. Included once per rendered source.

// Reduce-scatter across a warp: NV values per lane in v[0..NV) (NV a power of two, at most 32). Afterwards
// v[0] of lane l holds the warp-wide sum of value l >> (5 - log2 NV): 31 shuffles for 32 values instead of 160.
template <int OFF, int NV>
__device__ __forceinline__ void reduce_scatter(float* v, int lane) {
  if constexpr (OFF >= 1) {
    if constexpr (NV > 1) {
      const bool upper = (lane & OFF) != 0;
#pragma unroll
      for (int i = 0; i < NV / 2; ++i) {
        const float send = lane_select(upper, v[i], v[i + NV / 2]);
        const float keep = lane_select(upper, v[i + NV / 2], v[i]);
        v[i] = keep + warp_shuffle_xor(send, OFF);
      }
      reduce_scatter<OFF / 2, NV / 2>(v, lane);
    } else {
      v[0] += warp_shuffle_xor(v[0], OFF);
      reduce_scatter<OFF / 2, 1>(v, lane);
    }
  }
}

__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }

// Householder reflector from alpha (the pivot) and sigma (squared norm below the pivot), LAPACK's slarfg
// without its rescaling loop: H = I - tau v v^T, v = [1; x / (alpha - beta)], H [alpha; x] = [beta; 0].
// sigma == 0 gives tau = 0 (H = I), with the tail left as it is.
struct Reflector {
  float tau, beta, scale;
};

template <bool SELECTS = false>
__device__ __forceinline__ Reflector make_reflector(float alpha, float sigma) {
  Reflector r;
  if constexpr (SELECTS) {
    // No branches (one-warp lanes panels and cols producers, whose column chains are the kernel): below FLT_MIN the
    // sum is scaled by 2^64 into the normal range for the hardware reciprocal square root and the results scaled
    // back by 2^32; with sigma == 0 the reflector is the identity (tau 0), whatever the arithmetic beside it gave.
    // Both hardware operands are normal (|alpha - beta| >= norm >= 2^-75), so their flush-to-zero forms apply.
    const float s = fmaf(alpha, alpha, sigma);
    const bool tiny = s < 1.17549435e-38f;
    const float sc = tiny ? s * 18446744073709551616.0f : s;
    const float inv_sc = rsqrt_normal(sc);
    const float norm = (sc * inv_sc) * (tiny ? 2.3283064365386963e-10f : 1.0f);
    const float inv_norm = inv_sc * (tiny ? 4294967296.0f : 1.0f);
    const float beta = alpha >= 0.0f ? -norm : norm;
    const bool identity = sigma == 0.0f;
    r.beta = identity ? alpha : beta;
    r.tau = identity ? 0.0f : fmaf(alpha, alpha >= 0.0f ? inv_norm : -inv_norm, 1.0f);
    r.scale = identity ? 1.0f : rcp_normal(alpha - beta);
    return r;
  }
  if (sigma == 0.0f) {
    r.tau = 0.0f;
    r.beta = alpha;
    r.scale = 1.0f;
  } else {
    // The hardware reciprocal square root (2 ulp) where s is a normal number, so the column's chain has no IEEE
    // sqrt and division sequences with their slow-path branches; below FLT_MIN the IEEE path (MUFU.RSQ would see a
    // denormal as zero). tau = (beta - alpha) / beta = 1 - alpha / beta. |alpha - beta| >= norm >= 1e-23 and far
    // below 2^126, where the hardware reciprocal is exact to 1 ulp and its operand normal.
    const float s = fmaf(alpha, alpha, sigma);
    float norm, inv_norm;
    if (s >= 1.17549435e-38f) {
      inv_norm = rsqrt_normal(s);
      norm = s * inv_norm;
    } else {
      norm = sqrtf(s);
      inv_norm = 1.0f / norm;
    }
    r.beta = alpha >= 0.0f ? -norm : norm;
    r.tau = fmaf(alpha, alpha >= 0.0f ? inv_norm : -inv_norm, 1.0f);
    r.scale = rcp_normal(alpha - r.beta);
  }
  return r;
}

template <int VEC>
__device__ __forceinline__ void load_vec(float* dst, const float* src) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4*>(src);
    dst[0] = t.x; dst[1] = t.y; dst[2] = t.z; dst[3] = t.w;
  } else if constexpr (VEC == 2) {
    const float2 t = *reinterpret_cast<const float2*>(src);
    dst[0] = t.x; dst[1] = t.y;
  } else {
    dst[0] = *src;
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(float* dst, const float* src) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
  } else if constexpr (VEC == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(src[0], src[1]);
  } else {
    *dst = src[0];
  }
}

// One thread's run of N consecutive floats v[0..N) at q[0..N), entries from `count` on left out: 16-byte stores
// where q is 16-byte aligned and the whole run is in range, else one float at a time. (A lanes panel's thread holds
// N rows of one column of V, so its entries of a row of V^T or (VT)^T are consecutive in memory.)
template <int N>
__device__ __forceinline__ void store_run(float* q, const float (&v)[N], int count) {
  if constexpr (N % 4 == 0) {
    if (count >= N && (reinterpret_cast<unsigned long long>(q) & 15ull) == 0) {
#pragma unroll
      for (int s = 0; s < N; s += 4) store_vec<4>(q + s, v + s);
      return;
    }
  }
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (s < count) q[s] = v[s];
}

// Row `row` of T for NB reflectors (LAPACK slarft, forward, columnwise): T[i][j] = -tau_j sum_{i<=k<j} T[i][k] G[k][j],
// T[i][i] = tau_i, zero left of the diagonal; from G's strictly upper part (g[k * GLD + j]) and tau (entries from
// `count` on read as zero), into r[0..NB). Fully unrolled, every thread reading G and tau at the same addresses
// (broadcasts), so the loads run ahead of the FMAs and the longest dependent chain is about NB steps. r is a local
// array (the row in registers, NB more of them) or, where registers are short (the panel kernels), the thread's
// row in shared memory through a volatile pointer (each entry re-read after it is written, not held); G is read
// through a volatile pointer too (hoisted far ahead of use, its loads cost registers).
template <int NB, int GLD, typename Row>
__device__ __forceinline__ void t_row(int row, const float* g, const float* __restrict__ tau, int count, Row r) {
  const volatile float* gv = g;
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int k = 0; k + 1 < j; k += 2) {
      s0 = fmaf(r[k], gv[k * GLD + j], s0);
      s1 = fmaf(r[k + 1], gv[(k + 1) * GLD + j], s1);
    }
    if (j & 1) s0 = fmaf(r[j - 1], gv[(j - 1) * GLD + j], s0);
    const float tj = j < count ? tau[j] : 0.0f;
    r[j] = j > row ? -tj * (s0 + s1) : (j == row ? tj : 0.0f);
  }
}
