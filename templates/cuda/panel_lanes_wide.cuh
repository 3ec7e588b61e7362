// A lanes panel of 33 to 64 columns on one warp, the last panel of its matrix (nothing right of it, no Q): lane c
// owns columns c (x0) and 32 + c (x1), every row in registers. Columns 0..31 first, the pivot column j in lane j's
// x0 and both halves updated, then 32..NB-1, the pivot in lane j - 32's x1 and the second half alone. As in
// LanesPanel (panel_lanes.cuh), column j's tail is broadcast by shuffles, each lane's dots are its own, every lane
// builds the same reflector and the pivot column stays unscaled below its diagonal until the end. The loop over
// columns is not unrolled fully (the code would outgrow the instruction cache at these sizes): one copy of a
// column's code for each chunk of CH rows that can hold row j, in which the chunks above it are left out, the chunks
// below take no masks and only its own takes them, so a column's work shrinks with j by whole chunks. Rolled (LOOP),
// ptxas copies every updated row of a column back to its register at each trip's end; unrolled by two (not LOOP)
// those copies come every second column, for fewer instructions in twice the code: the choice is Panel.loop's.
template <int M, int N, int K, int SLOTS, int NB, bool LOOP>
struct LanesWide {
  static constexpr int CH = 4;  // rows a chunk (plan/lanes.WIDE_CHUNK); divides 32, so each phase's columns start on one
  static constexpr int STEP = LOOP ? 1 : 2;  // columns a trip of the loop over a chunk's columns
  static_assert(NB > 32 && NB <= 64 && SLOTS >= NB, "a wide lanes panel has 33 to 64 columns, at most its rows");
  int c0, mp, lane, b;
  float x0[SLOTS], x1[SLOTS], v[SLOTS];
  float own0 = 1.0f, own1 = 1.0f, tau0 = 0.0f, tau1 = 0.0f;  // the reflector of the lane's columns

  // Column j, in the chunk QJ = j / CH; A: j < 32 (the pivot in x0).
  template <int QJ, bool A>
  __device__ __forceinline__ void column(const int j) {
    constexpr int JC1 = (QJ + 1) * CH;  // rows from here lie below row j
    const int src = j & 31;
    float p0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, p1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float alpha = 0.0f, pv0 = 0.0f, pv1 = 0.0f;  // the pivot; this lane's entries in row j
#pragma unroll
    for (int s = QJ * CH; s < SLOTS; ++s) {
      const float y = warp_shuffle(A ? x0[s] : x1[s], src);
      if (s < JC1) {
        v[s] = s > j ? y : 0.0f;
        alpha = s == j ? y : alpha;
        if constexpr (A) pv0 = s == j ? x0[s] : pv0;
        pv1 = s == j ? x1[s] : pv1;
      } else {
        v[s] = y;
      }
      if constexpr (A) p0[s & 3] = fmaf(v[s], x0[s], p0[s & 3]);
      p1[s & 3] = fmaf(v[s], x1[s], p1[s & 3]);
    }
    const float d0 = (p0[0] + p0[1]) + (p0[2] + p0[3]);
    const float d1 = (p1[0] + p1[1]) + (p1[2] + p1[3]);
    const Reflector f = make_reflector<true>(alpha, warp_shuffle(A ? d0 : d1, src));
    const bool me = lane == src;
    const bool valid1 = lane + 32 < NB;
    float ws0 = 0.0f, at0 = pv0;  // w times the scale, the entry in row j (unchanged left of j)
    if constexpr (A) {
      const bool right = lane > src;
      const float w = right ? f.tau * fmaf(f.scale, d0, pv0) : 0.0f;
      ws0 = w * f.scale;
      at0 = me ? f.beta : (right ? pv0 - w : pv0);
      if (me) {
        own0 = f.scale;
        tau0 = f.tau;
      }
    } else if (me) {
      own1 = f.scale;
      tau1 = f.tau;
    }
    const bool right1 = valid1 && (A || lane > src);
    const float w1 = right1 ? f.tau * fmaf(f.scale, d1, pv1) : 0.0f;
    const float ws1 = w1 * f.scale;
    const float at1 = (!A && me) ? f.beta : (right1 ? pv1 - w1 : pv1);
#pragma unroll
    for (int s = QJ * CH; s < SLOTS; ++s) {  // v is 0 at and above row j: those FMAs change nothing
      if constexpr (A) x0[s] = (s < JC1 && s == j) ? at0 : fmaf(-ws0, v[s], x0[s]);
      x1[s] = (s < JC1 && s == j) ? at1 : fmaf(-ws1, v[s], x1[s]);
    }
  }

  template <int QJ, bool A>
  __device__ __forceinline__ void columns() {
    constexpr int J1 = (QJ + 1) * CH < (A ? 32 : NB) ? (QJ + 1) * CH : (A ? 32 : NB);
#pragma unroll STEP
    for (int j = QJ * CH; j < J1; ++j) column<QJ, A>(j);
    if constexpr (J1 < (A ? 32 : NB)) columns<QJ + 1, A>();
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau) {
    const float* sb = src + (size_t)b * M * N + (size_t)c0 * N + c0 + lane;
    float* hb = h + (size_t)b * M * N + (size_t)c0 * N + c0 + lane;
    const bool valid1 = lane + 32 < NB;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      x0[s] = s < mp ? sb[(size_t)s * N] : 0.0f;
      x1[s] = s < mp && valid1 ? sb[(size_t)s * N + 32] : 0.0f;
    }
    columns<0, true>();
    columns<32 / CH, false>();
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      if (s < mp) {
        hb[(size_t)s * N] = s > lane ? x0[s] * own0 : x0[s];
        if (valid1) hb[(size_t)s * N + 32] = s > lane + 32 ? x1[s] * own1 : x1[s];
      }
    }
    tau[(size_t)b * K + c0 + lane] = tau0;
    if (valid1) tau[(size_t)b * K + c0 + 32 + lane] = tau1;
  }
};

template <int M, int N, int K, int SLOTS, int NB, bool LOOP>
__device__ __forceinline__ void panel_lanes_wide(const float* __restrict__ src, float* __restrict__ h,
                                                 float* __restrict__ tau, int c0, int mp) {
  LanesWide<M, N, K, SLOTS, NB, LOOP> panel{c0, mp, (int)threadIdx.x, (int)blockIdx.x};
  panel.run(src, h, tau);
}

// A lanes panel of 33 to 128 columns on a block of WARPS = ceil(NB / 32) warps, the last panel of its matrix (as
// LanesWide): lane c of warp w owns column 32w + c, every row of it in registers. Column j: the pivot lane writes
// its tail to shared memory (by parity of the column); after a barrier every lane forms its dot with it (the pivot
// lane's is sigma, so no pass of its own computes it) and the pivot lane writes sigma and the pivot; after a second
// barrier every warp builds the same reflector and updates its own columns, reading the tail again (held, it would
// double the registers). A warp whose columns are all done keeps passing the barriers and does nothing else. The
// loop over columns is rolled, one copy of a column's code for each chunk of CH rows, as in LanesWide.
template <int M, int N, int K, int SLOTS, int NB, int WARPS>
struct LanesBlock {
  static constexpr int CH = 8;  // rows a chunk; divides 32, so a chunk's columns share their pivot warp
  static constexpr int VP = cdiv(SLOTS, 4) * 4;  // the tail buffer, in whole float4s
  static constexpr int HOIST = 16;  // rows of the tail the compiler may load ahead (its registers beside x)
  static_assert(NB > 32 && NB <= 32 * WARPS && NB > 32 * (WARPS - 1) && SLOTS >= NB,
                "a block lanes panel has one warp for each 32 of its columns, at most its rows");
  struct Shared {
    alignas(16) float v[2][VP];
    float sa[2][2];  // sigma and the pivot
  };
  Shared& sm;
  int c0, mp, lane, warp, b;
  float x[SLOTS];
  float own = 1.0f, tauv = 0.0f;

  template <int QJ>
  __device__ __forceinline__ void column(const int j) {
    constexpr int S0 = QJ * CH, JC1 = (QJ + 1) * CH, PW = S0 / 32;
    const int par = j & 1;
    float* vb = sm.v[par];
    const int col = 32 * warp + lane;
    if (col == j) {  // the pivot lane: its tail (zero at and above row j)
#pragma unroll
      for (int s = S0 - S0 % 4; s < VP; s += 4) {
        float t[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = s + e;
          t[e] = r >= SLOTS || r < S0 ? 0.0f : ((r >= JC1 || r > j) ? x[r] : 0.0f);
        }
        store_vec<4>(vb + s, t);
      }
    }
    block_barrier();
    if (warp < PW) {  // its columns are done
      block_barrier();
      return;
    }
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float pv = 0.0f;
#pragma unroll
    for (int s = S0 - S0 % 4; s < VP; s += 4) {
      if (s % HOIST == 0) warp_barrier();  // no load of the tail hoisted more than HOIST rows ahead of its use
      float t[4];
      load_vec<4>(t, vb + s);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = s + e;
        if (r >= S0 && r < SLOTS) {
          p[r & 3] = fmaf(t[e], x[r], p[r & 3]);
          if (r < JC1) pv = r == j ? x[r] : pv;
        }
      }
    }
    const float d = (p[0] + p[1]) + (p[2] + p[3]);  // the pivot lane's: sigma
    if (col == j) {
      sm.sa[par][0] = d;
      sm.sa[par][1] = pv;
    }
    block_barrier();
    const Reflector f = make_reflector<true>(sm.sa[par][1], sm.sa[par][0]);
    const bool me = col == j;
    const bool right = col > j && col < NB;
    const float w = right ? f.tau * fmaf(f.scale, d, pv) : 0.0f;
    const float ws = w * f.scale;
    const float at = me ? f.beta : (right ? pv - w : pv);
    if (me) {
      own = f.scale;
      tauv = f.tau;
    }
#pragma unroll
    for (int s = S0 - S0 % 4; s < VP; s += 4) {  // the tail is 0 at and above row j: those FMAs change nothing
      if (s % HOIST == 0) warp_barrier();
      float t[4];
      load_vec<4>(t, vb + s);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = s + e;
        if (r >= S0 && r < SLOTS) x[r] = (r < JC1 && r == j) ? at : fmaf(-ws, t[e], x[r]);
      }
    }
  }

  template <int QJ>
  __device__ __forceinline__ void columns() {
    constexpr int J1 = (QJ + 1) * CH < NB ? (QJ + 1) * CH : NB;
#pragma unroll 1
    for (int j = QJ * CH; j < J1; ++j) column<QJ>(j);
    if constexpr (J1 < NB) columns<QJ + 1>();
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau) {
    const int col = 32 * warp + lane;
    const bool mine = col < NB;
    const float* sb = src + (size_t)b * M * N + (size_t)c0 * N + c0 + col;
    float* hb = h + (size_t)b * M * N + (size_t)c0 * N + c0 + col;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) x[s] = mine && s < mp ? sb[(size_t)s * N] : 0.0f;
    columns<0>();
    if (mine) {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s < mp) hb[(size_t)s * N] = s > col ? x[s] * own : x[s];
      }
      tau[(size_t)b * K + c0 + col] = tauv;
    }
  }
};

template <int M, int N, int K, int SLOTS, int NB, int WARPS>
__device__ __forceinline__ void panel_lanes_block(const float* __restrict__ src, float* __restrict__ h,
                                                  float* __restrict__ tau, int c0, int mp) {
  using P = LanesBlock<M, N, K, SLOTS, NB, WARPS>;
  QR_SHARED_VAR(sm, typename P::Shared);
  P panel{sm, c0, mp, (int)(threadIdx.x & 31), (int)(threadIdx.x >> 5), (int)blockIdx.x};
  panel.run(src, h, tau);
}
