// Helpers of the Metal kernel families over the dialect (dialect.h, included before this).

// Householder reflector from alpha (the pivot) and sigma (the squared norm below it), LAPACK's slarfg without its
// rescaling loop, as templates/cuda/common.cuh's make_reflector: H = I - tau v v^T, v = [1; x / (alpha - beta)],
// H [alpha; x] = [beta; 0]; sigma == 0 gives the identity (tau 0) with the tail left as it is. IEEE square root and
// division (the kernels are compiled without fast math).
struct Reflector {
  float tau, beta, scale;
};

inline Reflector make_reflector(float alpha, float sigma) {
  Reflector r;
  if (sigma == 0.0f) {
    r.tau = 0.0f;
    r.beta = alpha;
    r.scale = 1.0f;
  } else {
    const float norm = sqrt(fma(alpha, alpha, sigma));
    r.beta = alpha >= 0.0f ? -norm : norm;
    r.tau = (r.beta - alpha) / r.beta;
    r.scale = 1.0f / (alpha - r.beta);
  }
  return r;
}

// The threadgroup's sums of COUNT values per thread (v[0 .. COUNT)), into tot[0 .. COUNT): each SIMD group's sums
// by butterfly, its lane 0 writing them to red[warp][..] (33 floats a group), then thread i adds up value i over the
// groups. Two barriers: tot is complete after it, and red may be rewritten by the next call.
template <int COUNT, int WARPS>
inline void block_sums(thread float* v, threadgroup float* red, threadgroup float* tot, uint t, uint lane,
                       uint warp) {
  for (int i = 0; i < COUNT; ++i) {
    const float s = warp_sum(v[i]);
    if (lane == 0) red[warp * 33 + i] = s;
  }
  block_barrier();
  if (t < (uint)COUNT) {
    float acc = 0.0f;
    for (int w = 0; w < WARPS; ++w) acc += red[w * 33 + t];
    tot[t] = acc;
  }
  block_barrier();
}

// out = (accumulate ? out : 0) + sign op(a) b, for NB x NB blocks in threadgroup memory with rows PITCH floats
// apart, op(a) = a^T where TRANS: the entries spread over the THREADS threads, each entry of out read and written by
// one thread. Callers put a barrier between it and the next reader of out.
template <int NB, int PITCH, int THREADS, bool TRANS>
inline void block_product(threadgroup float* out, const threadgroup float* a, const threadgroup float* b,
                          float sign, bool accumulate, uint t) {
  for (int e = (int)t; e < NB * NB; e += THREADS) {
    const int i = e / NB, j = e - i * NB;
    float acc = 0.0f;
    for (int k = 0; k < NB; ++k) acc = fma(TRANS ? a[k * PITCH + i] : a[i * PITCH + k], b[k * PITCH + j], acc);
    out[i * PITCH + j] = accumulate ? fma(sign, acc, out[i * PITCH + j]) : sign * acc;
  }
}
