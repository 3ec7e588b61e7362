// Feature "cluster" (sm_90): thread-block clusters and their distributed shared memory, each block reading and
// writing the others' shared memory. Needs mbarrier.cuh before it (pushes complete on the receiver's mbarrier).

// The address of the same shared variable as `p` in cluster block `rank`, for shared::cluster accesses.
__device__ __forceinline__ unsigned peer_address(const void* p, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
  return remote;
}

// Pushes into another block's shared memory: st.async writes a float at the address of the same variable in block
// `rank` and completes its bytes on that block's mbarrier (at the address of `bar` there). No fence: the receiver's
// wait on its mbarrier makes the bytes visible (a cluster barrier's release compiles to MEMBAR.ALL.GPU and its
// acquire to an L1 invalidation, on every column).
__device__ __forceinline__ void push_peer(float* p, float v, unsigned long long* bar, unsigned rank) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               :: "r"(peer_address(p, rank)), "r"(__float_as_uint(v)), "r"(peer_address(bar, rank)) : "memory");
}

// The address of the same shared variable as `p` in the block where `base` (this block's shared memory) is at
// peer_base (from peer_address(base, rank) once, not one mapa an access): peer_base plus p's offset from base here.
__device__ __forceinline__ unsigned peer_at(unsigned peer_base, const void* base, const void* p) {
  return peer_base + ((unsigned)__cvta_generic_to_shared(p) - (unsigned)__cvta_generic_to_shared(base));
}

// push_peer at peer_at's addresses.
__device__ __forceinline__ void push_peer_at(unsigned peer_base, const void* base, float* p, float v,
                                             unsigned long long* bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               :: "r"(peer_at(peer_base, base, p)), "r"(__float_as_uint(v)), "r"(peer_at(peer_base, base, bar))
               : "memory");
}

// One arrival on the mbarrier at peer_at's address of `bar`, expecting `bytes` more pushed bytes in this phase
// (they may have arrived already). Relaxed: the pushed bytes complete on that mbarrier themselves, and a release at
// cluster scope compiles to MEMBAR.ALL.GPU.
__device__ __forceinline__ void mbar_arrive_expect_peer(unsigned peer_base, const void* base,
                                                        unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.relaxed.cluster.shared::cluster.b64 _, [%0], %1;"
               :: "r"(peer_at(peer_base, base, bar)), "r"(bytes) : "memory");
}

// 16 bytes at the address of the same variable as `p` in the shared memory of cluster block `rank` (the fused
// kernel's partial W of the other blocks).
__device__ __forceinline__ float4 peer_load4(const float* p, unsigned rank) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 { %0, %1, %2, %3 }, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(peer_address(p, rank)) : "memory");
  return v;
}

// A barrier over the whole cluster (release on arrival, acquire on the wait; it compiles to MEMBAR.ALL.GPU and an
// L1 invalidation, so the panels use it once at each end, not per column).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// After this block's threads initialized its mbarriers: the cluster waits until every block's are, so that no
// block pushes into another's before (the initializing threads' fence releases them to the cluster).
__device__ __forceinline__ void cluster_mbarriers_ready(bool initialized_here) {
  if (initialized_here) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  cluster_sync();
}

// The cluster panels' exchange: thread 0 initializes this block's two mbarriers (one per parity of the column).
__device__ __forceinline__ void cluster_exchange_init(unsigned long long* bar, int t) {
  if (t == 0) {
    mbar_init(&bar[0], 1);
    mbar_init(&bar[1], 1);
  }
  cluster_mbarriers_ready(t == 0);
}
