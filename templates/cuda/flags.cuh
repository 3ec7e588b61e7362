// Feature "flags": counters in global memory between the blocks that share one matrix's panel (without clusters),
// released on arrival and acquired while polling, at GPU scope.
__device__ __forceinline__ void flag_arrive(unsigned* flag) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flag) : "memory");
}

__device__ __forceinline__ unsigned flag_load(const unsigned* flag) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}
