// Panel QR with the panel's columns spread over the warps (the seed's block design). Warp w owns columns
// [w*S, w*S + S): lane l keeps rows l, l + 32, ... of them in registers. Each warp first applies the reflectors
// of the warps before it, in order, as they appear (consumer), then computes the reflectors of its own columns
// (producer) and publishes each to shared memory with one mbarrier per reflector, so a producer never waits for
// its consumers and no block-wide barrier is needed per column. Every reflector stays in shared memory.
template <int M, int N, int K, int SLOTS, int NB, int S, int VEC, int GRAM, bool TRAIL>
struct ColsPanel {
  static constexpr int WARPS = cdiv(NB, S);
  static constexpr int RS = SLOTS * 32;  // floats per reflector in shared memory (rows, padded)

  float* vs;                  // [NB][RS] reflectors, zero above the diagonal and 1 on it
  float* taus;                // [NB]
  float* gram;                // [NB][NB + 1] (TRAIL)
  float* tmat;                // [NB][NB + 1] (TRAIL)
  unsigned long long* bars;   // [NB]
  int c0, mp, vld, lane, warp, b;
  long long vbs;  // V^T: leading dimension vld, vbs floats per matrix
  float x[SLOTS][S];

  // Apply reflector c (published by an earlier warp) to this warp's columns.
  __device__ __forceinline__ void consume(int c) {
    mbar_wait(bars + c, 0);
    const float tau = taus[c];
    float v[SLOTS];
    float d[S];
#pragma unroll
    for (int k = 0; k < S; ++k) d[k] = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      v[s] = vs[c * RS + s * 32 + lane];
#pragma unroll
      for (int k = 0; k < S; ++k) d[k] = fmaf(v[s], x[s][k], d[k]);
    }
    warp_sum(d);
#pragma unroll
    for (int k = 0; k < S; ++k) d[k] *= tau;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
#pragma unroll
      for (int k = 0; k < S; ++k) x[s][k] = fmaf(-d[k], v[s], x[s][k]);
    }
  }

  // Reflector of own column I (panel column col), applied at once to own columns I+1..S-1, then published.
  template <int I>
  __device__ __forceinline__ void produce() {
    const int col = warp * S + I;
    if (col >= NB) return;
    float p[S - I];  // p[0]: sigma; p[k - I]: dot with own column k (rows below col)
    float piv[S - I];  // row col of own columns I..S-1
#pragma unroll
    for (int k = 0; k < S - I; ++k) p[k] = piv[k] = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
      const float a = r > col ? x[s][I] : 0.0f;
      p[0] = fmaf(a, a, p[0]);
#pragma unroll
      for (int k = I + 1; k < S; ++k) p[k - I] = fmaf(a, x[s][k], p[k - I]);
      if (r == col) {
#pragma unroll
        for (int k = I; k < S; ++k) piv[k - I] = x[s][k];
      }
    }
    warp_sum(p);
    const int owner = col & 31;
#pragma unroll
    for (int k = 0; k < S - I; ++k) piv[k] = warp_shuffle(piv[k], owner);
    const Reflector f = make_reflector(piv[0], p[0]);
    float fk[S];
#pragma unroll
    for (int k = I + 1; k < S; ++k) fk[k] = f.tau * fmaf(f.scale, p[k - I], piv[k - I]);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
      float v = 0.0f;
      if (r > col) {
        v = x[s][I] * f.scale;
        x[s][I] = v;
#pragma unroll
        for (int k = I + 1; k < S; ++k) x[s][k] = fmaf(-fk[k], v, x[s][k]);
      } else if (r == col) {
        v = 1.0f;
        x[s][I] = f.beta;
#pragma unroll
        for (int k = I + 1; k < S; ++k) x[s][k] -= fk[k];
      }
      vs[col * RS + r] = r < mp ? v : 0.0f;
    }
    if (lane == 0) taus[col] = f.tau;
    mbar_arrive(bars + col);
  }

  template <int I>
  __device__ __forceinline__ void produce_all() {
    produce<I>();
    if constexpr (I + 1 < S) produce_all<I + 1>();
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau,
                                      float* __restrict__ vt, float* __restrict__ zt) {
    const float* sb = src + (size_t)b * M * N + (size_t)c0 * N + c0 + warp * S;
    float* hb = h + (size_t)b * M * N + (size_t)c0 * N + c0 + warp * S;
    constexpr int NLAST = NB - (WARPS - 1) * S;  // columns of the last warp
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
#pragma unroll
      for (int k = 0; k < S; k += VEC) {
        const bool inside = r < mp && (warp < WARPS - 1 || k < NLAST);
        if (inside) {
          load_vec<VEC>(&x[s][k], sb + (size_t)r * N + k);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) x[s][k + e] = 0.0f;
        }
      }
    }
    for (int c = 0; c < warp * S; ++c) consume(c);
    produce_all<0>();
    block_barrier();

#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
#pragma unroll
      for (int k = 0; k < S; k += VEC) {
        if (r < mp && (warp < WARPS - 1 || k < NLAST)) store_vec<VEC>(hb + (size_t)r * N + k, &x[s][k]);
      }
    }
    const int t = warp * 32 + lane;
    if (t < NB) tau[(size_t)b * K + c0 + t] = taus[t];

    if constexpr (TRAIL) {
      // G = V^T V (entries k < j), one pair per warp at a time, lanes over the rows.
      for (int pair = warp; pair < NB * NB; pair += WARPS) {
        const int k = pair / NB, j = pair - k * NB;
        if (k >= j) continue;
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          acc = fmaf(round_input<GRAM>(vs[k * RS + s * 32 + lane]), round_input<GRAM>(vs[j * RS + s * 32 + lane]),
                     acc);
        }
        const float sum = warp_sum(acc);
        if (lane == 0) gram[k * (NB + 1) + j] = sum;
      }
      block_barrier();
      // T row by row (LAPACK slarft, forward, columnwise): row t depends only on its own entries and on G.
      if (t < NB) {
        t_row<NB, NB + 1>(t, gram, taus, NB, static_cast<volatile float*>(tmat + t * (NB + 1)));
      }
      block_barrier();
      // V^T and (V T)^T for the trailing update, rows over all threads.
      for (int r = t; r < mp; r += WARPS * 32) {
        for (int i = 0; i < NB; ++i) {
          const float vri = vs[i * RS + r];
          vt[(size_t)b * vbs + (size_t)i * vld + r] = vri;
          float acc = 0.0f;
          for (int k = 0; k <= i; ++k) acc = fmaf(vs[k * RS + r], tmat[k * (NB + 1) + i], acc);
          zt[((size_t)b * NB + i) * mp + r] = acc;
        }
      }
    }
  }
};

template <int M, int N, int K, int SLOTS, int NB, int S, int VEC, int GRAM, bool TRAIL>
__device__ __forceinline__ void panel_cols(const float* __restrict__ src, float* __restrict__ h,
                                           float* __restrict__ tau, float* __restrict__ vt, float* __restrict__ zt,
                                           int c0, int mp, int vld, long long vbs) {
  using P = ColsPanel<M, N, K, SLOTS, NB, S, VEC, GRAM, TRAIL>;
  QR_DYNAMIC_SHARED(smem);
  float* vs = smem;
  float* taus = vs + NB * P::RS;
  float* gram = taus + NB;
  float* tmat = gram + (TRAIL ? NB * (NB + 1) : 0);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(
      tmat + (TRAIL ? NB * (NB + 1) : 0) + ((NB + (TRAIL ? 2 * NB * (NB + 1) : 0)) & 1));
  const int t = threadIdx.x;
  if (t < NB) mbar_init(bars + t, 32);
  block_barrier();
  P panel{vs, taus, gram, tmat, bars, c0, mp, vld, t & 31, t >> 5, (int)blockIdx.x, vbs};
  panel.run(src, h, tau, vt, zt);
}
