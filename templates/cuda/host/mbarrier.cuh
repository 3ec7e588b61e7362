// Feature "mbarrier" on the CPU layer (templates/cuda/host/dialect.cuh): the barrier's 8 bytes hold the arrivals
// it expects, those still pending, its phase and the transaction bytes outstanding. A phase completes when no
// arrival and no byte is pending; a wait yields to the other fibers until the phase of that parity has completed.
namespace qrh {
struct MBar {
  unsigned short expected, pending, phase;
  short bytes;
};
static_assert(sizeof(MBar) == 8, "an mbarrier is 8 bytes");
inline MBar* mbar(unsigned long long* bar) { return reinterpret_cast<MBar*>(bar); }
inline void mbar_settle(MBar* b) {
  qrl::progress();
  if (b->pending == 0 && b->bytes == 0) {
    b->phase ^= 1;
    b->pending = b->expected;
  }
}
}  // namespace qrh

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  *qrh::mbar(bar) = qrh::MBar{(unsigned short)count, (unsigned short)count, 0, 0};
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  qrh::MBar* b = qrh::mbar(bar);
  --b->pending;
  qrh::mbar_settle(b);
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  const qrh::MBar* b = qrh::mbar(bar);
  while ((b->phase & 1u) == (parity & 1u)) {
    qrl::stalled();
  }
}

__device__ __forceinline__ void mbar_arrive_expect(unsigned long long* bar, unsigned bytes) {
  qrh::MBar* b = qrh::mbar(bar);
  b->bytes = (short)(b->bytes + (int)bytes);
  --b->pending;
  qrh::mbar_settle(b);
}

// The arrival alone: the fence orders nothing more for fibers, which switch only at waits and exchanges.
__device__ __forceinline__ void mbar_arrive_first(unsigned long long* bar) { mbar_arrive(bar); }
