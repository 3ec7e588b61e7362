// The dialect layer on the CPU (qrgen/compile/host.py): the same names as templates/cuda/dialect.cuh, and the CUDA
// built-ins the kernel bodies use, over the fibers of templates/host/fibers.h (which the layer puts before the
// rendered source). A launch runs its groups one after another: a group is one block, or the blocks that wait for
// each other (a cluster, or a cooperative panel's blocks of one matrix), their threads all fibers of one group on
// one host thread. A shared variable of QR_SHARED_VAR and the dynamic shared memory are per block (a bank of one
// per block of the group; the dynamic part set to NaN before each group); QR_SHARED's is one for the group, for
// kernels whose blocks run alone. Arithmetic is the host's IEEE float: fmaf is fused, the hardware reciprocal and
// reciprocal square root are the correctly rounded division and square root (within their ulps), products and
// sums are not contracted.
#include <cmath>
#include <cstdint>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x, y, z;
};
struct float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float __fdividef(float a, float b) { return a / b; }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
using std::max;
using std::min;

namespace qrh {
static const int MAX_BLOCKS = 16;  // blocks of one group (a cluster's most)

struct Launch {
  dim3 grid, block, cluster, first;  // `first`: the group's first block
  int threads, blocks;      // a block's threads; blocks in the group
  float* shared;            // the group's dynamic shared memory, `floats` a block
  long floats;
  int arrived[MAX_BLOCKS];
  unsigned gen[MAX_BLOCKS];
};
static Launch L;

inline int rank() { return qrl::G->current / L.threads; }  // the fiber's block within the group
inline dim3 thread_index() {
  const unsigned t = (unsigned)(qrl::G->current % L.threads);
  return dim3{t % L.block.x, (t / L.block.x) % L.block.y, t / (L.block.x * L.block.y)};
}
inline dim3 block_index() {  // the fiber's block: its rank in the group, x fastest
  const unsigned r = (unsigned)rank();
  return dim3{L.first.x + r % L.cluster.x, L.first.y + (r / L.cluster.x) % L.cluster.y,
              L.first.z + r / (L.cluster.x * L.cluster.y)};
}

// Shared memory windows: a bank of one object per block (a QR_SHARED_VAR site, the dynamic shared memory), so
// that an address in one block's object maps to the same place in another block's (peer accesses, cluster.cuh).
struct Window {
  char* base;
  long size;   // bytes of one block's object
  int blocks;  // objects in the bank
};
static Window windows[64];
static int window_count = 0;
inline int window_of(const void* p) {
  const char* c = static_cast<const char*>(p);
  for (int w = 0; w < window_count; ++w)
    if (c >= windows[w].base && c < windows[w].base + windows[w].blocks * windows[w].size) return w;
  __builtin_trap();  // not shared memory
}
inline void note_window(void* base, long size, int blocks) {
  for (int w = 0; w < window_count; ++w)
    if (windows[w].base == base) return;
  if (window_count == 64) __builtin_trap();
  windows[window_count++] = Window{static_cast<char*>(base), size, blocks};
}

template <typename T, int SITE>
T& block_shared() {
  static T bank[MAX_BLOCKS];
  note_window(bank, sizeof(T), MAX_BLOCKS);
  return bank[rank()];
}

inline void block_barrier() {
  const int r = rank();
  const unsigned mine = L.gen[r];
  qrl::progress();
  if (++L.arrived[r] == L.threads) {
    L.arrived[r] = 0;
    ++L.gen[r];
  } else {
    qrl::wait_for(&L.gen[r], mine);
  }
}
}  // namespace qrh

#define threadIdx (qrh::thread_index())
#define blockIdx (qrh::block_index())
#define blockDim (qrh::L.block)
#define gridDim (qrh::L.grid)

#define QR_FULL_MASK 0xffffffffu
#define QR_SHARED static
#define QR_SHARED_VAR(name, ...) __VA_ARGS__& name = qrh::block_shared<__VA_ARGS__, __LINE__>()
#define QR_DYNAMIC_SHARED(name) float* name = qrh::L.shared + qrh::rank() * qrh::L.floats

__device__ __forceinline__ void block_barrier() { qrh::block_barrier(); }
__device__ __forceinline__ void warp_barrier() { qrl::sg_barrier(); }
__device__ __forceinline__ void device_fence() {}
__device__ __forceinline__ float load_coherent(const float* p) { return *p; }
__device__ __forceinline__ unsigned atomic_add(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
__device__ __forceinline__ unsigned atomic_max(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old > v ? old : v;
  return old;
}
__device__ __forceinline__ float rsqrt_normal(float x) { return 1.0f / std::sqrt(x); }
__device__ __forceinline__ float rcp_normal(float x) { return 1.0f / x; }

__device__ __forceinline__ float lane_select(bool p, float a, float b) { return p ? a : b; }
__device__ __forceinline__ float warp_shuffle(float v, int lane) { return qrl::exchange(v, lane); }
__device__ __forceinline__ float warp_shuffle_xor(float v, int mask) {
  return qrl::exchange(v, (qrl::G->current & 31) ^ mask);
}
template <int W>
__device__ __forceinline__ float segment_shuffle(float v, int lane) {
  return qrl::exchange(v, (qrl::G->current & 31 & ~(W - 1)) | (lane & (W - 1)));
}

// The butterflies of dialect.cuh, in the same order, so sums round as on the GPU.
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off >= 1; off >>= 1) v += warp_shuffle_xor(v, off);
  return v;
}

template <int N>
__device__ __forceinline__ void warp_sum(float (&v)[N]) {
  for (int off = 16; off >= 1; off >>= 1)
    for (int i = 0; i < N; ++i) v[i] += warp_shuffle_xor(v[i], off);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, warp_shuffle_xor(v, off));
  return v;
}

// x rounded to the product inputs' precision PREC (0 fp32, 1 tf32, 2 bf16, 3 fp16) by its bits: tf32 to nearest,
// ties away from zero (cvt.rna), bf16 and fp16 to nearest even (cvt.rn), as the GPU's conversions.
template <int PREC>
__device__ __forceinline__ float round_input(float x) {
  if constexpr (PREC == 0) {
    return x;
  } else if constexpr (PREC == 3) {
    return (float)(_Float16)x;
  } else {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf and NaN as they are
    if constexpr (PREC == 1) return __uint_as_float((u + 0x1000u) & 0xffffe000u);
    return __uint_as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
  }
}

namespace qrh {
// A kernel called with its arguments as the driver takes them: an array of pointers to the values.
template <typename... A, std::size_t... I>
void invoke(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<A*>(args[I])...);
}

template <typename... A>
struct Call {
  void (*kernel)(A...);
  void** args;
  static void body(void* closure, int) {
    Call* c = static_cast<Call*>(closure);
    invoke(c->kernel, c->args, std::index_sequence_for<A...>{});
  }
};

// The grid's groups in turn, a group being a cluster (cluster.x x cluster.y x cluster.z blocks; 1 x 1 x 1 for a
// block alone), each group's threads as fibers: 0, or 1 where a group deadlocked.
template <typename... A>
int launch(void (*kernel)(A...), void** args, dim3 grid, dim3 block, dim3 cluster, float* shared, long floats) {
  Call<A...> call{kernel, args};
  L.grid = grid;
  L.block = block;
  L.cluster = cluster;
  L.threads = (int)(block.x * block.y * block.z);
  L.blocks = (int)(cluster.x * cluster.y * cluster.z);
  L.shared = shared;
  L.floats = floats;
  window_count = 0;
  if (floats) note_window(shared, floats * 4, L.blocks);
  for (unsigned z = 0; z < grid.z; z += cluster.z)
    for (unsigned y = 0; y < grid.y; y += cluster.y)
      for (unsigned x = 0; x < grid.x; x += cluster.x) {
        for (long i = 0; i < floats * L.blocks; ++i) shared[i] = __builtin_nanf("");
        for (int r = 0; r < L.blocks; ++r) L.arrived[r] = 0;
        L.first = dim3{x, y, z};
        if (qrl::run_group(L.threads * L.blocks, &Call<A...>::body, &call)) return 1;
      }
  return 0;
}
}  // namespace qrh
