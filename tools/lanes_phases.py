"""Where a lanes panel's column spends its cycles, phase by phase (needs a CUDA GPU).

    python3 tools/lanes_phases.py 40x176x32:slots=8 8x2048x32:slots=16,blocks=8

A case is BATCHxMx32:slots=S[,blocks=B]: one 32-column lanes panel of M rows (templates/cuda/panel_lanes.cuh,
about S rows a warp, on B blocks: a cluster when B > 1; qrgen.schedule.panels.lanes_panel) is rendered,
`clock64()` stored at each phase boundary of every column by lane 0 of warp 0 and of the last warp of every block,
run on BATCH random matrices, and the medians over columns 2-29 and all blocks printed in cycles. Phases of a column
on one block: the dots (shuffles and FMAs), the partial dots to shared memory and the first barrier, warp 0's sums,
reflector and coefficients, the second barrier, the coefficients read back, the update (to the next column's
start). On a cluster: the dots, the barrier, warp 0's pushes of the block's sums to every block, the wait on the
block's mbarrier, every warp's sum of the blocks' sums and the reflector, the update. A phase's cycles include
waiting for other warps (the SM's issue slots are shared), and the stores of the clocks cost the kernel some time
of their own (its event time is printed).

panel_kernel and instrument need no GPU (tests/compile checks that every anchor is still in the template).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import cupy
import numpy as np

from qrgen.plan.planner import plan
from qrgen.render.sources import render
from qrgen.run.launch import CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
from qrgen.schedule.model import Precision, Schedule
from qrgen.schedule.panels import lanes_panel
from qrgen.targets import Target
from tools import cases

WIDTH = 32  # the panel's columns
MARKS = 6  # clock slots a column: 0 start, 1 after the dots, 2-4 the exchange, 5 before the update
PHASES = {False: ("dots", "sums to shared + barrier", "warp 0: sums, reflector, coefficients", "second barrier",
                  "coefficients read", "update"),
          True: ("dots", "sums to shared + barrier", "warp 0: pushes", "mbarrier wait",
                 "sums of the blocks + reflector", "update")}
FIELDS = {"slots": int, "blocks": int}


def instrument(source: str, columns: int, blocks: int) -> str:
    """The rendered kernel with clock64() stores at the phase boundaries into a __device__ array qr_phase_clock of
    blocks x 2 (warp 0, last warp) x (columns + 1) x MARKS entries (column `columns` holds the loop's end).
    ValueError where an anchor is missing (the template changed)."""
    def sub(old, new, count=1):
        nonlocal source
        if source.count(old) < count:
            raise ValueError(f"the lanes template changed: {old[:60]!r}... not found {count} time(s)")
        source = source.replace(old, new, count)

    def mark(slot):
        return (f"if (t == 0 || t == THREADS - 32) qr_phase_clock[((blockIdx.x * 2 + (t != 0)) * (NB + 1) + "
                f"(QR_PHASE_COLUMN)) * {MARKS} + {slot}] = clock64();")

    head = ("template <int M, int N, int K, int SLOTS, int NB, int THREADS, bool TRAIL, int BLOCKS, bool CLUSTER, "
            "bool FORMQ,\n          int PACK>\nstruct LanesPanel")
    sub(head, f"__device__ long long qr_phase_clock[{blocks} * 2 * {columns + 1} * {MARKS}];\n" + head)
    sub("  __device__ __forceinline__ void column(int j) {",
        "  __device__ __forceinline__ void column(int j) {\n#define QR_PHASE_COLUMN j\n" + mark(0))
    dots = "    float tot = (p[0] + p[1]) + (p[2] + p[3]);\n"
    sub(dots, dots + mark(1) + "\n")
    # a cluster: after the block's barrier, around the mbarrier wait
    sub("      block_barrier();\n      if (t == 0) mbar_arrive_expect",
        "      block_barrier();\n" + mark(2) + "\n      if (t == 0) mbar_arrive_expect")
    sub("      mbar_wait(&sm.bar[buf], (unsigned)(j >> 1) & 1u);",
        mark(3) + "\n      mbar_wait(&sm.bar[buf], (unsigned)(j >> 1) & 1u);\n" + mark(4))
    # one block: after the first barrier, around the second
    sub("      block_barrier();\n      if (warp == 0) {",
        "      block_barrier();\n" + mark(2) + "\n      if (warp == 0) {")
    sub("      }\n      block_barrier();\n      ws = sm.cf[buf][0][lane];",
        "      }\n" + mark(3) + "\n      block_barrier();\n" + mark(4) + "\n      ws = sm.cf[buf][0][lane];")
    sub("    // Selects, not branches", mark(5) + "\n    // Selects, not branches")
    loop = "#pragma unroll 1\n      for (int j = 0; j < NB; ++j) column(j);\n"
    sub(loop, loop + "#undef QR_PHASE_COLUMN\n#define QR_PHASE_COLUMN NB\n" + mark(0) + "\n")
    return source


def panel_kernel(rows: int, slots: int, blocks: int, target: Target = Target()):
    """(schedule, panel, kernel spec) of one 32-column lanes panel of `rows` rows, about `slots` rows a warp, on
    `blocks` blocks; SystemExit where there is no such panel of several warps."""
    panel = lanes_panel(rows, WIDTH, slots, blocks, target)
    if panel is None or panel.threads == 32 and blocks == 1:
        raise SystemExit(f"no lanes panel of several warps for {rows} rows, {slots} rows a warp, {blocks} blocks")
    schedule = Schedule(rows, WIDTH, (panel,), Precision())
    return schedule, panel, plan(schedule, target).kernels[0]


def phases(case, target: Target) -> str:
    fields = cases.overrides(case.options, FIELDS)
    if case.n != WIDTH or "slots" not in fields:
        raise SystemExit(f"{case}: a case is BATCHxMx{WIDTH}:slots=S[,blocks=B]")
    batch, rows, blocks = case.batch, case.m, fields.get("blocks", 1)
    schedule, panel, kernel = panel_kernel(rows, fields["slots"], blocks, target)
    source = instrument(render(kernel, schedule, target).source, WIDTH, batch * panel.blocks)
    module = cupy.RawModule(code=source, options=("-std=c++17",))  # CuPy compiles for the current device
    fn = module.get_function(kernel.name)
    cupy.cuda.driver.funcSetAttribute(fn.kernel.ptr, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    (a,) = cases.random_inputs(batch, rows, WIDTH, count=1)
    h, tau = a.copy(), cupy.empty((batch, WIDTH), cupy.float32)
    unused, flags = cupy.zeros(16, cupy.float32), cupy.zeros(batch, cupy.uint32)
    # the panel kernels' parameters (qrgen.plan.family.PANEL_SIGNATURE): src, h, tau, vt, zt, exchange, flags,
    # epoch, c0, rows, vld, vbs, nb
    args = (h, h, tau, unused, unused, unused, flags, np.uint32(0), np.int32(0), np.int32(rows), np.int32(rows),
            np.int64(0), np.int32(batch))
    start, stop, times = cupy.cuda.Event(), cupy.cuda.Event(), []
    for i in range(13):
        h[...] = a
        start.record()
        fn((batch * panel.blocks,), (panel.threads,), args)
        stop.record()
        stop.synchronize()
        if i >= 3:
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
    shape = (batch * panel.blocks, 2, WIDTH + 1, MARKS)
    clocks = cupy.asnumpy(cupy.ndarray((int(np.prod(shape)),), cupy.int64,
                                       memptr=module.get_global("qr_phase_clock"))).reshape(shape)
    lines = [f"{case}: {panel.threads} threads x {panel.blocks} block(s), kernel {np.median(times):.1f} µs (events, "
             f"clocks stored)"]
    names = PHASES[panel.blocks > 1]
    for who, label in ((0, "warp 0"), (1, "last warp")):
        following = clocks[:, who, 1:, 0]  # the next column's start (the last entry: the loop's end)
        bounds = np.concatenate([clocks[:, who, :WIDTH, :], following[..., None]], axis=-1)
        step = np.diff(bounds, axis=-1)  # (blocks, columns, phases)
        med = np.median(step[:, 2:WIDTH - 2, :].reshape(-1, MARKS), axis=0)
        total = np.median((following - clocks[:, who, :WIDTH, 0])[:, 2:WIDTH - 2])
        lines.append(f"  {label}: a column {total:,.0f} cycles: "
                     + ", ".join(f"{n} {v:,.0f}" for n, v in zip(names, med)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("cases", nargs="+", type=cases.case_with_options, metavar=f"BATCHxMx{WIDTH}:slots=S[,blocks=B]")
    args = ap.parse_args()
    target = cases.target()
    for case in args.cases:
        try:
            print(phases(case, target), flush=True)
        except ValueError as exc:
            raise SystemExit(f"{case}: {exc}") from None


if __name__ == "__main__":
    main()
