// Feature "mbarrier" (sm_80 on): barriers in this block's shared memory that count arrivals and, for transactions,
// bytes (the cols panels' one per reflector, the cluster panels' one per parity of the column). The polling loop of
// the wait lives inside the asm, so the compiler sees no data-dependent loop (after one, it wrapped the following
// warp shuffles in convergence code).
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(bar)), "r"(count)
               : "memory");
}

// Before sm_90 the arrive and the wait take no .release / .acquire qualifiers (those are their default semantics at
// CTA scope there) and the wait polls with test_wait (try_wait is sm_90's).
#if __CUDA_ARCH__ >= 900
#define QR_MBAR_ARRIVE "mbarrier.arrive.release.cta.shared::cta.b64"
#define QR_MBAR_WAIT "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64"
#else
#define QR_MBAR_ARRIVE "mbarrier.arrive.shared::cta.b64"
#define QR_MBAR_WAIT "mbarrier.test_wait.parity.shared::cta.b64"
#endif

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  // release at CTA scope: this lane's stores of the reflector are visible to whoever completes the wait
  asm volatile("{\n .reg .b64 state;\n " QR_MBAR_ARRIVE " state, [%0];\n}" ::"r"(
                   (unsigned)__cvta_generic_to_shared(bar))
               : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait:\n"
      " " QR_MBAR_WAIT " done, [%0], %1;\n"
      " @!done bra wait;\n}" ::"r"((unsigned)__cvta_generic_to_shared(bar)),
      "r"(parity)
      : "memory");
}

// One arrival that also expects `bytes` more to complete in this phase (they may have arrived already).
__device__ __forceinline__ void mbar_arrive_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n\t}"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}

// A publishing arrival, then a CTA-scope fence across which ptxas moves no instruction: the work that follows it
// in the source (a cols producer's updates of its other columns) is not hoisted ahead of it to delay the consumers.
__device__ __forceinline__ void mbar_arrive_first(unsigned long long* bar) {
  mbar_arrive(bar);
  asm volatile("fence.acq_rel.cta;" ::: "memory");
}
