// The "tsqr" panel, for panels of many rows and few matrices: a tree of Householder QRs over tiles of TILE rows
// (level 0 the panel's rows; each next level the stacked NB x NB R factors of the last level's tiles, up to one
// tile), each tile factored by one block as a RowsPanel, or with SLICE > 0 as a ColsPanel (warps of SLICE columns,
// reflectors through the launch's dynamic shared memory); then Q's first NB columns down the tree (a tile's Q block
// is [Y; 0] - V T V1^T Y, with Y its block of its parent's Q: products, no chain of reflectors); then Householder
// reflectors rebuilt from Q by an LU factorization with signs, Q - [S; 0] = V U, whose pivots have magnitude at
// least 1 (Ballard et al., "Reconstructing Householder vectors from tall-skinny QR", 2014): V unit lower
// trapezoidal, T = -U S V1^-T, tau = diag(T), R = S R_root. Every step is correct for any input (zero columns give
// orthonormal Q columns too). One kernel, launched once per phase (qrgen/run/cuda_engine.py): factor each level bottom-up,
// expand levels NLEV-1 .. 1, then the final phase (level 0's Q blocks, the LU, V, h, tau, V^T and (VT)^T).
// The work buffer ts holds per matrix the stacks S_l (l >= 1; S_NLEV is the root's R), each level's tau and T,
// and level 0's first tile's top rows (V1), at offsets plan/tsqr.tsqr_layout gives.
template <int M, int N, int K, int NB, int THREADS, int SLOTS, int VEC, bool TRAIL, bool LOOP, int SLICE, bool STREAM>
struct TsqrPanel {
  static constexpr int TILE = SLOTS * THREADS;
  static_assert(SLICE == 0 || THREADS == 32 * cdiv(NB, SLICE), "a cols tile factorization takes a warp a slice");
  // The small matrices in shared memory: rows padded to a multiple of 4 floats plus 4 (16-byte aligned, and
  // a column walk meets no bank twice in a row), read along rows by loads of SV floats.
  static constexpr int SV = NB % 4 == 0 ? 4 : (NB % 2 == 0 ? 2 : 1);
  static constexpr int PITCH = (NB + 3) / 4 * 4 + 4;
  static constexpr int LV = VEC <= SV ? VEC : SV;  // floats per global load: the panel's and the stacks' rows
  using P = RowsPanel<1, 1, 1, SLOTS, NB, THREADS, 1, 1, 0, true, false, LOOP>;

  struct Shared {
    typename P::Shared panel;
    alignas(16) float y[NB][PITCH];  // Y (the tile's block of its parent's Q), then Q's top block, then its LU
    alignas(16) float v1[NB][PITCH];  // V1: a tile's top NB rows of V (unit lower)
    alignas(16) float t[NB][PITCH];  // T of the tile, then T of the panel (final)
    alignas(16) float m1[NB][PITCH];  // V1^T Y
    alignas(16) float m[NB][PITCH];  // T V1^T Y
    float sgn[NB];
    float inv[NB];  // 1 / U[c][c]
  };

  Shared& sm;
  P& p;
  int t, b;

  // acc[c] += a * row[c] for FROM <= c < NB, row in shared memory (16-byte aligned), by loads of SV floats.
  template <int FROM>
  static __device__ __forceinline__ void axpy(float (&acc)[NB], const float a, const float* row) {
#pragma unroll
    for (int j = FROM / SV * SV; j < NB; j += SV) {
      float r[SV];
      load_vec<SV>(r, row + j);
#pragma unroll
      for (int e = 0; e < SV; ++e) {
        if (j + e >= FROM) acc[j + e] = fmaf(a, r[e], acc[j + e]);
      }
    }
  }

  // Rows [first, first + TILE) of `in` (rows x NB, ld floats apart; zeros past `rows`) into x.
  __device__ __forceinline__ void load(const float* in, const int ld, const int rows, const int first) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = first + t + s * THREADS;
#pragma unroll
      for (int k = 0; k < NB; k += LV) {
        if (r < rows) {
          load_vec<LV>(&p.x[s][k], in + (size_t)r * ld + k);
        } else {
#pragma unroll
          for (int e = 0; e < LV; ++e) p.x[s][k + e] = 0.0f;
        }
      }
    }
  }

  __device__ __forceinline__ void store(float* out, const int ld, const int rows, const int first) {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = first + t + s * THREADS;
      if (r < rows) {
#pragma unroll
        for (int k = 0; k < NB; k += LV) store_vec<LV>(out + (size_t)r * ld + k, &p.x[s][k]);
      }
    }
  }

  // A level's tile: its reflectors in place, its tau and T, its R (upper, zeros below) into the next stack, and
  // for level 0's first tile its top rows into v1 too. dyn: the cols factorization's shared memory (SLICE > 0).
  __device__ __forceinline__ void factor(const float* in, float* io, const int ld, const int rows,
                                         float* __restrict__ tau_out, float* __restrict__ t_out,
                                         float* __restrict__ r_out, float* __restrict__ v1_out, float* dyn) {
    const int tile = blockIdx.x;
    if constexpr (SLICE > 0) {
      factor_cols(in, io, ld, rows, tau_out, t_out, r_out, v1_out, dyn);
      return;
    }
    load(in, ld, rows, tile * TILE);
    p.factor();
    store(io, ld, rows, tile * TILE);
    if (t < NB) {
      tau_out[tile * NB + t] = sm.panel.tau[t];
#pragma unroll
      for (int k = 0; k < NB; ++k) {
        t_out[((size_t)tile * NB + t) * NB + k] = k >= t ? sm.panel.tmat[t][k] : 0.0f;
        r_out[((size_t)tile * NB + t) * NB + k] = k >= t ? p.x[0][k] : 0.0f;
        if (v1_out != nullptr) v1_out[t * NB + k] = p.x[0][k];  // level 0's first tile only
      }
    }
  }

  // factor's outputs from a ColsPanel: warp w holds columns [w SLICE, w SLICE + SLICE) of the tile's rows, lane l
  // rows l, l + 32, ...; G and T from the reflectors in shared memory (ColsPanel's layout, AT_*, with G and T).
  __device__ __forceinline__ void factor_cols(const float* in, float* io, const int ld, const int rows,
                                              float* __restrict__ tau_out, float* __restrict__ t_out,
                                              float* __restrict__ r_out, float* __restrict__ v1_out, float* dyn) {
    using C = ColsPanel<TILE, NB, NB, TILE / 32, NB, SLICE, (SLICE < LV ? SLICE : LV), 0, true, true, 1, STREAM,
                        false, false>;
    const int tile = blockIdx.x, first = tile * TILE, lane = t & 31, warp = t >> 5;
    float* taus = dyn + C::AT_TAUS;
    float* gram = dyn + C::AT_GRAM;
    float* tmat = dyn + C::AT_TMAT;
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(dyn + C::AT_BARS);
    if (t < NB) mbar_init(bars + t, 32);
    block_barrier();
    C c{dyn, taus, gram, tmat, bars, 0, min(TILE, rows - first), 0, lane, warp, 0, 0, {}, 0};
    const size_t at = (size_t)first * ld + warp * SLICE;
    const int own = min(SLICE, NB - warp * SLICE);  // the last warp's columns may be fewer
    c.load(in + at, ld, own);
    c.factor(own, nullptr, io + at, ld);
    c.template prepare_t<2>();  // G's loads not all in flight: registers for the rows phases' blocks per SM
    if (t < NB) {
      tau_out[tile * NB + t] = taus[t];
#pragma unroll
      for (int k = 0; k < NB; ++k) t_out[((size_t)tile * NB + t) * NB + k] = k >= t ? tmat[t * (NB + 1) + k] : 0.0f;
    }
    if (lane < NB) {  // R's row `lane` (and V1's) in slot 0 of each warp's columns
#pragma unroll
      for (int k = 0; k < SLICE; ++k) {
        const int col = warp * SLICE + k;
        if (k < own) {
          r_out[((size_t)tile * NB + lane) * NB + col] = col >= lane ? c.x[0][k] : 0.0f;
          if (v1_out != nullptr) v1_out[lane * NB + col] = c.x[0][k];  // level 0's first tile only
        }
      }
    }
  }

  // sm.m = T (V1^T Y) from Y, V1 and T in shared memory (sm.m1 holds V1^T Y on the way).
  __device__ __forceinline__ void wy_block() {
    small<true>(sm.m1, sm.v1, sm.y, 1.0f, false);
    block_barrier();
    small<false>(sm.m, sm.t, sm.m1, 1.0f, false);
    block_barrier();
  }

  // Q = [Y; 0] - V (T (V1^T Y)) for the rows in x (V as factor left it: R on and above the diagonal), with Y in
  // sm.y, V1 in sm.v1 and T in sm.t; Q replaces x.
  __device__ __forceinline__ void products(const int first) {
    wy_block();
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = first + t + s * THREADS;  // the row within the tile
      float v[NB], q[NB];
#pragma unroll
      for (int k = 0; k < NB; ++k) {
        v[k] = r > k ? p.x[s][k] : (r == k ? 1.0f : 0.0f);
        q[k] = r < NB ? sm.y[r < NB ? r : 0][k] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < NB; ++k) axpy<0>(q, -v[k], &sm.m[k][0]);
#pragma unroll
      for (int j = 0; j < NB; ++j) p.x[s][j] = q[j];
    }
  }

  // out = (accumulate ? out : 0) + sign op(a) b over NB x NB blocks in shared memory, op(a) = a^T where TRANS; the
  // entries spread over the block, each a full-length sum (the triangles' zeros included) in four chains.
  template <bool TRANS>
  __device__ __forceinline__ void small(float (*out)[PITCH], const float (*a)[PITCH], const float (*bm)[PITCH],
                                       const float sign, const bool accumulate) {
#pragma unroll
    for (int u = 0; u < (NB * NB + THREADS - 1) / THREADS; ++u) {
      const int e = t + u * THREADS;
      if (e < NB * NB) {
        const int i = e / NB, j = e - i * NB;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < NB; ++k) acc[k & 3] = fmaf(TRANS ? a[k][i] : a[i][k], bm[k][j], acc[k & 3]);
        const float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        out[i][j] = accumulate ? fmaf(sign, sum, out[i][j]) : sign * sum;
      }
    }
  }

  // v <- v U^-1 (U in sm.y on and above the diagonal, 1 / U[c][c] in sm.inv): v[l] is final before row l of U
  // is taken off the later entries.
  template <int L>
  __device__ __forceinline__ void solve(float (&v)[NB]) {
    if constexpr (L < NB) {
      v[L] *= sm.inv[L];
      axpy<L + 1>(v, -v[L], &sm.y[L][0]);
      solve<L + 1>(v);
    }
  }

  // acc <- acc V1^-T: acc[j] -= L[j][l] acc[l] for l < j, column l of L (V1 below its unit diagonal) being row l
  // of sm.m1 past its diagonal.
  template <int L>
  __device__ __forceinline__ void lsolve(float (&acc)[NB]) {
    if constexpr (L < NB) {
      axpy<L + 1>(acc, -acc[L], &sm.m1[L][0]);
      lsolve<L + 1>(acc);
    }
  }

  // z += v T over T's rows from K (T upper triangular in sm.t).
  template <int K0>
  __device__ __forceinline__ void wy(float (&z)[NB], const float (&v)[NB]) {
    if constexpr (K0 < NB) {
      axpy<K0>(z, v[K0], &sm.t[K0][0]);
      wy<K0 + 1>(z, v);
    }
  }

  // Y (the identity at the root), T and V1 of tile `tile` into shared memory; V1 from x (the tile's own rows) or
  // from v1_in.
  __device__ __forceinline__ void operands(const float* __restrict__ y_in, const float* __restrict__ t_in,
                                           const float* __restrict__ v1_in, const int tile) {
    for (int e = t; e < NB * NB; e += THREADS) {
      const int i = e / NB, j = e - i * NB;
      sm.y[i][j] = y_in == nullptr ? (i == j ? 1.0f : 0.0f) : y_in[((size_t)tile * NB + i) * NB + j];
      sm.t[i][j] = t_in[((size_t)tile * NB + i) * NB + j];
      if (v1_in != nullptr) sm.v1[i][j] = i > j ? v1_in[i * NB + j] : (i == j ? 1.0f : 0.0f);
    }
    if (v1_in == nullptr && t < NB) {
#pragma unroll
      for (int k = 0; k < NB; ++k) sm.v1[t][k] = t > k ? p.x[0][k] : (t == k ? 1.0f : 0.0f);
    }
    block_barrier();
  }

  // Level l > 0 of the way down: the tile's Q block in place of its V.
  __device__ __forceinline__ void expand(float* io, const int rows, const float* __restrict__ y_in,
                                         const float* __restrict__ t_in) {
    const int tile = blockIdx.x;
    load(io, NB, rows, tile * TILE);
    operands(y_in, t_in, nullptr, tile);
    products(0);
    store(io, NB, rows, tile * TILE);
  }

  // Level 0's Q block of this tile, then the reflectors rebuilt from Q: h, tau, V^T and (VT)^T of the panel.
  __device__ __forceinline__ void finish(float* hp, const int rows,
                                        const float* __restrict__ y_in, const float* __restrict__ t_in,
                                        const float* __restrict__ v1_in, const float* __restrict__ r_root,
                                        float* __restrict__ tau, float* __restrict__ vt, float* __restrict__ zt,
                                        const int c0, const int vld, const long long vbs) {
    const int tile = blockIdx.x;
    load(hp, N, rows, tile * TILE);
    operands(y_in, t_in, nullptr, tile);
    products(0);
    block_barrier();
    // Q's top block (level 0's first tile), computed by every block: [Y0; 0] - V1 T V1^T Y0 over its top rows.
    operands(y_in, t_in, v1_in, 0);
    wy_block();
    small<false>(sm.y, sm.v1, sm.m, -1.0f, true);  // each entry read and written by one thread
    block_barrier();
    {
      // LU with signs of Q's top block, one column per lane: lane c ends with U[i][c] (i <= c), L[i][c] (i > c).
      // Every warp computes it (warp 0 keeps it): no branch around the shuffles, which the compiler otherwise
      // wraps in convergence loops (WARPSYNC / ENDCOLLECTIVE per shuffle); the lanes' roles are selects.
      const int lane = t & 31;
      float col[NB], sg[NB], rc[NB];
#pragma unroll
      for (int i = 0; i < NB; ++i) col[i] = lane < NB ? sm.y[i][lane] : 0.0f;
#pragma unroll
      for (int k = 0; k < NB; ++k) {
        const float d = warp_shuffle(col[k], k);
        sg[k] = d >= 0.0f ? -1.0f : 1.0f;
        const float ukk = d - sg[k];  // |ukk| >= 1
        rc[k] = __fdividef(1.0f, ukk);
#pragma unroll
        for (int i = k + 1; i < NB; ++i) {
          const float li = warp_shuffle(col[i], k) * rc[k];
          col[i] = lane == k ? li : (lane > k ? fmaf(-li, col[k], col[i]) : col[i]);
        }
        col[k] = lane == k ? ukk : col[k];
      }
      block_barrier();  // every warp has read sm.y
      if (t < NB) {
#pragma unroll
        for (int i = 0; i < NB; ++i) {
          sm.y[i][t] = col[i];
          sm.m1[t][i] = col[i];  // transposed: row l of m1 holds L's column l below the diagonal
        }
      }
      if (t == 0) {
#pragma unroll
        for (int k = 0; k < NB; ++k) {
          sm.sgn[k] = sg[k];
          sm.inv[k] = rc[k];
        }
      }
    }
    block_barrier();
    if (tile == 0 && t < NB) tau[(size_t)b * K + c0 + t] = -sm.y[t][t] * sm.sgn[t];
    if constexpr (TRAIL) {
      // T = -U S V1^-T, row i by thread i: V1 T[i, :]^T = -(U S)[i, :]^T, forward over j (zero left of i).
      if (t < NB) {
        float acc[NB];
#pragma unroll
        for (int j = 0; j < NB; ++j) acc[j] = j >= t ? -sm.y[t][j] * sm.sgn[j] : 0.0f;
        lsolve<0>(acc);
#pragma unroll
        for (int j = 0; j < NB; ++j) sm.t[t][j] = acc[j];
      }
      block_barrier();
    }
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = tile * TILE + t + s * THREADS;  // the panel's row
      if (r < rows) {
        float v[NB];
        if (r >= NB) {  // v U = q, row by row of U
#pragma unroll
          for (int c = 0; c < NB; ++c) v[c] = p.x[s][c];
          solve<0>(v);
#pragma unroll
          for (int c = 0; c < NB; c += VEC) store_vec<VEC>(hp + (size_t)r * N + c, &v[c]);
        } else {  // R = S R_root on and above the diagonal, V1 (L) below it
#pragma unroll
          for (int c = 0; c < NB; ++c) {
            const float l = sm.y[r][c];
            v[c] = c < r ? l : (c == r ? 1.0f : 0.0f);
            hp[(size_t)r * N + c] = c < r ? l : sm.sgn[r] * r_root[r * NB + c];
          }
        }
        if constexpr (TRAIL) {
#pragma unroll
          for (int k = 0; k < NB; ++k) vt[(size_t)b * vbs + (size_t)k * vld + r] = v[k];
          float z[NB];
#pragma unroll
          for (int i = 0; i < NB; ++i) z[i] = 0.0f;
          wy<0>(z, v);
#pragma unroll
          for (int i = 0; i < NB; ++i) zt[((size_t)b * NB + i) * rows + r] = z[i];
        }
      }
    }
  }
};
