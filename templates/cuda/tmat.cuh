// T with H_0 ... H_{A-1} = I - V T V^T for an aggregate of A <= 2 TMAT_BLOCKED_MAX reflectors, from G = V^T V
// (upper part) and tau (LAPACK slarft, forward, columnwise): T[i][j] = -tau_j sum_{i<=k<j} T[i][k] G[k][j],
// T[i][i] = tau_i. G, T: A x A row-major per matrix, gbs floats apart; one block of TMAT_THREADS threads per
// matrix, everything in shared memory (tmat_shared_bytes(A) of it). The instantiating source defines TMAT_BLOCKED_MAX, TMAT_GL (floats between
// G's rows in shared memory, whatever A), TMAT_TLD (T's) and TMAT_XLD (X's), and includes dialect.cuh,
// common.cuh (t_row) and async_copy.cuh before this.
//
// Up to TMAT_BLOCKED_MAX reflectors (tmat_diagonal): G's strictly upper part comes into shared memory first, by
// asynchronous copies all in flight at once (zero past A up to a multiple of 32). Warp w builds the 32 x 32
// diagonal block T_ww alone (t_row: lane = row, the row in registers); then, for each later block column J, the
// whole block forms X = T[0:32J, 0:32J] G[0:32J, J] and T[0:32J, J] = -X T_JJ (the recurrence by blocks), over all
// the block's threads. The longest chain of dependent steps is 32 (plus two products per block column), where one
// thread per row walks A^2/2. The block products are unrolled over whole blocks and take tiles of rows x 4
// columns per thread from 16-byte loads (tmat_product), so that the kernel is bound neither by index arithmetic
// nor by issuing shared loads.
//
// More, by halves (the first TMAT_BLOCKED_MAX reflectors and the rest): T = [[T1, T12], [0, T2]] with T1 and T2
// the halves' own T (tmat_diagonal each, from G's diagonal blocks) and T12 = -T1 G12 T2 (tmat_corner), G12 =
// G[0:TMAT_BLOCKED_MAX, TMAT_BLOCKED_MAX:A]: the slarft recurrence's columns past the first half, grouped. Both
// halves' T stay in shared memory for the corner, G's staging space takes G12 after them; a whole G (256 KiB at
// A = 256) would not fit.
#define TMAT_RT 2         // rows of a thread's tile in the halves' block products (tmat_product)
#define TMAT_RT_CORNER 4  // and in the corner's (128 rows; faster there, slower in the halves)

// out[r][c] = sign * sum_k A[r][k] B[k][c] for r < rows, c < 32, stored where c < valid (rows a multiple of RT, out
// rows ldo apart, shared or global); k from 0, or where TRI from r's own 32-row block (A zero left of its diagonal
// blocks), up to k1 (a multiple of 32). A thread takes a tile of RT rows and 4 consecutive columns (a warp RT x 4 rows
// and 32 columns): per 4 k, RT + 4 16-byte loads (A's rows and B's 16-byte aligned: LDA and LDB multiples of 4) for
// 16 RT FMAs, where one FMA a thread would take two 4-byte loads. Bounds are whole 32-blocks, unrolled.
template <int RT, int LDA, int LDB, bool TRI>
__device__ __forceinline__ void tmat_product(const float* A, const float* B, int rows, int k1, float* out, int ldo,
                                             int valid, float sign) {
  const int tiles = (rows / RT) * 8;
  for (int e = threadIdx.x; e < tiles; e += blockDim.x) {
    const int c = (e & 7) << 2, r0 = (e >> 3) * RT;
    float acc[RT][4];
#pragma unroll
    for (int i = 0; i < RT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    const float* a = A + r0 * LDA;
    const float* b = B + c;
    for (int kb = TRI ? (r0 & ~31) : 0; kb < k1; kb += 32) {
#pragma unroll
      for (int k = kb; k < kb + 32; k += 4) {
        float4 u[RT], v[4];
#pragma unroll
        for (int i = 0; i < RT; ++i) u[i] = *reinterpret_cast<const float4*>(a + i * LDA + k);
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = *reinterpret_cast<const float4*>(b + (k + q) * LDB);
#pragma unroll
        for (int i = 0; i < RT; ++i) {
          const float uk[4] = {u[i].x, u[i].y, u[i].z, u[i].w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            acc[i][0] = fmaf(uk[q], v[q].x, acc[i][0]);
            acc[i][1] = fmaf(uk[q], v[q].y, acc[i][1]);
            acc[i][2] = fmaf(uk[q], v[q].z, acc[i][2]);
            acc[i][3] = fmaf(uk[q], v[q].w, acc[i][3]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < RT; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (c + j < valid) out[(size_t)(r0 + i) * ldo + c + j] = sign * acc[i][j];
      }
    }
  }
}

// T of n <= TMAT_BLOCKED_MAX reflectors into tt (shared, rows TMAT_TLD apart, whole 32-blocks of rows: zero left of
// the diagonal and from n on) and into t (rows lda apart), from G's strictly upper part (g, rows lda apart) and
// tau (ts); gs and x are scratch for G and X. Called at an offset into an aggregate for its halves; ends with G's
// staging space free (its last reads before the final barrier).
__device__ __forceinline__ void tmat_diagonal(const float* __restrict__ g, const float* __restrict__ ts,
                                              float* __restrict__ t, int n, int lda, float* gs, float* tt, float* x) {
  const int nblk = (n + 31) >> 5;
  const int np = nblk << 5;  // n rounded up to whole blocks
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int b0 = w << 5, i = b0 + lane;
  for (int k = w; k < np; k += blockDim.x >> 5) {  // gs[k * TMAT_GL + j] = G[k][j] for k < j < np (zero from n on)
    for (int j = lane; j < np; j += 32) {
      if (k >= j) continue;
      if (j < n) {
        cp_async4(gs + k * TMAT_GL + j, g + (size_t)k * lda + j);
      } else {
        gs[k * TMAT_GL + j] = 0.0f;
      }
    }
  }
  for (int e = threadIdx.x; e < np * TMAT_TLD; e += blockDim.x) tt[e] = 0.0f;
  async_wait_all();
  block_barrier();
  if (w < nblk) {  // the diagonal block of warp w (warps past the blocks wait)
    float r[32];
    t_row<32, TMAT_GL>(lane, gs + b0 * TMAT_GL + b0, ts + b0, n - b0, r);
    if (i < n) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        if (b0 + j < n) tt[i * TMAT_TLD + b0 + j] = r[j];
    }
  }
  for (int bj = 1; bj < nblk; ++bj) {
    const int c0 = bj << 5, cw = min(32, n - c0);
    block_barrier();  // the previous block column's T (or the diagonal blocks)
    // X[r][c] = sum_{k < c0} T[r][k] G[k][c0 + c], from r's own block of k on (T is zero left of its diagonal).
    tmat_product<TMAT_RT, TMAT_TLD, TMAT_GL, true>(tt, gs + c0, c0, c0, x, TMAT_XLD, 32, 1.0f);
    block_barrier();
    // T[r][c0 + c] = -sum_{k <= c} X[r][k] T_JJ[k][c] (T_JJ is zero below its diagonal and in its rows from n on, X
    // zero in its columns from n on).
    tmat_product<TMAT_RT, TMAT_XLD, TMAT_TLD, false>(x, tt + c0 * TMAT_TLD + c0, c0, 32, tt + c0, TMAT_TLD, cw, -1.0f);
    // the next block column's first barrier orders these writes before their reads
  }
  block_barrier();
  for (int r = threadIdx.x >> 5; r < n; r += blockDim.x >> 5) {
    for (int c = lane; c < n; c += 32) t[(size_t)r * lda + c] = tt[r * TMAT_TLD + c];
  }
}

// T12 = -T1 G12 T2 of an aggregate of a > TMAT_BLOCKED_MAX reflectors (G and T at g and t, rows a apart; T1 and T2
// by tmat_diagonal in shared memory), and T's zero lower left block. G12 comes into gs (rows TMAT_GL apart, zero
// from column n2 on up to whole blocks); then, per block column J of the second half, X = G12 T2[:, J] (T2 is zero
// below its diagonal: k up to J's block) and T12[:, J] = -T1 X (T1 zero left of its diagonal: k from r's block on),
// each over all threads, each thread a row of every 32-row block (their lengths balanced).
__device__ __forceinline__ void tmat_corner(const float* __restrict__ g, float* __restrict__ t, int a, float* gs,
                                            const float* t1, const float* t2, float* x) {
  constexpr int H = TMAT_BLOCKED_MAX;
  const int n2 = a - H, np2 = (n2 + 31) & ~31;
  const int lane = threadIdx.x & 31;
  for (int r = threadIdx.x >> 5; r < H; r += blockDim.x >> 5) {
    for (int c = lane; c < np2; c += 32) {
      if (c < n2) {
        cp_async4(gs + r * TMAT_GL + c, g + (size_t)r * a + H + c);
      } else {
        gs[r * TMAT_GL + c] = 0.0f;
      }
    }
  }
  for (int r = threadIdx.x >> 5; r < n2; r += blockDim.x >> 5) {
    for (int c = lane; c < H; c += 32) t[(size_t)(H + r) * a + c] = 0.0f;
  }
  async_wait_all();
  for (int c0 = 0; c0 < n2; c0 += 32) {
    block_barrier();  // G12 (then the previous block column's reads of X)
    tmat_product<TMAT_RT_CORNER, TMAT_GL, TMAT_TLD, false>(gs, t2 + c0, H, c0 + 32, x, TMAT_XLD, 32, 1.0f);
    block_barrier();
    tmat_product<TMAT_RT_CORNER, TMAT_TLD, TMAT_XLD, true>(t1, x, H, H, t + H + c0, a, n2 - c0, -1.0f);
  }
}
