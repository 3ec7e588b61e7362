// MSL on the CPU (qrgen/compile/msl.py's CPU layer): a threadgroup's threads run as fibers (ucontext) on one host
// thread, switching at every barrier and SIMD-group exchange, so every interleaving the kernel allows is one of
// Metal's. A barrier that not every thread reaches (some returned, or wait at another barrier) is a deadlock,
// reported as an error (Metal's behaviour there is undefined). Built with the host's C++ compiler.
#include <ucontext.h>
#include <cstdlib>
#include <cstring>

namespace qrl {
struct Group {
  int threads = 0, current = 0, finished = 0;
  long stall = 0;
  bool deadlock = false;
  ucontext_t main;
  ucontext_t* ctx = nullptr;
  char* stacks = nullptr;
  int* done = nullptr;
  int tg_arrived = 0;
  unsigned tg_gen = 0;
  int sg_arrived[32];
  unsigned sg_gen[32];
  float sg_slot[1024];
  void (*body)(void*, int) = nullptr;
  void* closure = nullptr;
};
static const size_t STACK = 256 * 1024;
static thread_local Group* G = nullptr;

inline void wait_for(const unsigned* gen, unsigned mine) {
  while (*gen == mine) {
    if (++G->stall > 4L * G->threads + 64) G->deadlock = true;
    swapcontext(&G->ctx[G->current], &G->main);
  }
}

inline void tg_barrier() {
  const unsigned mine = G->tg_gen;
  G->stall = 0;
  if (++G->tg_arrived == G->threads) {
    G->tg_arrived = 0;
    ++G->tg_gen;
  } else {
    wait_for(&G->tg_gen, mine);
  }
}

inline void sg_barrier() {
  const int g = G->current >> 5;
  const unsigned mine = G->sg_gen[g];
  G->stall = 0;
  if (++G->sg_arrived[g] == 32) {
    G->sg_arrived[g] = 0;
    ++G->sg_gen[g];
  } else {
    wait_for(&G->sg_gen[g], mine);
  }
}

inline float exchange(float v, int src) {
  const int base = G->current & ~31;
  G->sg_slot[G->current] = v;
  sg_barrier();
  const float r = G->sg_slot[base + (src & 31)];
  sg_barrier();
  return r;
}

static void entry() {
  const int i = G->current;
  G->body(G->closure, i);
  G->done[i] = 1;
  ++G->finished;
  G->stall = 0;
}

// Runs body(closure, t) for t in [0, threads) as one threadgroup; 0, or 1 on a deadlock.
inline int run_group(int threads, void (*body)(void*, int), void* closure) {
  static thread_local Group group;
  Group& g = group;
  if (g.threads < threads) {
    std::free(g.ctx);
    std::free(g.stacks);
    std::free(g.done);
    g.ctx = (ucontext_t*)std::malloc(sizeof(ucontext_t) * threads);
    g.stacks = (char*)std::malloc(STACK * threads);
    g.done = (int*)std::malloc(sizeof(int) * threads);
  }
  g.threads = threads;
  g.finished = 0;
  g.stall = 0;
  g.deadlock = false;
  g.tg_arrived = 0;
  std::memset(g.sg_arrived, 0, sizeof g.sg_arrived);
  g.body = body;
  g.closure = closure;
  G = &g;
  for (int i = 0; i < threads; ++i) {
    g.done[i] = 0;
    getcontext(&g.ctx[i]);
    g.ctx[i].uc_stack.ss_sp = g.stacks + STACK * i;
    g.ctx[i].uc_stack.ss_size = STACK;
    g.ctx[i].uc_link = &g.main;
    makecontext(&g.ctx[i], entry, 0);
  }
  while (g.finished < threads && !g.deadlock) {
    for (int i = 0; i < threads && !g.deadlock; ++i) {
      if (g.done[i]) continue;
      g.current = i;
      swapcontext(&g.main, &g.ctx[i]);
    }
  }
  return g.deadlock ? 1 : 0;
}
}  // namespace qrl

#define QRL_FN inline
#define kernel static inline
inline unsigned qrl_lane() { return (unsigned)(qrl::G->current & 31); }
inline float qrl_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float qrl_nan() { return __builtin_nanf(""); }

namespace metal {
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float abs(float x) { return __builtin_fabsf(x); }
}  // namespace metal

#define threadgroup_barrier(flags) qrl::tg_barrier()
#define simdgroup_barrier(flags) qrl::sg_barrier()
inline float simd_shuffle(float v, unsigned short lane) { return qrl::exchange(v, lane); }
inline float simd_shuffle_xor(float v, unsigned short mask) { return qrl::exchange(v, (qrl::G->current & 31) ^ mask); }
inline float simd_sum(float v) {  // every lane adds the 32 values in lane order
  const int base = qrl::G->current & ~31;
  qrl::G->sg_slot[qrl::G->current] = v;
  qrl::sg_barrier();
  float s = 0.0f;
  for (int i = 0; i < 32; ++i) s += qrl::G->sg_slot[base + i];
  qrl::sg_barrier();
  return s;
}
struct uint3 {
  unsigned x, y, z;
};
