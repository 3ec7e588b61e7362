// Feature "cluster" on the CPU layer (templates/cuda/host/dialect.cuh runs a cluster's blocks as one group of
// fibers). An address in another block's shared memory is, as on the GPU, 32 bits: the window (a bank of shared
// objects, dialect.cuh) in bits 24-31, the block in bits 20-23 and the byte within the block's object below, so
// that the kernels' offset arithmetic on such addresses is the GPU's. A push stores at once and completes its
// bytes on the receiver's mbarrier; cluster_sync is a barrier over the whole group.
namespace qrh {
inline unsigned shared_address(const void* p, unsigned block) {
  const int w = window_of(p);
  const long off = (static_cast<const char*>(p) - windows[w].base) % windows[w].size;
  return ((unsigned)w << 24) | (block << 20) | (unsigned)off;
}
inline char* shared_pointer(unsigned a) {
  const Window& w = windows[a >> 24];
  return w.base + ((a >> 20) & 15u) * w.size + (a & 0xfffffu);
}
inline unsigned long long* mbar_at(unsigned a) { return reinterpret_cast<unsigned long long*>(shared_pointer(a)); }
inline void complete_bytes(unsigned long long* bar, unsigned bytes) {
  MBar* b = mbar(bar);
  b->bytes = (short)(b->bytes - (int)bytes);
  mbar_settle(b);
}
}  // namespace qrh

__device__ __forceinline__ unsigned peer_address(const void* p, unsigned rank) {
  return qrh::shared_address(p, rank);
}

__device__ __forceinline__ void push_peer(float* p, float v, unsigned long long* bar, unsigned rank) {
  *reinterpret_cast<float*>(qrh::shared_pointer(peer_address(p, rank))) = v;
  qrh::complete_bytes(qrh::mbar_at(peer_address(bar, rank)), 4);
}

__device__ __forceinline__ unsigned peer_at(unsigned peer_base, const void* base, const void* p) {
  return peer_base + (unsigned)(static_cast<const char*>(p) - static_cast<const char*>(base));
}

__device__ __forceinline__ void push_peer_at(unsigned peer_base, const void* base, float* p, float v,
                                             unsigned long long* bar) {
  *reinterpret_cast<float*>(qrh::shared_pointer(peer_at(peer_base, base, p))) = v;
  qrh::complete_bytes(qrh::mbar_at(peer_at(peer_base, base, bar)), 4);
}

__device__ __forceinline__ void mbar_arrive_expect_peer(unsigned peer_base, const void* base,
                                                        unsigned long long* bar, unsigned bytes) {
  mbar_arrive_expect(qrh::mbar_at(peer_at(peer_base, base, bar)), bytes);
}

__device__ __forceinline__ float4 peer_load4(const float* p, unsigned rank) {
  return *reinterpret_cast<const float4*>(qrh::shared_pointer(peer_address(p, rank)));
}

__device__ __forceinline__ void cluster_sync() { qrl::tg_barrier(); }

__device__ __forceinline__ void cluster_mbarriers_ready(bool) { cluster_sync(); }

__device__ __forceinline__ void cluster_exchange_init(unsigned long long* bar, int t) {
  if (t == 0) {
    mbar_init(&bar[0], 1);
    mbar_init(&bar[1], 1);
  }
  cluster_mbarriers_ready(t == 0);
}
