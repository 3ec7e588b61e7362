// Feature "wgmma" (sm_90a only: a source that includes this header compiles for the arch-specific target): the
// warpgroup's asynchronous tensor-core product D += A B of a 64 x 64 x 8 tile with tf32 inputs, A in registers (each
// warp's 16 rows in mma.sync m16n8k8's A fragment: a[0] row gid k tig, a[1] row gid + 8, a[2] k tig + 4, a[3] both),
// B in shared memory K-major, named by a descriptor; D in registers, per warp 16 rows in mma.sync's C fragment for
// each of the 8 column tiles j (d[4 j] row gid column 8 j + 2 tig, d[4 j + 1] the next column, d[4 j + 2] and
// d[4 j + 3] row gid + 8). Products are issued, committed as a group, and waited for (wg_wait<N>: at most N groups
// in flight); wg_fence orders register writes before the products that read them.
// Used by tools/wgmma_probe.py (no kernel family yet: docs/decisions.md#wgmma-update).

// B's shared-memory descriptor, no swizzle: core matrices of 8 rows (N) x 16 bytes (4 tf32 along K), 128 bytes
// each; lbo bytes between the two core matrices of a k8 step, sbo between core matrices along N (bits 0-13 the
// address, 16-29 lbo, 32-45 sbo, each in 16-byte units).
__device__ __forceinline__ unsigned long long wg_desc(const void* p, unsigned lbo, unsigned sbo) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Shared memory written by this thread's ordinary stores, made visible to the tensor cores' reads (before a barrier).
__device__ __forceinline__ void wg_shared_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// D = A B + (accumulate ? D : 0).
__device__ __forceinline__ void wg_tf32(float (&d)[32], const unsigned (&a)[4], unsigned long long b,
                                        int accumulate = 1) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 { %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 }, "
      "{ %32, %33, %34, %35 }, %36, p, 1, 1; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
