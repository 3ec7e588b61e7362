// Feature "flags" on the CPU layer: the blocks of a matrix that wait for each other run as one group of fibers
// (dialect.cuh). A load of a flag returns at once; a fiber that reads the same value of the same flag again is
// polling, and yields to the other fibers before it reads. An arrival is progress (the deadlock count starts again).
namespace qrh {
static const unsigned* polled[qrl::MAX_THREADS];
static unsigned polled_value[qrl::MAX_THREADS];
}  // namespace qrh

__device__ __forceinline__ void flag_arrive(unsigned* flag) {
  qrl::progress();
  ++*flag;
}

__device__ __forceinline__ unsigned flag_load(const unsigned* flag) {
  const int i = qrl::G->current;
  if (qrh::polled[i] == flag && qrh::polled_value[i] == *flag) {
    qrl::stalled();
  }
  qrh::polled[i] = flag;
  qrh::polled_value[i] = *flag;
  return *flag;
}
