"""A cols panel as the whole factorization of square matrices (the seed's one-kernel design), or as a tall panel
alone, timed and traced column by column, with source variants of its producer and consumers (needs a CUDA GPU).

    python3 tools/cols_trace.py 40x176 --variant shipped --variant branches --variant butterfly --trace

A case is BATCHxN or BATCHxMxN: one cols panel N columns wide over N x N (or M x N: a tall panel alone, such as
640x512x64 for 640 x 512²'s first panel) matrices (slice 8: 32 * N / 8 threads; --slice to change; --blocks 2: the
warps on a cluster of two blocks). Each variant is the rendered kernel
(templates/cuda/panel_cols.cuh) with text replaced:
  shipped    as rendered;
  branches   the producer's reflector with branches (make_reflector<false>), not selects;
  butterfly  a consumer's two sums by a butterfly each (10 shuffles), not by reduce-scatter (6);
  split      each dot and norm of 32-row slots summed in two accumulators (halving the dependent FMA chains);
  latepush   a producer pushes its reflector into the later block after updating its next column and starting
             that column's norm (off the column's chain), not right after publishing it;
and a '+' joins them. For each: the median event time of 30 calls (L2 flushed), the gates on random and on mixed
hostile matrices, and with --trace the clock after each reflector is published (a stored clock per column; the
kernel's time is printed too, as the stamps change how ptxas schedules it): cycles column to column inside a warp
and from one warp's last column to the next warp's first; and for the first 16 reflectors, how long after publishing
the last consuming warp, and the next producer, had applied it.

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
from qrgen.plan.cols import cols_threads
from qrgen.render.sources import render_all
from qrgen.schedule.model import Panel, Schedule
from qrgen.targets import Target

BRANCHES = ("make_reflector<true>(alpha, sigma)", "make_reflector<false>(alpha, sigma)")
SCATTER_START = "      reduce_scatter<16, 2>(d, lane);"
SCATTER_END = "      d[0] = upper ? other : d[0];\n"
PUBLISHED = "    mbar_arrive_first(bars + col);\n"
CONSUMED = "      consume<J>(c);\n"
TRACED = 16  # reflectors whose every consumption is clocked
TRACE_WARPS = 64  # room for every warp of a panel (32 a block, 2 blocks)
TRACE_BATCH = 1024  # room for this many matrices
TRACE_BUFFER = (f"__device__ unsigned qr_trace_clock[{TRACE_BATCH} * 1024];\n"
                f"__device__ unsigned qr_trace_consumed[{TRACE_BATCH} * {TRACED} * {TRACE_WARPS}];\n")
# split: (anchor, replacement) pairs, two accumulators for a consumer's pair of sums, a column's norm and a producer's
# dot with its later column
SPLIT = (
    ("""      float d[2] = {0.0f, 0.0f};
#pragma unroll
      for (int s = J; s < SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k) d[k] = fmaf(v[s], x[s][k0 + k], d[k]);
""", """      float d[2] = {0.0f, 0.0f}, e[2] = {0.0f, 0.0f};
#pragma unroll
      for (int s = J; s < SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if ((s - J) & 1) e[k] = fmaf(v[s], x[s][k0 + k], e[k]);
          else d[k] = fmaf(v[s], x[s][k0 + k], d[k]);
        }
      d[0] += e[0];
      d[1] += e[1];
"""),
    ("      sig = fmaf(a, a, sig);", "      if (s & 1) sig2 = fmaf(a, a, sig2);\n      else sig = fmaf(a, a, sig);"),
    ("    float sig = 0.0f, piv = 0.0f;", "    float sig = 0.0f, sig2 = 0.0f, piv = 0.0f;"),
    ("    sigma = warp_sum(sig);", "    sigma = warp_sum(sig + sig2);"),
    ("""      float d = 0.0f;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) d = fmaf(v[s], x[s][k], d);
      d = warp_sum(d) * f.tau;""", """      float d = 0.0f, d2 = 0.0f;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (s & 1) d2 = fmaf(v[s], x[s][k], d2);
        else d = fmaf(v[s], x[s][k], d);
      }
      d = warp_sum(d + d2) * f.tau;"""),
)
# latepush: the producer's push into later blocks (from PUSH_START to PUSH_END) becomes a lambda, called after the
# next column's norm is started (LATE_PUSH), or at once by a warp's last column
PUSH_START = "    if constexpr (BLOCKS > 1) {\n#pragma unroll\n      for (int p = 1; p < BLOCKS; ++p) {"
PUSH_END = "        if (lane == 0) push_peer_at(peer[p], vs, taus + col, f.tau, bars + col);\n      }\n    }\n"
LATE_PUSH = ("      if (k == I + 1) column_norm<(I + 1 < S ? I + 1 : I)>(col + 1, sigma, alpha);\n",
             "      if (k == I + 1) {\n        column_norm<(I + 1 < S ? I + 1 : I)>(col + 1, sigma, alpha);\n"
             "        push();\n      }\n")
VARIANTS = ("shipped", "branches", "butterfly", "split", "latepush")


def _replace(source: str, old: str, new: str) -> str:
    if old not in source:
        raise ValueError("the cols template changed: an anchor of tools/cols_trace.py is missing")
    return source.replace(old, new)


def kernel(n: int, slice_: int, target: Target = Target(), blocks: int = 1, m: int | None = None):
    """The rendered cols kernel that factors an m x n matrix (m: n unless given) alone (on `blocks` blocks), and its
    shared memory in bytes."""
    m = n if m is None else m
    panel = Panel(n, "cols", threads=cols_threads(n, slice_, blocks), blocks=blocks, slice=slice_,
                  cluster=blocks > 1)
    (rendered,) = render_all(Schedule(m, n, (panel,)), target)
    return rendered, cols.shared_bytes(panel, m, False, m, n)


def variant_source(source: str, variant: str) -> str:
    """The kernel's source with the variant's text in place (ValueError where an anchor is gone)."""
    for part in variant.split("+"):
        if part not in VARIANTS:
            raise ValueError(f"variant parts are {VARIANTS}, got {part!r}")
        if part == "branches":
            source = _replace(source, *BRANCHES)
        elif part == "split":
            for old, new in SPLIT:
                source = _replace(source, old, new)
        elif part == "latepush":
            if PUSH_START not in source or PUSH_END not in source:
                raise ValueError("the cols template changed: an anchor of tools/cols_trace.py is missing")
            i = source.index(PUSH_START)
            j = source.index(PUSH_END, i) + len(PUSH_END)
            push = "    auto push = [&]() {\n" + source[i:j] + "    };\n    if constexpr (I + 1 == S) push();\n"
            source = _replace(source[:i] + push + source[j:], *LATE_PUSH)
        elif part == "butterfly":
            if SCATTER_START not in source or SCATTER_END not in source:
                raise ValueError("the cols template changed: an anchor of tools/cols_trace.py is missing")
            i = source.index(SCATTER_START)
            source = source[:i] + "      warp_sum(d);\n" + source[source.index(SCATTER_END, i) + len(SCATTER_END):]
    return source


def instrument(source: str) -> str:
    """Lane 0 of the producing warp stores the clock after each reflector is published, and lane 0 of every
    consuming warp after it applied each of the first TRACED reflectors."""
    if PUBLISHED not in source or CONSUMED not in source or "struct ColsPanel" not in source:
        raise ValueError("the cols template changed: an anchor of tools/cols_trace.py is missing")
    stamp = "    if (lane == 0) qr_trace_clock[b * 1024 + col] = (unsigned)clock();\n"
    source = source.replace(PUBLISHED, PUBLISHED + stamp, 1)
    source = source.replace(CONSUMED, (
        "      consume<J>(c);\n"
        f"      if (lane == 0 && c < {TRACED})\n"
        f"        qr_trace_consumed[(b * {TRACED} + c) * {TRACE_WARPS} + g * WARPS + warp] = (unsigned)clock();\n"), 1)
    i = source.index("template <int M", source.index("struct ColsPanel") - 200)
    return source[:i] + TRACE_BUFFER + source[i:]


def run(batch: int, n: int, slice_: int, variant: str, trace: bool, blocks: int = 1, m: int | None = None) -> None:
    import cupy
    import numpy as np

    from qrgen.numerics.check import check
    from qrgen.numerics.stress import mixed

    m = n if m is None else m
    if trace and batch > TRACE_BATCH:
        raise ValueError(f"--trace stores clocks for at most {TRACE_BATCH} matrices, got a batch of {batch}")
    rendered, smem = kernel(n, slice_, blocks=blocks, m=m)
    source = variant_source(rendered.source, variant)
    source = instrument(source) if trace else source
    # qrgen's NVRTC options but the architecture, which CuPy sets for the current device
    module = cupy.RawModule(code=source, options=tuple(o for o in options("sm_90") if not o.startswith("--gpu-arch")))
    fn = module.get_function(rendered.name)
    fn.max_dynamic_shared_size_bytes = smem
    threads = cols_threads(n, slice_, blocks)
    a = cupy.asarray(np.random.default_rng(0).standard_normal((batch, m, n), dtype=np.float32))
    h, tau = cupy.empty_like(a), cupy.empty((batch, min(m, n)), cupy.float32)
    none, flags = cupy.empty(1, cupy.float32), cupy.zeros(1, cupy.uint32)

    def launch(x):
        fn((batch * blocks,), (threads,), (x, h, tau, none, none, none, flags, np.uint32(0), np.int32(0), np.int32(m),
                                  np.int32(m), np.int64(0), np.int32(batch)), shared_mem=smem)

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
    where = f" x{blocks} blocks" if blocks > 1 else ""
    shape = f"{n}²" if m == n else f"{m}x{n}"
    line = (f"{batch}x{shape} slice {slice_}{where} {variant}{' (traced)' if trace else ''}: "
            f"{statistics.median(times):.1f} µs; {check(a, h, tau)}")
    hostile = cupy.asarray(mixed(m, n, batch, seed=5)[0])
    launch(hostile)
    print(f"{line}; hostile {check(hostile, h, tau)}", flush=True)
    if trace:
        launch(a)
        cupy.cuda.runtime.deviceSynchronize()
        clocks = cupy.ndarray((TRACE_BATCH * 1024,), cupy.uint32, memptr=module.get_global("qr_trace_clock"))
        col = clocks[: batch * 1024].reshape(batch, 1024)[:, :n].get().astype(np.int64)
        step = np.median(np.diff(col - col[:, :1], axis=1), axis=0)
        inside = [step[i] for i in range(n - 1) if (i + 1) % slice_]
        handoff = [step[i] for i in range(n - 1) if not (i + 1) % slice_]
        print(f"  cycles first to last column {np.median(col[:, n - 1] - col[:, 0]):.0f}; inside a warp: median "
              f"{np.median(inside):.0f}; warp to warp: median {np.median(handoff):.0f}; the first two warps: "
              + " ".join(f"{x:.0f}" for x in step[: 2 * slice_]), flush=True)
        consumed = cupy.ndarray((TRACE_BATCH * TRACED * TRACE_WARPS,), cupy.uint32,
                                memptr=module.get_global("qr_trace_consumed"))
        done = consumed[: batch * TRACED * TRACE_WARPS].reshape(batch, TRACED, TRACE_WARPS).get().astype(np.int64)
        warps = -(-n // slice_)
        lag = [done[:, c, c // slice_ + 1: warps] - col[:, c: c + 1] for c in range(min(TRACED, n))]
        print("  reflectors 0-%d, cycles from publishing to the last consumer's update (median over matrices): "
              % (len(lag) - 1) + " ".join(f"{np.median(x.max(axis=1)):.0f}" for x in lag)
              + "; to the next producer's: " + " ".join(f"{np.median(x[:, 0]):.0f}" for x in lag), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("cases", nargs="+", metavar="BATCHxN or BATCHxMxN")
    ap.add_argument("--slice", type=int, default=8, help="columns a warp (default 8)")
    ap.add_argument("--blocks", type=int, default=1, choices=cols.BLOCKS, help="blocks a matrix (default 1)")
    ap.add_argument("--variant", action="append", help=f"'+'-joined parts of {VARIANTS} (repeatable; default shipped)")
    ap.add_argument("--trace", action="store_true", help="also run each variant with a clock per column")
    args = ap.parse_args()
    for case in args.cases:
        batch, *mn = (int(v) for v in case.lower().split("x"))
        m, n = mn if len(mn) == 2 else (mn[0], mn[0])
        for variant in args.variant or ["shipped"]:
            for trace in (False, True) if args.trace else (False,):
                run(batch, n, args.slice, variant, trace, args.blocks, m)


if __name__ == "__main__":
    main()
