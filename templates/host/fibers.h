// Threads as fibers on one host thread, for the CPU layers that run GPU kernels (the MSL layer, templates/metal/
// layers/cpu.h; CUDA's, templates/cuda/host/): a group's threads switch at every barrier and SIMD-group (warp)
// exchange, so every interleaving the kernel allows is one the GPU could run. A barrier that not every thread
// reaches (some returned, or wait at another barrier) is a deadlock, reported as an error. Fibers switch by saving
// the callee-saved registers and the stack pointer (x86-64 Linux; a switch costs nanoseconds where swapcontext's
// signal mask costs two system calls), elsewhere by ucontext's swapcontext.
#include <ucontext.h>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#define QRL_FAST_SWITCH 1
// qrl_switch(save, load): the callee-saved registers pushed, the stack pointer into *save; then the stack pointer
// from load, its registers popped, and return to where that fiber switched away (or to its entry).
extern "C" void qrl_switch(void** save, void* load);
asm(R"(
  .text
  .hidden qrl_switch
  .globl qrl_switch
  .type qrl_switch, @function
qrl_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size qrl_switch, .-qrl_switch
)");
#else
#define QRL_FAST_SWITCH 0
#endif

namespace qrl {
static const int MAX_THREADS = 16384;  // a group's fibers: a block, or the blocks of a cluster together (16 of 1024)

struct Group {
  int threads = 0, current = 0, finished = 0;
  long stall = 0;
  unsigned long long arrivals = 0;  // progress anywhere in the group (progress()), for the straggler's turns
  bool deadlock = false;
#if QRL_FAST_SWITCH
  void* main_sp = nullptr;
  void** sp = nullptr;  // each fiber's saved stack pointer
#else
  ucontext_t main;
  ucontext_t* ctx = nullptr;
#endif
  char* stacks = nullptr;
  int* done = nullptr;
  int tg_arrived = 0;
  unsigned tg_gen = 0;
  int sg_arrived[MAX_THREADS / 32];
  unsigned sg_gen[MAX_THREADS / 32];
  // a SIMD-group exchange's values, by turn: a lane's next exchange writes the other slot, so one barrier between
  // the writes and the reads suffices (a lane is two exchanges ahead only once every lane has read)
  float sg_slot[2][MAX_THREADS];
  unsigned char sg_turn[MAX_THREADS];
  void (*body)(void*, int) = nullptr;
  void* closure = nullptr;
};
static const size_t STACK = 256 * 1024;
static thread_local Group* G = nullptr;

inline void to_main() {
#if QRL_FAST_SWITCH
  qrl_switch(&G->sp[G->current], G->main_sp);
#else
  swapcontext(&G->ctx[G->current], &G->main);
#endif
}

inline void to_fiber(int i) {
#if QRL_FAST_SWITCH
  qrl_switch(&G->main_sp, G->sp[i]);
#else
  swapcontext(&G->main, &G->ctx[i]);
#endif
}

static unsigned order_seed = 0;  // the turn order (run_group): 0, index order
static int straggler = -1;  // a warp of the group that takes its turns only when no other fiber can progress

// An arrival (a barrier, an exchange, an mbarrier or a flag): the deadlock count starts again.
inline void progress() {
  G->stall = 0;
  ++G->arrivals;
}

// A fiber that waits for others gives them its turn; a long enough run of waits with no progress between (no
// arrival anywhere) is a deadlock. In drawn orders a warp may sit out half the rounds, so the run is longer there.
inline void stalled() {
  if (++G->stall > (order_seed ? 64L : 4L) * G->threads + 64) G->deadlock = true;
  to_main();
}

inline void wait_for(const unsigned* gen, unsigned mine) {
  while (*gen == mine) stalled();
}

inline void tg_barrier() {
  const unsigned mine = G->tg_gen;
  progress();
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
  progress();
  if (++G->sg_arrived[g] == 32) {
    G->sg_arrived[g] = 0;
    ++G->sg_gen[g];
  } else {
    wait_for(&G->sg_gen[g], mine);
  }
}

// This lane's value written for an exchange; the SIMD group's 32 values once every lane has written.
inline const float* exchange_all(float v) {
  const int turn = G->sg_turn[G->current];
  G->sg_turn[G->current] ^= 1;
  G->sg_slot[turn][G->current] = v;
  sg_barrier();
  return &G->sg_slot[turn][G->current & ~31];
}

inline float exchange(float v, int src) { return exchange_all(v)[src & 31]; }

static void entry() {  // a fiber's first frame: never returns, never resumed once done
  const int i = G->current;
  G->body(G->closure, i);
  G->done[i] = 1;
  ++G->finished;
  progress();
  to_main();
}

// Fiber i, set to start at entry() on its stack.
inline void start(Group& g, int i) {
#if QRL_FAST_SWITCH
  // qrl_switch's frame: six registers and the return address (entry), above it a null return address for entry,
  // whose frame then begins 16-byte aligned as a call's would
  void** top = (void**)(((unsigned long)(g.stacks + STACK * (i + 1))) & ~15ul);
  void** sp = top - 8;
  for (int r = 0; r < 6; ++r) sp[r] = nullptr;
  sp[6] = (void*)&entry;
  sp[7] = nullptr;
  g.sp[i] = (void*)sp;
#else
  getcontext(&g.ctx[i]);
  g.ctx[i].uc_stack.ss_sp = g.stacks + STACK * i;
  g.ctx[i].uc_stack.ss_size = STACK;
  g.ctx[i].uc_link = &g.main;
  makecontext(&g.ctx[i], entry, 0);
#endif
}

// The order fibers take turns in (order_seed): 0, each round in index order; else each round in a new order drawn
// from the seed (xorshift) in which each warp sits out with probability one half, so that a group's warps and
// blocks drift apart as the GPU's may, and a wait or barrier a kernel lacks shows. With a straggler (a warp of the
// group, qrl_set_straggler) that warp sits out every round but those after a round in which no other fiber made
// progress: it falls as far behind as the kernel's waits let it, as a warp the GPU never schedules would, so a
// wait that only the slowest warp's lag would need shows too.
static int order[MAX_THREADS];

inline unsigned next_random() {
  order_seed ^= order_seed << 13;
  order_seed ^= order_seed >> 17;
  order_seed ^= order_seed << 5;
  return order_seed;
}

// Runs body(closure, t) for t in [0, threads) as one threadgroup; 0, or 1 on a deadlock.
inline int run_group(int threads, void (*body)(void*, int), void* closure) {
  static thread_local Group group;
  Group& g = group;
  if (g.threads < threads) {
#if QRL_FAST_SWITCH
    std::free(g.sp);
    g.sp = (void**)std::malloc(sizeof(void*) * threads);
#else
    std::free(g.ctx);
    g.ctx = (ucontext_t*)std::malloc(sizeof(ucontext_t) * threads);
#endif
    std::free(g.stacks);
    std::free(g.done);
    g.stacks = (char*)std::malloc(STACK * threads);
    g.done = (int*)std::malloc(sizeof(int) * threads);
  }
  g.threads = threads;
  g.finished = 0;
  g.stall = 0;
  g.arrivals = 0;
  g.deadlock = false;
  g.tg_arrived = 0;
  std::memset(g.sg_arrived, 0, sizeof g.sg_arrived);
  std::memset(g.sg_turn, 0, sizeof g.sg_turn);
  g.body = body;
  g.closure = closure;
  G = &g;
  for (int i = 0; i < threads; ++i) {
    g.done[i] = 0;
    start(g, i);
  }
  for (int i = 0; i < threads; ++i) order[i] = i;
  bool behind = false;  // the straggler's round: the last one made no progress
  while (g.finished < threads && !g.deadlock) {
    const unsigned long long before = g.arrivals;
    unsigned long long out = 0;  // the warps (up to 64 of them by 64 bits) that sit this round out
    if (order_seed) {
      for (int i = threads - 1; i > 0; --i) {
        const int k = (int)(next_random() % (unsigned)(i + 1));
        const int tmp = order[i];
        order[i] = order[k];
        order[k] = tmp;
      }
      out = ((unsigned long long)next_random() << 32 | next_random());
      if ((threads + 31) / 32 <= 64 && (~out & (~0ull >> (64 - (threads + 31) / 32))) == 0) out = 0;
    }
    for (int n = 0; n < threads && !g.deadlock; ++n) {
      const int i = order[n];
      if (g.done[i] || ((out >> ((i >> 5) & 63)) & 1ull) || ((i >> 5) == straggler && !behind)) continue;
      g.current = i;
      to_fiber(i);
    }
    behind = straggler >= 0 && !behind && g.arrivals == before;
  }
  return g.deadlock ? 1 : 0;
}
}  // namespace qrl

// The turn order of the groups that follow (qrl::order_seed): 0 for index order.
extern "C" void qrl_set_order(unsigned seed) { qrl::order_seed = seed; }

// The straggler of the groups that follow (qrl::straggler): a warp index within a group, or -1 for none.
extern "C" void qrl_set_straggler(int warp) { qrl::straggler = warp; }
