// Panel QR with the panel's columns spread over the warps (the seed's block design). Warp w owns columns
// [w*S, w*S + S): lane l keeps rows l, l + 32, ... of them in registers. Each warp first applies the reflectors
// of the warps before it, in order, as they appear (consumer; in blocks of more than 8 warps, those of a warp on
// its own scheduler once that warp is done: DEFER), then computes the reflectors of its own columns (producer) and
// publishes each to shared memory with one mbarrier per reflector, so a producer never waits for its consumers and
// no block-wide barrier is needed per column. Every reflector stays in shared memory.
// With BLOCKS > 1 the warps are spread over the blocks of one cluster (block g owns the columns of warps
// g*WARPS .. g*WARPS + WARPS - 1): a producer also pushes each reflector and its tau into every later block's
// shared memory (st.async, completing on that block's mbarrier of the reflector), so each SM issues for fewer
// warps. TRAIL: the panel writes V^T for a trailing update; WY: also (VT)^T from G = V^T V and T, for products of
// its own, prepared by the last block, which then holds every reflector. Without WY each warp writes its
// reflectors' rows of V^T after its last column, and the panel's aggregate computes T in its merge, unless TOUT: a
// panel that is its aggregate (one block) also forms G = V^T V, by S x S blocks on the warps done producing, and
// T from it, into zt, so that its aggregate's merge launches neither.

// Producers without tests for columns past the panel (ColsPanel::FULL) up to this many rows a lane (in 32s) and
// columns a warp (docs/decisions.md#cols-early).
constexpr int FULL_SLOTS = 6;
constexpr int FULL_SLICE = 4;

template <int M, int N, int K, int SLOTS, int NB, int S, int VEC, int GRAM, bool TRAIL, bool WY, int BLOCKS,
          bool STREAM, bool REUSE, bool TOUT>
struct ColsPanel {
  static constexpr int WARPS = cdiv(cdiv(NB, S), BLOCKS);  // warps per block
  static constexpr int RS = SLOTS * 32;  // floats per reflector in shared memory (rows, padded)
  static constexpr bool PREP = TRAIL && WY;  // G, T and (VT)^T in shared memory and in the last block
  // Reflectors a block holds in shared memory: all of them, or with REUSE (a cluster panel without PREP too tall for
  // that: plan/cols.reuses) only as many as a block owns: the later block first holds the earlier block's (pushed
  // in), then, once every warp of it has applied them, its own in the same slots.
  static constexpr int HELD = REUSE ? WARPS * S : NB;
  static_assert(!REUSE || (BLOCKS == 2 && !PREP), "slots are reused between two blocks, without (VT)^T to prepare");
  // The block's shared memory, in floats from its start (plan/cols.shared_bytes_of): the held reflectors, every tau,
  // G and T where PREP, then one 8-byte mbarrier per reflector.
  static constexpr int AT_TAUS = HELD * RS;
  // G in shared memory (PREP, TOUT), and T: PREP's after G, TOUT's transposed in G's lower triangle (t_out)
  static constexpr int GS = PREP || TOUT ? NB * (NB + 1) : 0, TS = PREP ? NB * (NB + 1) : 0;
  static constexpr int AT_GRAM = AT_TAUS + NB;
  static constexpr int AT_TMAT = AT_GRAM + GS;
  static constexpr int AT_BARS = AT_GRAM + GS + TS + ((NB + GS + TS) & 1);
  static constexpr int NW = cdiv(NB, S);  // warps that own columns (of every block)
  static_assert(!TOUT || (TRAIL && !WY && BLOCKS == 1 && NB % S == 0), "T of a one-block panel that is its aggregate");
  // t_join's X (rows < NB, at most NB floats apart) in the reflectors' space
  static_assert(!TOUT || NB <= RS, "t_join's X in the reflectors' space");
  // Every warp owns S columns, so no producer tests for a column past the panel: its producers are then one block
  // of code to ptxas, which schedules across their columns. That pays at few rows a lane and columns a warp; with
  // more, the blocks the tests make are faster, or the one block spills.
  static constexpr bool FULL = S <= FULL_SLICE && SLOTS <= FULL_SLOTS && NB % S == 0 && (NB / S) % BLOCKS == 0;
  static_assert(S % 2 == 0, "consumers take their columns in pairs");
  // Consumers leave the reflectors of a warp on their scheduler until it has published them all (consume_all), where
  // a scheduler holds more than two of the block's warps; with two, the consumers would fall behind the producers
  // (docs/decisions.md#cols-defer).
  static constexpr bool DEFER = WARPS > 8;

  float* vs;                  // [NB][RS] reflectors, zero above the diagonal and 1 on it
  float* taus;                // [NB]
  float* gram;                // [NB][NB + 1] (PREP, TOUT)
  float* tmat;                // [NB][NB + 1] (PREP)
  unsigned long long* bars;   // [NB]
  int c0, mp, vld, lane, warp, b, g;  // g: this block's rank in the cluster
  unsigned peer[BLOCKS];      // this block's shared memory as seen from each block of the cluster
  long long vbs;  // V^T: leading dimension vld, vbs floats per matrix
  float x[SLOTS][S];
  float sigma = 0.0f, alpha = 0.0f;  // the norm below the diagonal of the column whose turn is next, and its pivot

  // The shared memory slot of reflector c: the earlier block's (pushed in) keep their index, this block's start at 0
  // under REUSE.
  __device__ __forceinline__ int slot(int c) const { return REUSE && c >= g * WARPS * S ? c - g * WARPS * S : c; }

  // Apply reflector c (published by an earlier warp) to this warp's columns, two at a time: two sums by
  // reduce-scatter (6 shuffles) keep their temporaries in registers beside the columns. Rows above c are zero in
  // the reflector: slots below J (c >= 32 J) hold none of its rows and are skipped. STREAM (where holding the
  // reflector would pass the register cap: plan/cols.streams): every column at once, the reflector read from
  // shared memory for the sums and again, through a volatile pointer so that it is not held, for the updates.
  template <int J>
  __device__ __forceinline__ void consume(int c) {
    mbar_wait(bars + c, 0);
    const float tau = taus[c];
    if constexpr (STREAM) {
      float d[S];
#pragma unroll
      for (int k = 0; k < S; ++k) d[k] = 0.0f;
#pragma unroll
      for (int s = J; s < SLOTS; ++s) {
        const float v = vs[slot(c) * RS + s * 32 + lane];
#pragma unroll
        for (int k = 0; k < S; ++k) d[k] = fmaf(v, x[s][k], d[k]);
      }
      reduce_scatter<16, S>(d, lane);  // the sum of column k in lanes k * 32 / S .. (k + 1) * 32 / S - 1
      float e[S];
#pragma unroll
      for (int k = 0; k < S; ++k) e[k] = -warp_shuffle(d[0], k * (32 / S)) * tau;
      const volatile float* vv = vs + slot(c) * RS + lane;
#pragma unroll
      for (int s = J; s < SLOTS; ++s) {
        const float v = vv[s * 32];
#pragma unroll
        for (int k = 0; k < S; ++k) x[s][k] = fmaf(e[k], v, x[s][k]);
      }
      return;
    }
    float v[SLOTS];
#pragma unroll
    for (int s = J; s < SLOTS; ++s) v[s] = vs[slot(c) * RS + s * 32 + lane];
#pragma unroll
    for (int k0 = 0; k0 < S; k0 += 2) {
      float d[2] = {0.0f, 0.0f};
#pragma unroll
      for (int s = J; s < SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k) d[k] = fmaf(v[s], x[s][k0 + k], d[k]);
      reduce_scatter<16, 2>(d, lane);  // lanes 0-15 hold the first sum, 16-31 the second
      const float other = warp_shuffle_xor(d[0], 16);
      const bool upper = (lane & 16) != 0;
      d[1] = upper ? d[0] : other;
      d[0] = upper ? other : d[0];
#pragma unroll
      for (int s = J; s < SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k) x[s][k0 + k] = fmaf(-d[k] * tau, v[s], x[s][k0 + k]);
    }
  }

  // Reflectors 32 J .. end - 1 (end: this warp's first column), slot by slot. DEFER: the reflectors of a warp of
  // this block on this warp's scheduler (ranks that differ by a multiple of 4) wait until that warp has published its
  // last, so that a producer does not share its scheduler with consumers of its own reflectors (needed here only at
  // this warp's turn, four warps or more later). REUSE: in the later block, once every warp has applied the earlier
  // block's reflectors (the last at c + 1 == g * WARPS * S), a block barrier before any of them writes its own into
  // the same slots (warps without columns meet it in run).
  template <int J>
  __device__ __forceinline__ void consume_all(int end) {
    const int last = min(end, 32 * J + 32);
    for (int c = 32 * J; c < last; ++c) {
      if constexpr (DEFER) {
        const int q = c / S - g * WARPS;  // the warp of this block that produced reflector c, if any
        if (c % S == 0 && q >= 0 && ((q ^ warp) & 3) == 0) mbar_wait(bars + min(c + S, NB) - 1, 0);
      }
      consume<J>(c);
      if constexpr (REUSE) {
        if (g > 0 && c + 1 == g * WARPS * S) block_barrier();
      }
    }
    if constexpr (J + 1 < SLOTS) {
      if (last < end) consume_all<J + 1>(end);
    }
  }

  // Rows of slot s against panel column col: below its diagonal, or on it. Rows of a slot past the panel's width
  // are below every diagonal, so those tests cost nothing there.
  __device__ __forceinline__ static bool below(int s, int r, int col) { return 32 * s >= NB || r > col; }
  __device__ __forceinline__ static bool on(int s, int r, int col) { return 32 * s < NB && r == col; }

  // The squared norm below the diagonal of own column I (panel column col), summed over the warp, and its pivot.
  template <int I>
  __device__ __forceinline__ void column_norm(int col, float& sigma, float& alpha) const {
    float sig = 0.0f, piv = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
      const float a = below(s, r, col) ? x[s][I] : 0.0f;
      sig = fmaf(a, a, sig);
      piv = on(s, r, col) ? x[s][I] : piv;
    }
    sigma = warp_sum(sig);
    alpha = warp_shuffle(piv, col & 31);
  }

  // Reflector of own column I (panel column col) from its norm (sigma, alpha), published at once. Then the column
  // the next reflector comes from is updated and its norm reduced before this reflector reaches own columns
  // I+2..S-1, and a fence keeps ptxas from hoisting those updates ahead of the publication: the chain from one
  // reflector to the next holds two reductions, and the other updates issue while their shuffles are in flight.
  template <int I>
  __device__ __forceinline__ void produce() {
    const int col = (g * WARPS + warp) * S + I;
    if constexpr (!FULL) {
      if (col >= NB) return;
    }
    const Reflector f = make_reflector<true>(alpha, sigma);
    float v[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
      v[s] = below(s, r, col) ? x[s][I] * f.scale : (on(s, r, col) ? 1.0f : 0.0f);
      x[s][I] = below(s, r, col) ? v[s] : (on(s, r, col) ? f.beta : x[s][I]);
      vs[slot(col) * RS + r] = v[s];  // zero from row mp on, as the column there (load) and NB <= mp
    }
    if (lane == 0) taus[col] = f.tau;
    mbar_arrive_first(bars + col);
    if constexpr (BLOCKS > 1) {
#pragma unroll
      for (int p = 1; p < BLOCKS; ++p) {
        if (p <= g) continue;  // a later block keeps the reflector at its index (slot(col) == col here)
        if (lane == 0) mbar_arrive_expect_peer(peer[p], vs, bars + col, RS * 4 + 4);
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
          const int r = s * 32 + lane;
          push_peer_at(peer[p], vs, vs + col * RS + r, v[s], bars + col);
        }
        if (lane == 0) push_peer_at(peer[p], vs, taus + col, f.tau, bars + col);
      }
    }
#pragma unroll
    for (int k = I + 1; k < S; ++k) {
      float d = 0.0f;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) d = fmaf(v[s], x[s][k], d);
      d = warp_sum(d) * f.tau;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) x[s][k] = fmaf(-d, v[s], x[s][k]);
      if (k == I + 1) column_norm<(I + 1 < S ? I + 1 : I)>(col + 1, sigma, alpha);
    }
  }

  // TRAIL without WY: this warp's rows of V^T from its reflectors in shared memory, once it has published them all,
  // so that the stores and their row tests are off the column chain.
  __device__ __forceinline__ void write_vt(float* __restrict__ vt, const int own) const {
    for (int k = 0; k < own; ++k) {
      const int col = (g * WARPS + warp) * S + k;
      const float* from = vs + slot(col) * RS;
      float* to = vt + (size_t)b * vbs + (size_t)col * vld;
      for (int r = lane; r < mp; r += 32) to[r] = from[r];  // rolled: the columns are still held in registers
    }
  }

  template <int I>
  __device__ __forceinline__ void produce_all() {
    produce<I>();
    if constexpr (I + 1 < S) produce_all<I + 1>();
  }

  // This warp's columns (own of them: S, fewer in the panel's last, or none) from sb, rows ld floats apart (zeros
  // from row mp on and past own).
  __device__ __forceinline__ void load(const float* __restrict__ sb, const int ld, const int own) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
#pragma unroll
      for (int k = 0; k < S; k += VEC) {
        const bool inside = r < mp && k < own;
        if (inside) {
          load_vec<VEC>(&x[s][k], sb + (size_t)r * ld + k);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) x[s][k + e] = 0.0f;
        }
      }
    }
  }

  __device__ __forceinline__ void store(float* __restrict__ hb, const int ld, const int own) const {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
#pragma unroll
      for (int k = 0; k < S; k += VEC) {
        if (r < mp && k < own) store_vec<VEC>(hb + (size_t)r * ld + k, &x[s][k]);
      }
    }
  }

  // The factorization of the columns in x: the reflectors of the warps before this one applied as they appear,
  // then this warp's own produced and its columns stored to hb (rows ld floats apart: R on and above the diagonal,
  // V below it) before the closing barrier, while later warps still produce (docs/decisions.md#cols-store-early).
  __device__ __forceinline__ void factor(const int own, float* __restrict__ vt, float* __restrict__ hb, const int ld) {
    const int gw = g * WARPS + warp;  // this warp's rank among the panel's warps
    consume_all<0>(own > 0 ? gw * S : 0);
    if constexpr (REUSE) {
      if (g > 0 && own == 0) block_barrier();  // consume_all's barrier, for a warp that applies no reflector
    }
    column_norm<0>(gw * S, sigma, alpha);
    produce_all<0>();
    if constexpr (TRAIL && !WY) write_vt(vt, own);
    store(hb, ld, own);
    if constexpr (TOUT) gram_all();
    block_barrier();
  }

  // TOUT: G's S x S block (a, q), a <= q, from the reflectors in shared memory (rows above q's first column are zero
  // in q's), lanes over the rows; reduce-scatters of up to 32 entries leave each lane one entry of each (with fewer
  // entries than lanes, entry lane / (32 / (S * S))). Only entries k < j are stored.
  __device__ __forceinline__ void gram_block(const int a, const int q) {
    float acc[S * S];
#pragma unroll
    for (int e = 0; e < S * S; ++e) acc[e] = 0.0f;
#pragma unroll 1
    for (int s = (q * S) >> 5; s < SLOTS; ++s) {  // rolled: this code runs beside the producers' (instruction fetch)
      float u[S], v[S];
#pragma unroll
      for (int i = 0; i < S; ++i) u[i] = round_input<GRAM>(vs[(a * S + i) * RS + s * 32 + lane]);
#pragma unroll
      for (int j = 0; j < S; ++j) v[j] = round_input<GRAM>(vs[(q * S + j) * RS + s * 32 + lane]);
#pragma unroll
      for (int i = 0; i < S; ++i)
#pragma unroll
        for (int j = 0; j < S; ++j) acc[i * S + j] = fmaf(u[i], v[j], acc[i * S + j]);
    }
    // by 32 entries at most (reduce_scatter's bound)
    constexpr int NV = S * S > 32 ? 32 : S * S, H = S * S / NV;
#pragma unroll
    for (int h = 0; h < H; ++h) reduce_scatter<16, NV>(acc + h * NV, lane);
    if (lane % (32 / NV) != 0) return;
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const int e = h * NV + lane / (32 / NV), i = e / S, j = e % S;
      if (a < q || i < j) gram[(a * S + i) * (NB + 1) + q * S + j] = acc[h * NV];
    }
  }

  // TOUT: this warp's share of G, after its own columns. G's block column q can be formed once warp q has published
  // its last reflector; its blocks (a, q) go round robin to the warps done by then on q's scheduler and on the one
  // before it (q - w = 0 or 1 mod 4), which hold neither the next producer nor the one after it; the last block
  // column's to every warp.
  __device__ __forceinline__ void gram_all() {
    for (int q = warp; q < NW; ++q) {
      int count = NW, rank = warp;
      if (q + 1 < NW) {
        const int d = q - warp;
        if ((d & 3) > 1) continue;
        rank = (d >> 2) * 2 + (d & 3);
        count = 2 * ((q + 1) >> 2) + min(2, (q + 1) & 3);
      }
      if (rank > q) continue;
      mbar_wait(bars + q * S + S - 1, 0);
      for (int a = rank; a <= q; a += count) gram_block(a, q);
    }
  }

  // TOUT: T from G (LAPACK slarft, forward, columnwise) into zt (NB x NB a matrix, zero below the diagonal). T is
  // kept transposed in G's free lower triangle (T(i, k) at gram[k][i]; G holds entries k < j only). Warp q's lanes
  // form the diagonal block T_qq, a row each (t_row); then blocks are joined in pairs of doubling width,
  // T[A, B] = -T_A G[A, B] T_B, each level two products over every thread in 2 x 2 tiles (X = T_A G[A, B] through
  // V's shared memory, free once G is formed), so no warp walks T's columns alone.
  __device__ __forceinline__ float t_at(const int i, const int k) const { return gram[k * (NB + 1) + i]; }

  template <int H>
  __device__ __forceinline__ void t_join() {
    constexpr int LD = NB + 1, HP = H / 2, PAIRS = (NB + H - 1) / (2 * H), LDX = H + 1, TILES = PAIRS * HP * HP;
    float* xs = vs;  // X[i][j - b0] for i in A, j in B
    for (int u = warp * 32 + lane; u < TILES; u += WARPS * 32) {  // columns of a tile's pair fastest
      const int a0 = (u / (HP * HP)) * 2 * H, b0 = a0 + H, i = a0 + 2 * ((u / HP) % HP), j = b0 + 2 * (u % HP);
      if (j >= NB) continue;
      const float* gj = gram + j;
      const float tii = t_at(i, i);
      float x00 = tii * gj[i * LD], x01 = tii * gj[i * LD + 1], x10 = 0.0f, x11 = 0.0f;  // T(i + 1, i) = 0
#pragma unroll 4
      for (int k = i + 1; k < b0; ++k) {
        const float t0 = t_at(i, k), t1 = t_at(i + 1, k), g0 = gj[k * LD], g1 = gj[k * LD + 1];
        x00 = fmaf(t0, g0, x00);
        x01 = fmaf(t0, g1, x01);
        x10 = fmaf(t1, g0, x10);
        x11 = fmaf(t1, g1, x11);
      }
      float* x = xs + i * LDX + j - b0;
      x[0] = x00; x[1] = x01; x[LDX] = x10; x[LDX + 1] = x11;
    }
    block_barrier();
    for (int u = warp * 32 + lane; u < TILES; u += WARPS * 32) {  // rows fastest: one column range a warp
      const int a0 = (u / (HP * HP)) * 2 * H, b0 = a0 + H, j = b0 + 2 * ((u / HP) % HP), i = a0 + 2 * (u % HP);
      if (j >= NB) continue;
      const float* x = xs + i * LDX - b0;
      float y00 = 0.0f, y01 = 0.0f, y10 = 0.0f, y11 = 0.0f;
#pragma unroll 4
      for (int k = b0; k <= j; ++k) {
        const float x0 = x[k], x1 = x[LDX + k], t0 = t_at(k, j), t1 = t_at(k, j + 1);
        y00 = fmaf(x0, t0, y00);
        y01 = fmaf(x0, t1, y01);
        y10 = fmaf(x1, t0, y10);
        y11 = fmaf(x1, t1, y11);
      }
      const float tjj = t_at(j + 1, j + 1);  // T(j + 1, j) = 0
      y01 = fmaf(x[j + 1], tjj, y01);
      y11 = fmaf(x[LDX + j + 1], tjj, y11);
      float* t = gram + j * LD + i;  // transposed
      t[0] = -y00; t[1] = -y10; t[LD] = -y01; t[LD + 1] = -y11;
    }
    block_barrier();
    if constexpr (2 * H < NB) t_join<2 * H>();
  }

  __device__ __forceinline__ void t_out(float* __restrict__ zt) {
    constexpr int LD = NB + 1;
    if (warp < NW && lane < S) {
      float r[S];
      t_row<S, LD>(lane, gram + warp * S * LD + warp * S, taus + warp * S, S, r);
      float* t = gram + warp * S * LD + warp * S + lane;  // row lane of T_qq, transposed: below G's entries
#pragma unroll
      for (int j = 0; j < S; ++j) {
        if (j >= lane) t[j * LD] = r[j];
      }
    }
    block_barrier();
    if constexpr (S < NB) t_join<S>();
    float* out = zt + (size_t)b * NB * NB;
    if constexpr (NB % 4 != 0) {  // a row's entries are no whole quads: one at a time
      for (int e = warp * 32 + lane; e < NB * NB; e += WARPS * 32) {
        const int r = e / NB, c = e - r * NB;
        out[e] = c < r ? 0.0f : t_at(r, c);
      }
      return;
    }
    constexpr int QUADS = NB * NB / 4, PER = cdiv(QUADS, WARPS * 32);
#pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int e = 4 * (warp * 32 + lane + p * WARPS * 32), r = e / NB, c = e - r * NB;
      if (QUADS % (WARPS * 32) != 0 && e >= NB * NB) break;
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = c + q < r ? 0.0f : t_at(r, c + q);
      store_vec<4>(out + e, v);
    }
  }

  // G = V^T V (entries k < j) and T (PREP; in the block that holds every reflector), both in shared memory. G in
  // tiles of 4 x 8 entries a warp, lanes over the rows: each lane sums its rows' products for the tile's 32
  // entries, and one reduce-scatter (31 shuffles) leaves entry `lane` in lane `lane`. The loop over slots unrolled
  // UNROLL times (all of them by default: its loads then hoisted, at a register each).
  template <int UNROLL = SLOTS>
  __device__ __forceinline__ void prepare_t() {
    constexpr int KT = cdiv(NB, 4), JT = cdiv(NB, 8);
    for (int tile = warp; tile < KT * JT; tile += WARPS) {
      const int k0 = (tile / JT) * 4, j0 = (tile - (tile / JT) * JT) * 8;
      if (j0 + 7 <= k0) continue;  // no entry k < j
      float acc[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
#pragma unroll UNROLL
      for (int s = 0; s < SLOTS; ++s) {
        float kv[4], jv[8];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          kv[a] = k0 + a < NB ? round_input<GRAM>(vs[(k0 + a) * RS + s * 32 + lane]) : 0.0f;
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          jv[c] = j0 + c < NB ? round_input<GRAM>(vs[(j0 + c) * RS + s * 32 + lane]) : 0.0f;
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[a * 8 + c] = fmaf(kv[a], jv[c], acc[a * 8 + c]);
      }
      reduce_scatter<16, 32>(acc, lane);
      const int k = k0 + (lane >> 3), j = j0 + (lane & 7);
      if (k < j && j < NB) gram[k * (NB + 1) + j] = acc[0];
    }
    block_barrier();
    // T row by row (LAPACK slarft, forward, columnwise): row t depends only on its own entries and on G.
    const int t = warp * 32 + lane;
    if (t < NB) {
      t_row<NB, NB + 1>(t, gram, taus, NB, static_cast<volatile float*>(tmat + t * (NB + 1)));
    }
    block_barrier();
  }

  __device__ __forceinline__ void run(const float* __restrict__ src, float* __restrict__ h, float* __restrict__ tau,
                                      float* __restrict__ vt, float* __restrict__ zt) {
    const int gw = g * WARPS + warp;
    const float* sb = src + (size_t)b * M * N + (size_t)c0 * N + c0 + gw * S;
    float* hb = h + (size_t)b * M * N + (size_t)c0 * N + c0 + gw * S;
    const int own = min(S, max(0, NB - gw * S));  // columns of this warp: S, fewer in the panel's last, or none
    load(sb, N, own);
    factor(own, vt, hb, N);
    const int t = warp * 32 + lane;
    const int tc = g * WARPS * S + t;  // this block's columns' tau
    if (t < WARPS * S && tc < NB) tau[(size_t)b * K + c0 + tc] = taus[tc];
    if constexpr (TOUT) t_out(zt);

    if constexpr (PREP) {
      if (g != BLOCKS - 1) return;
      prepare_t();
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

template <int M, int N, int K, int SLOTS, int NB, int S, int VEC, int GRAM, bool TRAIL, bool WY, int BLOCKS,
          bool STREAM, bool REUSE, bool TOUT>
__device__ __forceinline__ void panel_cols(const float* __restrict__ src, float* __restrict__ h,
                                           float* __restrict__ tau, float* __restrict__ vt, float* __restrict__ zt,
                                           int c0, int mp, int vld, long long vbs) {
  using P = ColsPanel<M, N, K, SLOTS, NB, S, VEC, GRAM, TRAIL, WY, BLOCKS, STREAM, REUSE, TOUT>;
  QR_DYNAMIC_SHARED(smem);
  float* vs = smem;
  float* taus = smem + P::AT_TAUS;
  float* gram = smem + P::AT_GRAM;
  float* tmat = smem + P::AT_TMAT;
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + P::AT_BARS);
  const int t = threadIdx.x;
  const int b = blockIdx.x / BLOCKS, g = blockIdx.x - b * BLOCKS;
  // a reflector of this block: its 32 lanes arrive; of an earlier block: its push (one arrival and the bytes)
  for (int c = t; c < NB; c += P::WARPS * 32) mbar_init(bars + c, c < g * P::WARPS * S ? 1 : 32);
  P panel{vs, taus, gram, tmat, bars, c0, mp, vld, t & 31, t >> 5, b, g, {}, vbs};
  if constexpr (BLOCKS > 1) {
    for (int p = 0; p < BLOCKS; ++p) panel.peer[p] = peer_address(smem, p);
    cluster_mbarriers_ready(true);
  } else {
    block_barrier();
  }
  panel.run(src, h, tau, vt, zt);
}
