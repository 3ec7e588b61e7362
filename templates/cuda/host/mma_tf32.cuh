// Feature "mma tf32" on the CPU layer: mma.sync.m16n8k8's product from the warp's fragments, gathered by exchanges
// (every lane of the warp takes part, as in the instruction). Fragments of the row.col layout, with g = lane / 4 and
// c = lane % 4: A (16 x 8) a0 (g, c), a1 (g + 8, c), a2 (g, c + 4), a3 (g + 8, c + 4); B (8 x 8) b0 (c, g), b1
// (c + 4, g); D (16 x 8) d0 (g, 2c), d1 (g, 2c + 1), d2 (g + 8, 2c), d3 (g + 8, 2c + 1). Inputs are used as tf32
// (their 13 low mantissa bits ignored, as the hardware does); each output is a sum in fp32 FMAs in k order (the
// tensor cores' sum rounds otherwise: the tests' tolerances are the gates').
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  float A[16][8], B[8][8];
  for (int i = 0; i < 4; ++i) {
    const float* all = qrl::exchange_all(__uint_as_float(a[i] & 0xffffe000u));
    for (int l = 0; l < 32; ++l) A[(l >> 2) + 8 * (i & 1)][(l & 3) + 4 * (i >> 1)] = all[l];
  }
  for (int i = 0; i < 2; ++i) {
    const float* all = qrl::exchange_all(__uint_as_float(b[i] & 0xffffe000u));
    for (int l = 0; l < 32; ++l) B[(l & 3) + 4 * i][l >> 2] = all[l];
  }
  const int lane = qrl::G->current & 31, g = lane >> 2, c = lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * c + (i & 1);
    float s = d[i];
    for (int k = 0; k < 8; ++k) s = std::fma(A[row][k], B[k][col], s);
    d[i] = s;
  }
}

// x ~ hi + lo, both tf32 (as templates/cuda/mma_tf32.cuh's: the same integer operations).
__device__ __forceinline__ void split(float x, unsigned& hi, unsigned& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}
