"""A cols panel as the whole factorization of square matrices (the seed's one-kernel design), timed and traced column
by column, with source variants of its producer and consumers (needs a CUDA GPU).

    python3 tools/cols_trace.py 40x176 --variant shipped --variant seed-producer --variant seed-producer+pairs --trace

A case is BATCHxN: one cols panel N columns wide over N x N matrices (slice 8: 32 * N / 8 threads; --slice to
change). Each variant is the rendered kernel (templates/cuda/panel_cols.cuh) with text replaced:
  shipped        as rendered;
  seed-producer  a producer that builds its reflector from one single-value reduction of the norm, publishes it,
                 then updates its own later columns one at a time (one single-value reduction each), as the seed
                 does; the shipped producer reduces the norm and the dots with its other columns in one butterfly;
  pairs          consumers reduce and update their columns two at a time (the seed's order), not all at once;
and a '+' joins them. For each: the median event time of 30 calls (L2 flushed), the gates on random and on mixed
hostile matrices, and with --trace the clock after each reflector is published (a stored clock per column; the
kernel then runs a little slower, its time is printed too): cycles column to column inside a warp and from one
warp's last column to the next warp's first.

kernel, variant_source and instrument need no GPU (tests/compile checks that every anchor is still in the template
and that each variant compiles without spills).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import statistics

from qrgen.compile.nvrtc import options
from qrgen.plan import cols
from qrgen.render.sources import render_all
from qrgen.schedule.model import Panel, Schedule
from qrgen.targets import Target

PRODUCER_START = ("  // Reflector of own column I (panel column col), applied at once to own columns I+1..S-1, then "
                  "published.")
PRODUCER_END = "  template <int I>\n  __device__ __forceinline__ void produce_all()"
SEED_PRODUCER = """  template <int I>
  __device__ __forceinline__ void produce() {
    const int col = warp * S + I;
    if (col >= NB) return;
    float sig = 0.0f, piv = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
      const float a = r > col ? x[s][I] : 0.0f;
      sig = fmaf(a, a, sig);
      piv = r == col ? x[s][I] : piv;
    }
    const Reflector f = make_reflector(warp_shuffle(piv, col & 31), warp_sum(sig));
    float v[SLOTS];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int r = s * 32 + lane;
      v[s] = r > col ? x[s][I] * f.scale : (r == col ? 1.0f : 0.0f);
      x[s][I] = r > col ? v[s] : (r == col ? f.beta : x[s][I]);
      vs[col * RS + r] = r < mp ? v[s] : 0.0f;
    }
    if (lane == 0) taus[col] = f.tau;
    mbar_arrive(bars + col);
#pragma unroll
    for (int k = I + 1; k < S; ++k) {
      float d = 0.0f;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) d = fmaf(v[s], x[s][k], d);
      d = warp_sum(d) * f.tau;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) x[s][k] = fmaf(-d, v[s], x[s][k]);
    }
  }

"""
CONSUMER_START = "    float d[S];\n#pragma unroll\n    for (int k = 0; k < S; ++k) d[k] = 0.0f;\n"
CONSUMER_END = "      for (int k = 0; k < S; ++k) x[s][k] = fmaf(-d[k], v[s], x[s][k]);\n    }\n"
PAIRS_CONSUMER = """#pragma unroll
    for (int s = 0; s < SLOTS; ++s) v[s] = vs[c * RS + s * 32 + lane];
#pragma unroll
    for (int k0 = 0; k0 < S; k0 += 2) {
      float d[2] = {0.0f, 0.0f};
#pragma unroll
      for (int s = 0; s < SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k) d[k] = fmaf(v[s], x[s][k0 + k], d[k]);
      warp_sum(d);
#pragma unroll
      for (int s = 0; s < SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k) x[s][k0 + k] = fmaf(-d[k] * tau, v[s], x[s][k0 + k]);
    }
"""
PUBLISHED = "    mbar_arrive(bars + col);\n"
TRACE_BUFFER = "__device__ unsigned qr_trace_clock[64 * 1024];\n"
VARIANTS = ("shipped", "seed-producer", "pairs")


def _between(source: str, start: str, end: str, new: str, keep_end: bool) -> str:
    if start not in source or end not in source[source.index(start):]:
        raise ValueError("the cols template changed: an anchor of tools/cols_trace.py is missing")
    i = source.index(start)
    j = source.index(end, i) + (0 if keep_end else len(end))
    return source[:i] + new + source[j:]


# The planner's register estimate refuses 176 rows on 22 warps, which NVRTC fits in their 80 registers without
# spilling (benchmarks/journal/2026-12-03-s33.md); the tool plans with a smaller allowance.
TOOL_REG_OVERHEAD = 18


def kernel(n: int, slice_: int, target: Target = Target()):
    """The rendered cols kernel that factors an n x n matrix alone, and its shared memory in bytes."""
    panel = Panel(n, "cols", threads=32 * -(-n // slice_), slice=slice_)
    kept, cols.REG_OVERHEAD = cols.REG_OVERHEAD, TOOL_REG_OVERHEAD
    try:
        (rendered,) = render_all(Schedule(n, n, (panel,)), target)
    finally:
        cols.REG_OVERHEAD = kept
    return rendered, cols.shared_bytes(panel, n, False, n, n)


def variant_source(source: str, variant: str) -> str:
    """The kernel's source with the variant's text in place (ValueError where an anchor is gone)."""
    for part in variant.split("+"):
        if part not in VARIANTS:
            raise ValueError(f"variant parts are {VARIANTS}, got {part!r}")
        if part == "seed-producer":
            source = _between(source, PRODUCER_START, PRODUCER_END, SEED_PRODUCER, keep_end=True)
        elif part == "pairs":
            source = _between(source, CONSUMER_START, CONSUMER_END, PAIRS_CONSUMER, keep_end=False)
    return source


def instrument(source: str) -> str:
    """Lane 0 of the producing warp stores the clock after each reflector is published."""
    if PUBLISHED not in source or "struct ColsPanel" not in source:
        raise ValueError("the cols template changed: an anchor of tools/cols_trace.py is missing")
    stamp = "    if (lane == 0) qr_trace_clock[b * 1024 + col] = (unsigned)clock();\n"
    source = source.replace(PUBLISHED, PUBLISHED + stamp, 1)
    i = source.index("template <int M", source.index("struct ColsPanel") - 200)
    return source[:i] + TRACE_BUFFER + source[i:]


def run(batch: int, n: int, slice_: int, variant: str, trace: bool) -> None:
    import cupy
    import numpy as np

    from qrgen.numerics.check import check
    from qrgen.numerics.stress import mixed

    rendered, smem = kernel(n, slice_)
    source = variant_source(rendered.source, variant)
    source = instrument(source) if trace else source
    # qrgen's NVRTC options but the architecture, which CuPy sets for the current device
    module = cupy.RawModule(code=source, options=tuple(o for o in options("sm_90") if not o.startswith("--gpu-arch")))
    fn = module.get_function(rendered.name)
    fn.max_dynamic_shared_size_bytes = smem
    threads = 32 * -(-n // slice_)
    a = cupy.asarray(np.random.default_rng(0).standard_normal((batch, n, n), dtype=np.float32))
    h, tau = cupy.empty_like(a), cupy.empty((batch, n), cupy.float32)
    none, flags = cupy.empty(1, cupy.float32), cupy.zeros(1, cupy.uint32)

    def launch(x):
        fn((batch,), (threads,), (x, h, tau, none, none, none, flags, np.uint32(0), np.int32(0), np.int32(n),
                                  np.int32(n), np.int64(0)), shared_mem=smem)

    launch(a)
    flush = cupy.empty(64 * 1024 * 1024, cupy.float32)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for i in range(30):
        flush.fill(i)
        start.record()
        launch(a)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
    launch(a)
    line = (f"{batch}x{n}² slice {slice_} {variant}{' (traced)' if trace else ''}: "
            f"{statistics.median(times):.1f} µs; {check(a, h, tau)}")
    hostile = cupy.asarray(mixed(n, n, batch, seed=5)[0])
    launch(hostile)
    print(f"{line}; hostile {check(hostile, h, tau)}", flush=True)
    if trace:
        launch(a)
        cupy.cuda.runtime.deviceSynchronize()
        clocks = cupy.ndarray((64 * 1024,), cupy.uint32, memptr=module.get_global("qr_trace_clock"))
        col = clocks[: batch * 1024].reshape(batch, 1024)[:, :n].get().astype(np.int64)
        step = np.median(np.diff(col - col[:, :1], axis=1), axis=0)
        inside = [step[i] for i in range(n - 1) if (i + 1) % slice_]
        handoff = [step[i] for i in range(n - 1) if not (i + 1) % slice_]
        print(f"  cycles first to last column {np.median(col[:, n - 1] - col[:, 0]):.0f}; inside a warp: median "
              f"{np.median(inside):.0f}; warp to warp: median {np.median(handoff):.0f}; the first two warps: "
              + " ".join(f"{x:.0f}" for x in step[: 2 * slice_]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("cases", nargs="+", metavar="BATCHxN")
    ap.add_argument("--slice", type=int, default=8, help="columns a warp (default 8)")
    ap.add_argument("--variant", action="append", help=f"'+'-joined parts of {VARIANTS} (repeatable; default shipped)")
    ap.add_argument("--trace", action="store_true", help="also run each variant with a clock per column")
    args = ap.parse_args()
    for case in args.cases:
        batch, n = (int(v) for v in case.lower().split("x"))
        for variant in args.variant or ["shipped"]:
            for trace in (False, True) if args.trace else (False,):
                run(batch, n, args.slice, variant, trace)


if __name__ == "__main__":
    main()
