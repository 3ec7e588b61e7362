// The whole factorization of a matrix on one block ("whole"): the matrix lives in shared memory from the first
// load to the last store, so nothing between its panels goes through global memory or waits for a launch. Panels
// of NB columns (the last one narrower where NB does not divide K) factor as a rows panel on the block
// (RowsPanel: rows in registers, one reduction per column, T by its Gram entries), then update the columns right
// of them in fp32 FMAs from shared memory: W = V^T C with a thread per column (and part of the rows where the
// columns are fewer than the threads), W' = T^T W, C -= V W' with a thread per column and part of the rows. The
// loop over panels is unrolled: every panel's rows, columns and thread counts are constants.
template <int M, int N, int K, int NB, int THREADS, int VEC, int GRAM, bool LOOP>
struct Whole {
  // Floats between rows of the matrix: odd, so that threads reading down a column (a panel's rows) hit distinct
  // banks; lanes reading along a row (the updates) are consecutive anyway.
  static constexpr int LDA = N | 1;
  static constexpr int VLD = NB + 4;  // rows of V padded to 16 bytes: one 128-bit broadcast serves four columns
  static constexpr int PARTS = THREADS * NB;  // partial sums of W: parts of the rows x NB x columns, at most this
  // Dynamic shared memory, in floats (each part 16-byte aligned): the matrix, V, W's partial sums, W'.
  static constexpr int OV = cdiv(M * LDA, 4) * 4, OW = OV + M * VLD, O2 = OW + PARTS, FLOATS = O2 + NB * N;
  using Big = RowsPanel<M, N, K, cdiv(M, THREADS), NB, THREADS, 1, 1, GRAM, true, false, LOOP>;
  float* a;  // [M][LDA]: the matrix
  float* v;  // [M][VLD]: the panel's V, unit diagonal and zeros above it written out
  float* wp;  // [PARTS]: W's partial sums by part of the rows
  float* w2;  // [NB][N]: W' = T^T W
  void* ps;  // the panels' shared state (RowsPanel::Shared, the widest panel's size)
  int t, b;

  // Row r of V (W entries, 16-byte aligned) by 128-bit loads, into o[0 .. W) (o's padding takes what follows).
  template <int W>
  __device__ __forceinline__ void vrow(int r, float (&o)[4 * cdiv(W, 4)]) const {
#pragma unroll
    for (int q = 0; q < cdiv(W, 4); ++q) {
      const float4 f = reinterpret_cast<const float4*>(v + r * VLD)[q];
      o[4 * q] = f.x;
      o[4 * q + 1] = f.y;
      o[4 * q + 2] = f.z;
      o[4 * q + 3] = f.w;
    }
  }

  // Panel [C0, C0 + W): factor, then update the NC columns right of it.
  template <int C0, int W>
  __device__ __forceinline__ void panel(float* __restrict__ tau) {
    constexpr int MP = M - C0, NC = N - C0 - W;
    constexpr int SLOTS = cdiv(MP, THREADS);
    using P = RowsPanel<M, N, K, SLOTS, W, THREADS, 1, 1, GRAM, (NC > 0), false, LOOP>;
    static_assert(sizeof(typename P::Shared) <= sizeof(typename Big::Shared), "every panel's shared state fits");
    auto& sm = *reinterpret_cast<typename P::Shared*>(ps);
    P p{sm, nullptr, nullptr, 0u, C0, MP, 0, 0ll, t, t & 31, t >> 5, b, 0, t};
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = t + s * THREADS;
#pragma unroll
      for (int k = 0; k < W; ++k) p.x[s][k] = r < MP ? a[(C0 + r) * LDA + C0 + k] : 0.0f;
    }
    p.factor();  // ends with a barrier: sm.tau and (NC > 0) sm.tmat are complete
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = t + s * THREADS;
      if (r < MP) {
#pragma unroll
        for (int k = 0; k < W; ++k) {
          a[(C0 + r) * LDA + C0 + k] = p.x[s][k];
          if constexpr (NC > 0) v[r * VLD + k] = r > k ? p.x[s][k] : (r == k ? 1.0f : 0.0f);
        }
      }
    }
    if (t < W) tau[(size_t)b * K + C0 + t] = sm.tau[t];
    if constexpr (NC > 0) {
      block_barrier();  // V complete
      update<C0, W>(&sm.tmat[0][0]);
    }
  }

  // C (rows C0.., columns C0 + W..) -= V T^T V^T C; tm: T (W x W, rows W + 1 floats apart, upper triangular).
  template <int C0, int W>
  __device__ __forceinline__ void update(const float* tm) {
    constexpr int MP = M - C0, NC = N - C0 - W, CB = C0 + W;
    // W = V^T C: RS parts of the rows per column (as many as the threads allow), each thread a column's part.
    constexpr int RS = NC >= THREADS ? 1 : (THREADS / NC > 8 ? 8 : THREADS / NC);
    constexpr int RP = cdiv(MP, RS);  // rows per part
    static_assert(RS * NC * W <= PARTS || RS == 1, "W's partial sums fit their buffer");
    for (int i = t; i < NC * RS; i += THREADS) {
      const int c = i % NC, part = i / NC;
      const int r0 = part * RP, r1 = r0 + RP < MP ? r0 + RP : MP;
      float acc[W];
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] = 0.0f;
#pragma unroll 2
      for (int r = r0; r < r1; ++r) {
        const float cv = a[(C0 + r) * LDA + CB + c];
        float vr[4 * cdiv(W, 4)];
        vrow<W>(r, vr);
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = fmaf(vr[k], cv, acc[k]);
      }
      if constexpr (RS == 1) {
        tw<W>(tm, acc, c);
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k) wp[(part * W + k) * NC + c] = acc[k];
      }
    }
    if constexpr (RS > 1) {
      block_barrier();  // every part's sums are in
      for (int c = t; c < NC; c += THREADS) {
        float acc[W];
#pragma unroll
        for (int k = 0; k < W; ++k) {
          float s = 0.0f;
#pragma unroll
          for (int part = 0; part < RS; ++part) s += wp[(part * W + k) * NC + c];
          acc[k] = s;
        }
        tw<W>(tm, acc, c);
      }
    }
    block_barrier();  // W' complete
    // C -= V W': US parts of the rows per column, each thread a column's part with W' in registers.
    constexpr int US = NC >= THREADS ? 1 : THREADS / NC;
    constexpr int UP = cdiv(MP, US);
    for (int i = t; i < NC * US; i += THREADS) {
      const int c = i % NC, part = i / NC;
      const int r0 = part * UP, r1 = r0 + UP < MP ? r0 + UP : MP;
      float wk[W];
#pragma unroll
      for (int k = 0; k < W; ++k) wk[k] = w2[k * N + c];
#pragma unroll 2
      for (int r = r0; r < r1; ++r) {
        float* cp = a + (C0 + r) * LDA + CB + c;
        float vr[4 * cdiv(W, 4)];
        vrow<W>(r, vr);
        float cv = *cp;
#pragma unroll
        for (int k = 0; k < W; ++k) cv = fmaf(-vr[k], wk[k], cv);
        *cp = cv;
      }
    }
    block_barrier();  // C updated: the next panel reads it, the next update rewrites V and W'
  }

  // W'[k][c] = sum_{j <= k} T[j][k] W[j][c] into w2 (H_0 ... H_{W-1} = I - V T V^T, applied transposed). The loop
  // over k is not unrolled, so T's entries are read as they are used rather than all held in registers at once.
  template <int W>
  __device__ __forceinline__ void tw(const float* tm, const float (&acc)[W], int c) {
#pragma unroll 1
    for (int k = 0; k < W; ++k) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < W; ++j) s = fmaf(j <= k ? tm[j * (W + 1) + k] : 0.0f, acc[j], s);
      w2[k * N + c] = s;
    }
  }

  template <int C0>
  __device__ __forceinline__ void panels(float* __restrict__ tau) {
    if constexpr (C0 < K) {
      constexpr int W = K - C0 < NB ? K - C0 : NB;
      panel<C0, W>(tau);
      panels<C0 + W>(tau);
    }
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau) {
    const float* sb = src + (size_t)b * M * N;
    float* hb = h + (size_t)b * M * N;
    for (int e = t * VEC; e < M * N; e += THREADS * VEC) {
      float x[VEC];
      load_vec<VEC>(x, sb + e);
      const int r = e / N, c = e - r * N;  // VEC divides N: the VEC floats share a row
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[r * LDA + c + i] = x[i];
    }
    block_barrier();
    panels<0>(tau);
    block_barrier();  // the last panel's columns are in
    for (int e = t * VEC; e < M * N; e += THREADS * VEC) {
      const int r = e / N, c = e - r * N;
      float x[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[i] = a[r * LDA + c + i];
      store_vec<VEC>(hb + e, x);
    }
  }
};

template <int M, int N, int K, int NB, int THREADS, int VEC, int GRAM, bool LOOP>
__device__ __forceinline__ void whole(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau) {
  using Q = Whole<M, N, K, NB, THREADS, VEC, GRAM, LOOP>;
  QR_DYNAMIC_SHARED(dyn);
  QR_SHARED __align__(16) unsigned char ps[sizeof(typename Q::Big::Shared)];
  Q q{dyn, dyn + Q::OV, dyn + Q::OW, dyn + Q::O2, ps, (int)threadIdx.x, (int)blockIdx.x};
  q.run(src, h, tau);
}
