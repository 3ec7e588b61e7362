// Panel QR with the panel's columns over the lanes ("lanes"): lane c of every warp owns column c, warp w owns
// rows [w*SLOTS, (w+1)*SLOTS) of the panel, so each thread holds SLOTS entries of one column in registers.
// Column j: lane j's entries are broadcast to the warp (shuffles with no dependence between them), every lane
// forms the dot of that column's tail with its own column (for lane j that is the squared norm); on one block
// warp 0 adds the warps' partial dots through shared memory and builds the reflector and every lane's
// coefficients once (two barriers, buffers alternating by column); on a cluster (or one warp) every lane builds
// the same reflector from the exchanged sums. Each lane then updates its own column, one FMA a row with
// coefficient 0 in lane j and left of it: lane j's column keeps its entries below the diagonal unscaled until
// the loop over columns ends (the reflector's scale kept in `own`: a multiply and a select a row less in every
// column). Lanes left of j get the Gram entries of the reflectors for free from the same dots (times their own
// scale). The loop over columns is not unrolled (the code stays small; registers are indexed by the unrolled row
// slots only), except on one warp and one block (UNROLL): there every row is a constant, so with the columns
// unrolled too the masks fold away and rows above column j take no shuffle, and the reflector is built with
// selects, not branches (make_reflector<true>). With CLUSTER the BLOCKS blocks of one thread-block cluster share
// the rows (block g owns rows [g*WARPS*SLOTS, (g+1)*WARPS*SLOTS)): after the block's barrier warp 0 pushes the
// block's sums (and, in the block holding row j, the pivot row) into every block's shared memory by st.async (the
// blocks' addresses mapped once, before the loop), and every warp waits on its block's mbarrier and adds the
// blocks' sums. With FORMQ (one panel, one block, nothing right of it: qr's reduced mode) the kernel writes R
// (NB x NB, zero below the diagonal) where h is given and Q (M x NB) where zt is given, Q = I - V T V1^T (V1 the
// top NB rows of V), instead of h and tau; on one warp (BACKWARD_Q) Q's columns come from the reflectors applied
// to the identity's, last to first, each lane its own column, with no G or T. With PACK > 1 (one warp, at most 16
// columns, nothing right of the panel) the warp holds PACK matrices, one to each segment of SEG = 32 / PACK lanes:
// lane c of a segment owns column c of its matrix and every shuffle stays inside the segment, so the lanes past NB
// that a narrow panel leaves idle factor other matrices; a segment past the batch's last matrix loads zeros and
// stores nothing. The alternatives measured and not taken are in BENCHMARKS.md.
template <int M, int N, int K, int SLOTS, int NB, int THREADS, bool TRAIL, int BLOCKS, bool CLUSTER, bool FORMQ,
          int PACK>
struct LanesPanel {
  static constexpr int WARPS = THREADS / 32;
  static constexpr int RB = WARPS * SLOTS;  // rows per block
  // The mask-free branch below pays only where most warps lie wholly below most columns: with more rows than
  // columns (measured: BENCHMARKS.md).
  static constexpr bool MASK_FREE = BLOCKS * RB > NB;
  static_assert(NB <= 32, "a lanes panel is at most 32 columns wide");
  static_assert(BLOCKS == 1 || CLUSTER, "the blocks of a lanes panel form a cluster");
  static_assert(!FORMQ || (BLOCKS == 1 && !TRAIL && NB == N && N == K), "Q is formed by one-panel, one-block kernels");
  static constexpr bool UNROLL = WARPS == 1 && BLOCKS == 1;  // row0 is 0: the loops over columns unrolled
  static constexpr int COLUMN_UNROLL = UNROLL ? NB : 1;
  // T from G is needed: for the trailing update, and for Q (FORMQ) except on one warp, which applies the
  // reflectors to the identity's columns backwards instead (each lane its own column: no G, no T, no barrier).
  static constexpr bool GRAM = TRAIL || (FORMQ && !UNROLL);
  static constexpr bool BACKWARD_Q = FORMQ && UNROLL;
  static constexpr int SEG = 32 / PACK;  // lanes per matrix
  static_assert(PACK == 1 || (UNROLL && !GRAM && NB <= SEG && SEG * PACK == 32), "packed: one warp, narrow, no G");

  struct Shared {
    float red[2][WARPS][32];
    float piv[2][32];
    // One block of several warps: by parity of the column, each lane's update coefficients (ws, the entry in row
    // j, the reflector's scale) as warp 0 computed them from the block's sums.
    float cf[2][3][32];
    float gram[NB][NB + 1];
    float tmat[NB][NB + 1];
    float tau[PACK][NB];  // by segment
    float vtop[FORMQ ? NB : 1][NB + 1];  // FORMQ: V's top NB rows (unit lower triangular)
    // Clusters: by parity of the column, every block's sums and then the pivot row, pushed here by st.async, and
    // the mbarrier their bytes complete on.
    float xr[CLUSTER ? 2 : 1][CLUSTER ? BLOCKS + 1 : 1][32];
    unsigned long long bar[2];
  };

  Shared& sm;
  int c0, mp, vld;
  long long vbs;
  int t, lane, warp, b, g, row0;
  int seg, col;  // this lane's segment (PACK > 1; else 0) and column (lane - seg * SEG)
  bool live;  // its matrix is one of the batch's (a packed warp's last segments may lie past it)
  float x[SLOTS];
  float taus[BACKWARD_Q ? NB : 1];  // every reflector's tau, in every lane
  // This lane's reflector scale: its column below the diagonal stays unscaled until the loop over columns ends
  // (the update of a finished column is then one FMA with coefficient 0, not a multiply and a select).
  float own = 1.0f;
  unsigned peer[CLUSTER ? BLOCKS : 1];  // CLUSTER: this block's shared memory as seen from each block of the cluster

  __device__ __forceinline__ void sync() {
    if constexpr (WARPS == 1) {
      warp_barrier();
    } else {
      block_barrier();
    }
  }

  // v of column j's lane (of this lane's segment; unpacked, the whole warp).
  __device__ __forceinline__ float bcast(float v, int j) { return segment_shuffle<SEG>(v, j); }

  // Column j (UNROLL: a constant).
  __device__ __forceinline__ void column(int j) {
    float v[SLOTS];
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float pv = 0.0f;  // this lane's entry in row j (held by the warp that owns row j)
    // A warp whose rows are all below row j (all but the first few, since j < 32) takes the branch without the
    // per-slot masks; the branch is uniform over the warp.
    // (The shuffles stay outside the branch: inside one the compiler wraps them in convergence code.)
    if constexpr (UNROLL) {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s > j) {
          v[s] = bcast(x[s], j);
          p[s & 3] = fmaf(v[s], x[s], p[s & 3]);
        } else {
          v[s] = 0.0f;
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) v[s] = warp_shuffle(x[s], j);
    }
    const bool below_all = MASK_FREE && row0 > j;
    if constexpr (UNROLL) {
      if (j < SLOTS) pv = x[j];
    } else if (below_all) {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) p[s & 3] = fmaf(v[s], x[s], p[s & 3]);
    } else {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int r = row0 + s;
        v[s] = r > j ? v[s] : 0.0f;
        p[s & 3] = fmaf(v[s], x[s], p[s & 3]);
        if (r == j) pv = x[s];
      }
    }
    float tot = (p[0] + p[1]) + (p[2] + p[3]);
    if constexpr (CLUSTER) {
      // Warp 0 of every block pushes the block's sums (and the block holding row j its pivot row) into every
      // block's receive buffer for this column's parity (st.async, completing on that block's mbarrier); every
      // warp waits on its block's mbarrier and adds the blocks' sums itself. Reuse is safe: a block pushes column
      // j + 2's values only after receiving every block's column j + 1 values, which each pushed after its
      // column j + 1 barrier, so after all its warps' reads of column j's buffer.
      const int buf = j & 1;
      sm.red[buf][warp][lane] = tot;
      if (j >= row0 && j < row0 + SLOTS) sm.piv[buf][lane] = pv;
      block_barrier();
      if (t == 0) mbar_arrive_expect(&sm.bar[buf], 4u * 32u * (BLOCKS + 1));
      if (warp == 0) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sum += sm.red[buf][w][lane];
#pragma unroll
        for (int q = 0; q < BLOCKS; ++q) push_peer_at(peer[q], &sm, &sm.xr[buf][g][lane], sum, &sm.bar[buf]);
        if (j / RB == g) {  // the block holding row j (a panel is never wider than its rows, so one does)
          const float p0 = sm.piv[buf][lane];
#pragma unroll
          for (int q = 0; q < BLOCKS; ++q) push_peer_at(peer[q], &sm, &sm.xr[buf][BLOCKS][lane], p0, &sm.bar[buf]);
        }
      }
      mbar_wait(&sm.bar[buf], (unsigned)(j >> 1) & 1u);
      tot = 0.0f;
#pragma unroll
      for (int q = 0; q < BLOCKS; ++q) tot += sm.xr[buf][q][lane];
      pv = sm.xr[buf][BLOCKS][lane];
    }
    const bool me = col == j;
    const bool right = col > j && col < NB;
    float ws, at;  // w times the reflector's scale (w = (v_j . column) tau); the entry in row j
    if constexpr (!CLUSTER && WARPS > 1) {
      // Warp 0 adds the warps' partial dots once (every warp adding all WARPS of them takes WARPS^2 shared loads
      // a column) and builds the reflector and every lane's coefficients, behind a second barrier; the other warps
      // read three numbers instead of each building the same reflector (its square root, division and branches:
      // about a third of a warp's instructions a column, and the SM's issue slots are what the block's warps
      // share). cf[buf] is rewritten for column j + 2 only after column j + 2's first barrier, which every reader
      // of column j's has passed.
      const int buf = j & 1;
      sm.red[buf][warp][lane] = tot;
      if (j >= row0 && j < row0 + SLOTS) sm.piv[buf][lane] = pv;
      block_barrier();
      if (warp == 0) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sum += sm.red[buf][w][lane];
        const float p0 = sm.piv[buf][lane];
        // Lane j's sum and pivot entry, read and added up by every lane in the same order rather than shuffled
        // from lane j: a shuffle inside warp 0's branch makes the compiler wrap the column's other shuffles in
        // convergence code.
        float sigma = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sigma += sm.red[buf][w][j];
        const Reflector f = make_reflector(sm.piv[buf][j], sigma);
        const float d = fmaf(f.scale, sum, p0);  // v_j . column for lanes right of j; G[lane][j] / own for lanes left
        if constexpr (GRAM) {
          if (lane < j) sm.gram[lane][j] = d * own;
        }
        if (lane == 0) sm.tau[0][j] = f.tau;
        const float w = right ? f.tau * d : 0.0f;
        sm.cf[buf][0][lane] = w * f.scale;
        sm.cf[buf][1][lane] = me ? f.beta : (right ? p0 - w : 0.0f);
        sm.cf[buf][2][lane] = f.scale;
      }
      block_barrier();
      ws = sm.cf[buf][0][lane];
      at = sm.cf[buf][1][lane];
      if (me) own = sm.cf[buf][2][lane];
    } else {
      const float sigma = bcast(tot, j);
      const float alpha = bcast(pv, j);
      const Reflector f = make_reflector<UNROLL>(alpha, sigma);
      if constexpr (GRAM) {
        // G[c][j] = v_c . v_j for c < j: v_j is 1 in row j and scale * (column j) below it, where column c holds
        // v_c, still unscaled below row c: times its own scale.
        if (warp == 0 && col < j) sm.gram[col][j] = fmaf(f.scale, tot, pv) * own;
      }
      if (t == seg * SEG) sm.tau[seg][j] = f.tau;
      if constexpr (BACKWARD_Q) taus[j] = f.tau;
      if (me) own = f.scale;
      const float w = right ? f.tau * fmaf(f.scale, tot, pv) : 0.0f;
      ws = w * f.scale;
      at = me ? f.beta : (right ? pv - w : 0.0f);
    }
    // Selects, not branches: every slot's three cases (below, at, above row j) in straight-line code.
    if constexpr (UNROLL) {
      // Column j's entries below row j stay unscaled until the loop ends (its scale kept in `own`), so every slot
      // below row j is one FMA (ws is 0 in lane j).
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s > j) {
          x[s] = fmaf(-ws, v[s], x[s]);
        } else if (s == j) {
          x[s] = (me || right) ? at : x[s];
        }
      }
    } else if (below_all) {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) x[s] = fmaf(-ws, v[s], x[s]);  // ws is 0 in lane j and left of it
    } else {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int r = row0 + s;
        const float below = fmaf(-ws, v[s], x[s]);
        const float here = (me || right) ? at : x[s];
        x[s] = r > j ? below : (r == j ? here : x[s]);
      }
    }
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau,
                                      float* __restrict__ vt, float* __restrict__ zt) {
    // src is h itself, or for a one-panel schedule the caller's input, so no copy precedes the kernel.
    const float* sb = src + (size_t)b * M * N + (size_t)c0 * N + c0 + col;
    float* hb = h + (size_t)b * M * N + (size_t)c0 * N + c0 + col;
    const bool mine = live && col < NB;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = row0 + s;
      x[s] = (mine && r < mp) ? sb[(size_t)r * N] : 0.0f;
    }
    if constexpr (CLUSTER) {
      cluster_exchange_init(sm.bar, t);
#pragma unroll
      for (int q = 0; q < BLOCKS; ++q) peer[q] = peer_address(&sm, q);
    }
    if constexpr (UNROLL) {
#pragma unroll COLUMN_UNROLL
      for (int j = 0; j < NB; ++j) column(j);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) x[s] = s > col ? x[s] * own : x[s];
    } else {
#pragma unroll 1
      for (int j = 0; j < NB; ++j) column(j);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) x[s] = row0 + s > col ? x[s] * own : x[s];
    }
    if constexpr (CLUSTER) {
      cluster_sync();  // no block leaves while another reads its shared memory; tau (and G) complete
    } else {
      sync();  // tau (and G) complete
    }

    if constexpr (FORMQ) {  // R (batch, NB, NB) where h is given; no tau
      float* rb = h + (size_t)b * NB * NB + col;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int r = row0 + s;
        if (mine && r < NB) rb[(size_t)r * NB] = r <= col ? x[s] : 0.0f;
      }
      if constexpr (BACKWARD_Q) {
        // Column c of Q = H_0 ... H_{NB-1} e_c, the reflectors applied last to first: v_j (1 in row j, lane j's
        // entries below it) broadcast as the factorization broadcast column j, the dot with the lane's column local.
        float q[SLOTS];
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) q[s] = s == col ? 1.0f : 0.0f;
#pragma unroll COLUMN_UNROLL
        for (int j = NB - 1; j >= 0; --j) {
          float v[SLOTS];
          float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int s = j + 1; s < SLOTS; ++s) {
            v[s] = bcast(x[s], j);
            p[s & 3] = fmaf(v[s], q[s], p[s & 3]);
          }
          const float w = taus[j] * (q[j] + ((p[0] + p[1]) + (p[2] + p[3])));
          q[j] -= w;
#pragma unroll
          for (int s = j + 1; s < SLOTS; ++s) q[s] = fmaf(-w, v[s], q[s]);
        }
        float* qb = zt + (size_t)b * M * NB + col;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          if (mine && s < mp) qb[(size_t)s * NB] = q[s];
        }
      }
    } else {
      if (g == 0 && mine && warp == 0) tau[(size_t)b * K + c0 + col] = sm.tau[seg][col];
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int r = row0 + s;
        if (mine && r < mp) hb[(size_t)r * N] = x[s];
      }
    }
    if constexpr (GRAM) {
      // T of the compact WY form (LAPACK slarft, forward, columnwise): thread t builds row t from G alone.
      if (t < NB) {
        t_row<NB, NB + 1>(t, &sm.gram[0][0], sm.tau[0], NB, static_cast<volatile float*>(&sm.tmat[t][0]));
      }
      sync();
      // V^T (lane c writes v_c) and (V T)^T: column i of V T is sum_{k <= i} v_k T[k][i], v_k broadcast from lane k.
      float acc[SLOTS];
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int r = row0 + s;
        x[s] = r > lane ? x[s] : (r == lane ? 1.0f : 0.0f);
        acc[s] = 0.0f;
        if constexpr (FORMQ) {
          if (mine && r < NB) sm.vtop[r][lane] = x[s];
        }
      }
      if constexpr (TRAIL) {
        if (mine) store_run<SLOTS>(vt + (size_t)b * vbs + (size_t)lane * vld + row0, x, mp - row0);
      }
#pragma unroll 1
      for (int k = 0; k < NB; ++k) {
        const float tk = lane >= k && mine ? sm.tmat[k][lane] : 0.0f;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) acc[s] = fmaf(warp_shuffle(x[s], k), tk, acc[s]);
      }
      if constexpr (TRAIL) {
        if (mine) store_run<SLOTS>(zt + ((size_t)b * NB + lane) * mp + row0, acc, mp - row0);
      } else if constexpr (FORMQ) {
        // Q[r][c] = [r == c] - sum_k (V T)[r][k] V[c][k]: lane c takes (V T)[r][k] from lane k, V[c][k] (zero for
        // k > c) from shared memory.
        sync();
        float q[SLOTS];
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) q[s] = row0 + s == lane ? 1.0f : 0.0f;
#pragma unroll 1
        for (int k = 0; k < NB; ++k) {
          const float vck = mine ? sm.vtop[lane][k] : 0.0f;
#pragma unroll
          for (int s = 0; s < SLOTS; ++s) q[s] = fmaf(-warp_shuffle(acc[s], k), vck, q[s]);
        }
        float* qb = zt + (size_t)b * M * NB + lane;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const int r = row0 + s;
          if (mine && r < mp) qb[(size_t)r * NB] = q[s];
        }
      }
    }
  }
};

template <int M, int N, int K, int SLOTS, int NB, int THREADS, bool TRAIL, int BLOCKS, bool CLUSTER, bool FORMQ,
          int PACK>
__device__ __forceinline__ void panel_lanes(const float* __restrict__ src, float* __restrict__ h,
                                            float* __restrict__ tau, float* __restrict__ vt, float* __restrict__ zt,
                                            int c0, int mp, int vld, long long vbs, int nb) {
  using P = LanesPanel<M, N, K, SLOTS, NB, THREADS, TRAIL, BLOCKS, CLUSTER, FORMQ, PACK>;
  QR_SHARED_VAR(sm, typename P::Shared);
  const int t = threadIdx.x;
  const int seg = PACK == 1 ? 0 : (t & 31) / P::SEG;
  const int b = PACK == 1 ? blockIdx.x / BLOCKS : blockIdx.x * PACK + seg;
  const int g = PACK == 1 ? blockIdx.x - b * BLOCKS : 0;
  P panel{sm, c0, mp, vld, vbs, t, t & 31, t >> 5, b, g, P::UNROLL ? 0 : g * P::RB + (t >> 5) * SLOTS,
          seg, (t & 31) - seg * P::SEG, PACK == 1 || b < nb};
  panel.run(src, h, tau, vt, zt);
}
