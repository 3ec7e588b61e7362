// Feature "mma tf32" (sm_80 on): the warp-wide tensor-core product D += A B of a 16 x 8 x 8 tile, tf32 inputs
// (their bits in a, b: the fragments of mma.sync.m16n8k8's row.col layout), fp32 accumulation.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, "
      "{ %0, %1, %2, %3 };"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// x ~ hi + lo, both tf32: hi is x rounded to tf32 (to nearest, ties away: add half a tf32 ulp to the bits and clear
// the 13 low mantissa bits, two integer operations where cvt.rna.tf32.f32 takes about eight with its Inf/NaN
// checks); x - hi is exact in fp32 with |x - hi| <= 2^-11 |x|, and lo is it truncated to tf32, so |x - hi - lo| <=
// 2^-21 |x|, under fp32's rounding of the sums. NaN stays NaN (in lo).
__device__ __forceinline__ void split(float x, unsigned& hi, unsigned& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi)) & 0xffffe000u;
}
