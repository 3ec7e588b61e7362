// Feature "cp.async" (sm_80 on): global -> shared memory without a trip through registers, in groups that
// cp.async.wait_group counts. copy16 reads the first `bytes` (0, 4, 8, 12 or 16) and zero-fills the rest; nothing
// is read at 0 bytes (src is then any valid address). copy4 does the same for one float, zero where !ok.
__device__ __forceinline__ void copy16(float* dst, const float* src, const int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(bytes));
}

__device__ __forceinline__ void copy4(float* dst, const float* src, const bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(ok ? 4 : 0));
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }

// Waits until at most N of this thread's committed groups are in flight. No memory clobber: a block barrier
// follows before the copied data is read.
template <int N>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// One float with no source size (the T kernel's G), and the wait for every copy of this thread, committed or not.
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
}

__device__ __forceinline__ void async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
