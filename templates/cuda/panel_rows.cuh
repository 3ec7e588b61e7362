// Panel QR with the panel's rows spread over the threads ("warp": one warp; "rows": a block, or BLOCKS
// blocks that exchange partial sums through global memory, or with CLUSTER the BLOCKS blocks of one thread-block
// cluster, through each other's shared memory). Each thread keeps SLOTS rows x NB columns in registers for the
// whole panel; one reduction per column carries the column's squared norm, its dots with the later columns and
// the Gram entries of the previous reflector, so a column costs one barrier (one flag exchange, or one cluster
// barrier, when BLOCKS > 1). The loop over columns is unrolled (every column its own code: the triangle of work
// shrinks, but the code grows to about 0.8 MB of cubin), or with LOOP it is not: the registers rotate by one
// column per step, so one column's code serves every column at about 1.6 times the arithmetic.
template <int M, int N, int K, int SLOTS, int NB, int THREADS, int BLOCKS, int VEC, int GRAM, bool TRAIL,
          bool CLUSTER, bool LOOP>
struct RowsPanel {
  static constexpr int WARPS = THREADS / 32;
  static constexpr int RB = SLOTS * THREADS;  // rows per block
  static constexpr int XCH = 64;              // floats per block and column in the exchange buffer
  // T built by t_row (unrolled) only below 512 threads: at 512 (a cap of 128 registers) these kernels have no
  // registers to spare (an unrolled row moves spills in), so there the row is walked in place.
  static constexpr bool UNROLL_T = THREADS < 512;
  // One block of several warps: warp 0 builds each column's reflector once, beside the warps' sums, and the other
  // warps read its coefficients (ONCE) instead of each building the same reflector from the sums (its square root,
  // division and branches, and a multiply-add per later column, where the block's warps share the SM's issue
  // slots).
  static constexpr bool ONCE = WARPS > 1 && BLOCKS == 1;
  static_assert(NB <= 32 && NB <= THREADS, "a rows panel is at most 32 columns wide");

  struct Shared {
    float red[WARPS][32];
    float tot[2][32];  // by parity of the column, like piv
    float piv[2][NB];
    float gram[NB][NB + 1];
    float tmat[NB][NB + 1];
    float tau[NB];
    // ONCE, by parity of the column: [0] the reflector's scale, [p] for 0 < p < 32 the coefficient of the p-th
    // column after the reflector's (tau times its dot with the reflector), [32] beta.
    float cf[2][33];
    // Clusters: by parity of the column, every block's partial sums and then block 0's pivot row, pushed here by
    // st.async, and the mbarrier their bytes complete on.
    float xr[CLUSTER ? 2 : 1][CLUSTER ? BLOCKS + 1 : 1][32];
    unsigned long long bar[2];
  };

  Shared& sm;
  float* xch;
  unsigned* flags;
  unsigned epoch;
  int c0, mp;  // first column (and row) of the panel, rows of the panel
  int vld;     // leading dimension of V^T (rows of the aggregate's buffer)
  long long vbs;  // floats per matrix in V^T
  int t, lane, warp, b, g, row0;
  float x[SLOTS][NB];

  __device__ __forceinline__ void sync() {
    if constexpr (WARPS == 1) {
      warp_barrier();
    } else {
      block_barrier();
    }
  }

  // ONCE: warp 0's reflector for column j from the sums (lane t's in acc: its dot of the column with the t-th
  // column after it, for 0 < t < nd; sigma, the column's squared norm below its diagonal, lane 0's sum, which every
  // lane adds up itself: a shuffle inside warp 0's branch makes the compiler wrap every shuffle of the column in
  // convergence code) and the pivot row at sm.piv[j & 1][p0]; tau into sm.tau[j], the coefficients into
  // sm.cf[j & 1] (zero for p >= nd).
  __device__ __forceinline__ void reflect(const float acc, const float sigma, const int j, const int p0,
                                          const int nd) {
    const float* piv = sm.piv[j & 1];
    const Reflector f = make_reflector(piv[p0], sigma);
    float* cf = sm.cf[j & 1];
    if (t == 0) {
      sm.tau[j] = f.tau;
      cf[0] = f.scale;
      cf[32] = f.beta;
    } else {
      cf[t] = t < nd ? f.tau * fmaf(f.scale, acc, piv[p0 + t]) : 0.0f;
    }
  }

  // Column j's coefficients for the update, as every thread needs them: the reflector's scale and beta, and for
  // the q-th column after column j (0 < q < NB) f[q] = tau (v_j . that column), zero from q = nd on; from what
  // warp 0 built (ONCE), else built here from the sums and the pivot row at sm.piv[j & 1][p0] (tau stored by
  // thread 0).
  __device__ __forceinline__ void coefficients(const int j, const int p0, const int nd, float (&f)[NB], float& scale,
                                               float& beta) {
    if constexpr (ONCE) {
      const float* cf = sm.cf[j & 1];
      scale = cf[0];
      beta = cf[32];
#pragma unroll
      for (int q = 1; q < NB; ++q) f[q] = cf[q];
    } else {
      const float* tot = sm.tot[j & 1];
      const float* piv = sm.piv[j & 1];
      const Reflector r = make_reflector(piv[p0], tot[0]);
      if (t == 0) sm.tau[j] = r.tau;
      scale = r.scale;
      beta = r.beta;
#pragma unroll
      for (int q = 1; q < NB; ++q) f[q] = q < nd ? r.tau * fmaf(r.scale, tot[q], piv[p0 + q]) : 0.0f;
    }
  }

  // Sums NV values per thread over the block (and over the matrix's blocks) for column j; the sums land in
  // sm.tot[j & 1], and block 0's pivot row entries sm.piv[j & 1][p0 .. p0 + ND) reach the other blocks. Totals
  // and pivot row alternate by column, so a column needs no barrier at its end: a thread rewrites them for
  // column j + 2 only after the next column's first barrier, which every reader of column j's has passed.
  // ONCE with nd > 0: warp 0 also builds the reflector (reflect).
  template <int NV, int ND>
  __device__ __forceinline__ void reduce(float (&v)[32], const int j, const int p0, const int nd = 0) {
    constexpr int P = NV <= 1 ? 1 : NV <= 2 ? 2 : NV <= 4 ? 4 : NV <= 8 ? 8 : NV <= 16 ? 16 : 32;
    constexpr int SHIFT = 5 - (P == 1 ? 0 : P == 2 ? 1 : P == 4 ? 2 : P == 8 ? 3 : P == 16 ? 4 : 5);
    constexpr bool CLUSTERED = BLOCKS > 1 && CLUSTER;
    float* tot = sm.tot[j & 1];
    float* piv = sm.piv[j & 1];
    reduce_scatter<16, P>(v, lane);
    const int idx = lane >> SHIFT;
    const bool leader = (lane & ((1 << SHIFT) - 1)) == 0;
    if constexpr (WARPS == 1) {
      if (leader && idx < NV) tot[idx] = v[0];
      warp_barrier();
    } else {
      if (leader && idx < NV) sm.red[warp][idx] = v[0];
      block_barrier();
      if constexpr (ONCE) {
        if (warp == 0) {
          float acc = 0.0f;
          if (t < NV) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) acc += sm.red[w][t];
            tot[t] = acc;
          }
          if (nd > 0) {
            float sigma = 0.0f;  // lane 0's acc, added up in the same order
#pragma unroll
            for (int w = 0; w < WARPS; ++w) sigma += sm.red[w][0];
            reflect(acc, sigma, j, p0, nd);
          }
        }
        block_barrier();
      } else if constexpr (!CLUSTERED) {
        if (t < NV) {
          float acc = 0.0f;
#pragma unroll
          for (int w = 0; w < WARPS; ++w) acc += sm.red[w][t];
          tot[t] = acc;
        }
        block_barrier();
      }
    }
    if constexpr (CLUSTERED) {
      // Every block pushes its sums (block 0 also the pivot row) into every block's receive buffer for this
      // column's parity (st.async), completing the bytes on the receiver's mbarrier of that parity; one thread per
      // block arms it for the bytes of all blocks, the first warp waits and adds them up. Reuse is safe: a block
      // pushes column j + 2's values only after it has received every block's column j + 1 values, which each
      // sent after its reads of column j's buffer.
      const int par = j & 1;
      if (t == 0) mbar_arrive_expect(&sm.bar[par], 4u * (BLOCKS * NV + ND));
      if (t < NV) {
        float acc = 0.0f;
        if constexpr (WARPS == 1) {
          acc = tot[t];
        } else {
#pragma unroll
          for (int w = 0; w < WARPS; ++w) acc += sm.red[w][t];
        }
#pragma unroll
        for (int q = 0; q < BLOCKS; ++q) push_peer(&sm.xr[par][g][t], acc, &sm.bar[par], q);
      }
      if (g == 0 && t < ND) {
        const float pv = piv[p0 + t];
#pragma unroll
        for (int q = 0; q < BLOCKS; ++q) push_peer(&sm.xr[par][BLOCKS][t], pv, &sm.bar[par], q);
      }
      if (t < 32) {
        mbar_wait(&sm.bar[par], (unsigned)(j >> 1) & 1u);
        if (t < NV) {
          float acc = 0.0f;
#pragma unroll
          for (int q = 0; q < BLOCKS; ++q) acc += sm.xr[par][q][t];
          tot[t] = acc;
        }
        if (t < ND) piv[p0 + t] = sm.xr[par][BLOCKS][t];
      }
      block_barrier();
    } else if constexpr (BLOCKS > 1) {
      // Every block of the matrix publishes its partial sums (block 0 also the pivot row), arrives on the
      // matrix's flag and waits for the others; buffers alternate by column, since a block can only reach
      // column j + 2 after every block has left column j.
      float* slot = xch + ((size_t)(b * 2 + (j & 1)) * BLOCKS) * XCH;
      if (t < NV) slot[g * XCH + t] = tot[t];
      if (g == 0 && t < ND) slot[32 + t] = piv[p0 + t];
      device_fence();
      block_barrier();
      if (t == 0) {
        flag_arrive(flags + b);
        const unsigned target = epoch + (unsigned)(j + 1) * BLOCKS;
        while (flag_load(flags + b) < target) {
        }
        device_fence();
      }
      block_barrier();
      if (t < NV) {
        float acc = 0.0f;
#pragma unroll
        for (int q = 0; q < BLOCKS; ++q) acc += load_coherent(slot + q * XCH + t);
        tot[t] = acc;
      }
      if (t < ND) piv[p0 + t] = load_coherent(slot + 32 + t);
      block_barrier();
    }
  }

  // Column J: reflector and update of the later columns; also the Gram entries of reflector J - 1.
  template <int J>
  __device__ __forceinline__ void step() {
    constexpr int ND = J < NB ? NB - J : 0;  // sigma_J and the dots with columns J+1..NB-1
    constexpr int NG = TRAIL && J >= 2 ? J - 1 : 0;  // G[k][J-1] for k < J-1, needed for T only
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = row0 + s * THREADS;
      if constexpr (J < NB) {
        const float a = r > J ? x[s][J] : 0.0f;
        v[0] = fmaf(a, a, v[0]);
#pragma unroll
        for (int k = J + 1; k < NB; ++k) v[k - J] = fmaf(a, x[s][k], v[k - J]);
      }
      if constexpr (NG > 0) {
        const float vp = round_input<GRAM>(r > J - 1 ? x[s][J - 1] : (r == J - 1 ? 1.0f : 0.0f));
#pragma unroll
        for (int k = 0; k < J - 1; ++k) v[ND + k] = fmaf(vp, round_input<GRAM>(x[s][k]), v[ND + k]);
      }
    }
    if constexpr (J < NB) {
      if (g == 0 && t == J) {
#pragma unroll
        for (int k = J; k < NB; ++k) sm.piv[J & 1][k] = x[0][k];
      }
    }
    if constexpr (ND + NG > 0) {
      reduce<ND + NG, ND>(v, J, J, ND);
      if (t < NG) sm.gram[t][J - 1] = sm.tot[J & 1][ND + t];
    }
    if constexpr (J < NB) {
      float fq[NB], scale, beta;  // fq[k - J]: column k's coefficient
      coefficients(J, J, ND, fq, scale, beta);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int r = row0 + s * THREADS;
        if (r > J) {
          const float vr = x[s][J] * scale;
          x[s][J] = vr;
#pragma unroll
          for (int k = J + 1; k < NB; ++k) x[s][k] = fmaf(-fq[k - J], vr, x[s][k]);
        } else if (r == J) {
          x[s][J] = beta;
#pragma unroll
          for (int k = J + 1; k < NB; ++k) x[s][k] -= fq[k - J];
        }
      }
    }
  }

  template <int J>
  __device__ __forceinline__ void steps() {
    step<J>();
    if constexpr (J < NB) steps<J + 1>();
  }

  // LOOP: column j in a loop that is not unrolled (the code of one column serves every column). The registers
  // rotate: on entry x[s][0 .. NB-j) hold columns j .. NB-1 and x[s][NB-j .. NB) the finished columns 0 .. j-1;
  // the update writes column k + 1 into slot k and the finished column j into slot NB - 1, so after NB columns
  // x[s][k] holds column k. Only slot 0 can hold rows at or above row j (rows < NB <= THREADS). The dots cover
  // every slot: the column's tail against the later columns and, in the finished slots (TRAIL), the previous
  // reflector v_{j-1} against v_k for T's Gram entries G[k][j-1]; a last step j = NB brings those of v_{NB-1}.
  static constexpr int STEPS = NB + (TRAIL && NB >= 2 ? 1 : 0);

  __device__ __forceinline__ void column(const int j) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = row0 + s * THREADS;
      const float a = (s > 0 || r > j) ? x[s][0] : 0.0f;
      if constexpr (TRAIL) {
        // v_{j-1} is zero above row j - 1, so no entry of a v_k above its unit diagonal (k < j - 1) reaches a sum.
        const float vp = round_input<GRAM>((s > 0 || r > j - 1) ? x[s][NB - 1] : (r == j - 1 ? 1.0f : 0.0f));
#pragma unroll
        for (int p = 0; p < NB; ++p) {
          const bool active = p < NB - j;
          const float xp = x[s][p];
          if constexpr (GRAM == 0) {
            v[p] = fmaf(active ? a : vp, xp, v[p]);
          } else {
            v[p] = fmaf(active ? a : vp, active ? xp : round_input<GRAM>(xp), v[p]);
          }
        }
      } else {
        v[0] = fmaf(a, a, v[0]);
#pragma unroll
        for (int p = 1; p < NB; ++p) v[p] = fmaf(a, x[s][p], v[p]);
      }
    }
    if (g == 0 && t == j) {
#pragma unroll
      for (int p = 0; p < NB; ++p) sm.piv[j & 1][p] = x[0][p];
    }
    reduce<NB, NB>(v, j, 0, NB - j);
    if constexpr (TRAIL) {
      if (t >= NB - j && t < NB - 1) sm.gram[t - (NB - j)][j - 1] = sm.tot[j & 1][t];
      if (j == NB) return;  // the Gram entries of the last reflector only
    }
    float fk[NB], scale, beta;
    coefficients(j, 0, NB - j, fk, scale, beta);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = row0 + s * THREADS;
      const float y0 = x[s][0];
      const float vr = y0 * scale;
      if (s > 0) {
#pragma unroll
        for (int p = 1; p < NB; ++p) x[s][p - 1] = fmaf(-fk[p], vr, x[s][p]);
        x[s][NB - 1] = vr;
      } else {
        const bool below = r > j, at = r == j;
#pragma unroll
        for (int p = 1; p < NB; ++p) {
          const float xp = x[s][p];
          x[s][p - 1] = below ? fmaf(-fk[p], vr, xp) : (at ? xp - fk[p] : xp);
        }
        x[s][NB - 1] = below ? vr : (at ? beta : y0);
      }
    }
  }

  // The panel's reflectors from the rows in x (in place), tau in sm.tau and, with TRAIL, T in sm.tmat.
  __device__ __forceinline__ void factor() {
    if constexpr (BLOCKS > 1 && CLUSTER) {
      cluster_exchange_init(sm.bar, t);
    }
    if constexpr (LOOP) {
#pragma unroll 1
      for (int j = 0; j < STEPS; ++j) column(j);
    } else {
      steps<0>();
    }
    if constexpr (BLOCKS > 1 && CLUSTER) {
      cluster_sync();  // no block leaves while another reads its shared memory; G and tau complete
    } else {
      sync();  // G and tau complete
    }

    if constexpr (TRAIL) {
      // T of the compact WY form, H_0 ... H_{NB-1} = I - V T V^T (LAPACK slarft, forward, columnwise):
      // row t of T depends only on its own earlier entries and on G, so each thread builds its row alone.
      if (t < NB) {
        if constexpr (UNROLL_T) {
          t_row<NB, NB + 1>(t, &sm.gram[0][0], sm.tau, NB, static_cast<volatile float*>(&sm.tmat[t][0]));
        } else {  // the row walked in place (see UNROLL_T)
          for (int j = 0; j < t; ++j) sm.tmat[t][j] = 0.0f;
          sm.tmat[t][t] = sm.tau[t];
          for (int j = t + 1; j < NB; ++j) {
            float acc = 0.0f;
            for (int k = t; k < j; ++k) acc = fmaf(sm.tmat[t][k], sm.gram[k][j], acc);
            sm.tmat[t][j] = -sm.tau[j] * acc;
          }
        }
      }
      sync();
    }
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau,
                                      float* __restrict__ vt, float* __restrict__ zt) {
    // src is h itself, or for a one-panel schedule the caller's input, so no copy precedes the kernel.
    const float* sb = src + (size_t)b * M * N + (size_t)c0 * N + c0;
    float* hb = h + (size_t)b * M * N + (size_t)c0 * N + c0;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = row0 + s * THREADS;
#pragma unroll
      for (int k = 0; k < NB; k += VEC) {
        if (r < mp) {
          load_vec<VEC>(&x[s][k], sb + (size_t)r * N + k);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) x[s][k + e] = 0.0f;
        }
      }
    }
    factor();
    if (g == 0 && t < NB) tau[(size_t)b * K + c0 + t] = sm.tau[t];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = row0 + s * THREADS;
      if (r < mp) {
#pragma unroll
        for (int k = 0; k < NB; k += VEC) store_vec<VEC>(hb + (size_t)r * N + k, &x[s][k]);
        if constexpr (TRAIL) {
          // V^T and (V T)^T for the trailing update, one coalesced row of each per column.
          float vr[NB];
#pragma unroll
          for (int k = 0; k < NB; ++k) {
            vr[k] = r > k ? x[s][k] : (r == k ? 1.0f : 0.0f);
            vt[(size_t)b * vbs + (size_t)k * vld + r] = vr[k];
          }
#pragma unroll
          for (int i = 0; i < NB; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k <= i; ++k) acc = fmaf(vr[k], sm.tmat[k][i], acc);
            zt[((size_t)b * NB + i) * mp + r] = acc;
          }
        }
      }
    }
  }
};

template <int M, int N, int K, int SLOTS, int NB, int THREADS, int BLOCKS, int VEC, int GRAM, bool TRAIL,
          bool CLUSTER, bool LOOP>
__device__ __forceinline__ void panel_rows(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau, float* __restrict__ vt,
                                           float* __restrict__ zt, float* __restrict__ xch,
                                           unsigned* __restrict__ flags, unsigned epoch, int c0, int mp, int vld,
                                           long long vbs) {
  using P = RowsPanel<M, N, K, SLOTS, NB, THREADS, BLOCKS, VEC, GRAM, TRAIL, CLUSTER, LOOP>;
  QR_SHARED_VAR(sm, typename P::Shared);
  const int t = threadIdx.x;
  const int b = blockIdx.x / BLOCKS;
  const int g = blockIdx.x - b * BLOCKS;
  P panel{sm, xch, flags, epoch, c0, mp, vld, vbs, t, t & 31, t >> 5, b, g, g * P::RB + t};
  panel.run(src, h, tau, vt, zt);
}
