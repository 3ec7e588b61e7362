"""A rough time model of a schedule on the H200, for searching without a GPU.

Calibrated against `qrgen bench --profile` on the H200 (BENCHMARKS.md, 2026-11-30): per-column latency of the
warp/rows panel kernels (1.7 to 4 µs), the flag exchange of multi-block panels (about 10 µs per column on the tall
shapes; 2 x 4096² with two blocks of 1024 threads paid about 70, not yet understood), cuBLAS
trailing-update GEMMs (about half the fp32 rate at rank 32, memory-bound and slower at rank 8 and 16), and the host's
cost per launch. cuBLAS products with few output tiles run on few SMs when the batch is small (2 x 4096 rows,
8 x 120 output: 61 µs); the split kernels fill the GPU but compute at 2.7 to 5.5 TFLOP/s (scripts/skinny_bench.py).
The lanes term and the clusters' exchange are fitted to single panels replayed alone (twenty-first session: a
barrier per column over more warps costs more, so does a longer slot loop); the cols term is an instruction count over the clock
(cols measured slower than lanes; not fitted); the tsqr term is fitted to each of its launches timed alone.
It ranks schedules; it does not replace measuring them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..plan import fused, whole
from ..plan.layout import aggregates
from ..plan.planner import plan, resources
from ..problem import Problem
from ..schedule.model import Schedule
from ..targets import Target

SM90 = Target()

SMS = 132
CLOCK_HZ = 1.7e9
BANDWIDTH = 3.0e12  # bytes/s a trailing-update GEMM reaches at rank 32
RATE = {"fp32": 25e12, "tf32": 200e12, "bf16": 350e12, "fp16": 350e12,  # FLOP/s reached, not peak
        "tf32x3": 40e12}  # the gemm3 kernels: 1.5-1.6x cuBLAS fp32 on the H200 (BENCHMARKS.md, twelfth session)
HOST_US_PER_LAUNCH = 10.0
GEMM_FIXED_US = 8.0
MULTI_BLOCK_US_PER_COLUMN = 10.0
# A cluster's exchange per column over one block's chain: one 32-column lanes panel alone (scripts/panel_bench.py,
# BENCHMARKS.md, twenty-first session) ran 1.15-1.18 µs a column on clusters of 8 (8 x 2048 rows, 512 threads a
# block), 1.25-1.27 on clusters of 16 (2 x 4096), against 0.92-0.99 on one block of 512 threads (60 x 256).
CLUSTER_US_PER_COLUMN = 0.25
# FLOP/s of the split kernels: 5.5e12 measured where they split the rows (8 x 2048 rows, 16 x 112), 2.7e12 where
# the batch alone fills the GPU and each block walks long row ranges (60 x 1024 rows, 32 x 96)
SPLIT_RATE = {True: 5.5e12, False: 2.7e12}
SPLIT_FIXED_US = 5.0
# tsqr panels, fitted to each launch alone on the H200 (BENCHMARKS.md, thirteenth session, scripts/tsqr_phases.py,
# 16 columns, 256 threads, tiles of 512 rows): a level's factorization 13.6-17.6 µs (~0.95 µs a column), an
# expansion 3-5 µs, the final phase 22.6 µs over 40,000 rows and 31.0 over 100,000.
TSQR_US_PER_COLUMN = 0.95
TSQR_EXPAND_US = 4.0
TSQR_FINAL_US = 17.0
TSQR_FINAL_US_PER_ENTRY = 8.75e-6  # per row and column of the panel


# A "whole" kernel: about 1.5 µs a column for each wave of resident blocks, fitted on the H200 (BENCHMARKS.md,
# twenty-fourth session; graph replay): 4000 x 48² 144 µs (1.9 waves of 16 blocks an SM), 2000 x 64² 182 (1.9 of
# 8), 40 x 176² 271 (one block each), 100 x 64² 85.
WHOLE_US_PER_COLUMN = 1.5


@dataclass(frozen=True)
class Estimate:
    total_us: float
    panel_us: float
    gemm_us: float
    host_us: float


def _column_us(variant: str, threads: int, slots: int, width: int, slice_: int) -> float:
    if variant == "lanes":  # refitted to one panel alone on the H200 (twenty-first session; scripts/panel_bench.py):
        # 512 threads, 16 rows a warp 0.92-0.99 µs a column; 704 threads, 16 rows 1.08-1.11
        return 0.23 + 0.025 * (threads // 32) + 0.02 * slots
    if variant == "cols":
        return (2 * slots * slice_ + 10 * slice_ + 40) / CLOCK_HZ * 1e6
    return 1.2 + 0.08 * slots * width / 8 + 0.3 * math.log2(threads / 32)


def _blocks_per_sm(threads: int, registers: int) -> int:
    by_regs = 65536 // max(1, registers * threads)
    return max(1, min(by_regs, 2048 // threads, 32))


def _gemm_us(rows: int, cols: int, depth: int, batch: int, precision: str, passes: int) -> float:
    """A product of (rows x depth) by (depth x cols) per matrix whose output (rows x cols) is read `passes` times
    (or, `passes` 1 with rows small, whose long input C, depth x cols, is read once)."""
    flops = 2.0 * rows * cols * depth * batch
    bandwidth = BANDWIDTH * min(1.0, depth / 32) ** 0.8
    # cuBLAS splits K itself for a single matrix; for a few, about four blocks per 128 x 128 output tile
    fill = 1.0 if batch == 1 else min(1.0, 4 * batch * math.ceil(rows / 128) * math.ceil(cols / 128) / SMS)
    touched = max(rows, depth) * cols if passes == 1 else rows * cols
    return max(flops / RATE[precision], passes * 4.0 * touched * batch / (bandwidth * fill)) * 1e6 + GEMM_FIXED_US


def _rowsplit_us(rows: int, cols: int, width: int, batch: int, passes: int) -> float:
    """A split kernel over C (rows x cols per matrix) with panels of `width` columns, C read `passes` times."""
    rate = SPLIT_RATE[batch * math.ceil(cols / 32) < SMS]
    return max(2.0 * rows * cols * width * batch / rate,
               passes * 4.0 * rows * cols * batch / BANDWIDTH) * 1e6 + SPLIT_FIXED_US


# The fused panel products (one block per 32 columns per matrix, two resident per SM): about 0.027 µs a row for a
# block alone at width 32, slower where blocks share SMs. Fitted to the 60 x 1024² panels' launches on the H200
# (scripts/lanes_timeline.py, fourteenth session): 1024 rows, 32, 64 and 96 columns (60, 120, 180 blocks) 32, 33
# and 50 µs. Where a launch splits the rows over a cluster (plan/fused.cluster) each block walks its share of
# them, the blocks' partial W added for free (not fitted: the launches on clusters were timed only as whole
# factorizations, BENCHMARKS.md, fifteenth session).
FUSED_US_PER_ROW = 0.027
FUSED_FIXED_US = 5.0


def fused_us(rows: int, cols: int, width: int, batch: int) -> float:
    cluster = fused.cluster(batch, cols, rows, SMS)
    load = max(1.0, batch * math.ceil(cols / 32) * cluster / SMS)
    wp = fused.layout(width)["wp"]
    return FUSED_FIXED_US + -(-rows // cluster) * FUSED_US_PER_ROW * (0.25 + 0.75 * wp / 32) * load ** 1.4


def _tsqr_us(L, batch: int, registers: int) -> float:
    """A tsqr panel: each level's factorization (in waves of its tiles over the SMs), the expansions, the final
    phase."""
    per_sm = _blocks_per_sm(L.threads, registers)
    factor = sum(L.width * TSQR_US_PER_COLUMN * max(1.0, batch * tiles / (SMS * per_sm)) for _, tiles in L.levels)
    final = (TSQR_FINAL_US + TSQR_FINAL_US_PER_ENTRY * L.rows * L.width) * max(1.0, batch * L.levels[0][1] /
                                                                               (SMS * per_sm))
    return factor + TSQR_EXPAND_US * (len(L.levels) - 1) + final


def estimate(schedule: Schedule, problem: Problem) -> Estimate:
    p = plan(schedule, SM90)
    kernels, launches = {k.name: k for k in p.kernels}, p.launches
    batch = problem.batch
    prec = schedule.precision
    panel_us = gemm_us = 0.0
    n_launches = 0
    for index, L in enumerate(launches):
        res = resources(schedule, index, SM90)
        panel = schedule.panels[index]
        if L.inner:
            per_sm = min(whole.min_blocks(kernels[L.kernel], SM90.limits), 2048 // L.threads, 32)
            panel_us += L.width * WHOLE_US_PER_COLUMN * max(1.0, batch / (SMS * per_sm))
            n_launches += 1
        elif L.levels:
            panel_us += _tsqr_us(L, batch, res.registers)
            n_launches += 2 * len(L.levels)
        else:
            n_launches += 1
            waves = max(1.0, batch * L.blocks / (SMS * _blocks_per_sm(L.threads, res.registers)))
            per_column = _column_us(panel.variant, L.threads, res.slots, L.width, panel.slice)
            if L.blocks > 1:
                per_column += CLUSTER_US_PER_COLUMN if L.cluster else MULTI_BLOCK_US_PER_COLUMN
            panel_us += L.width * per_column * waves
        if L.nc > 0 and schedule.panel_update == "rowsplit":
            gemm_us += _rowsplit_us(L.rows, L.nc, L.width, batch, 1) + _rowsplit_us(L.rows, L.nc, L.width, batch, 2)
            n_launches += 2
        elif L.nc > 0 and schedule.panel_update == "fused":
            gemm_us += fused_us(L.rows, L.nc, L.width, batch)
            n_launches += 1
        elif L.nc > 0:
            # W (width x nc) reads C once; C -= V W reads and writes it.
            gemm_us += _gemm_us(L.width, L.nc, L.rows, batch, prec.project, 1)
            gemm_us += _gemm_us(L.rows, L.nc, L.width, batch, prec.update, 2)
            n_launches += 2
    for agg in aggregates(schedule):
        if agg.nc > 0:
            a = agg.a1 - agg.a0
            gemm_us += _gemm_us(a, a, agg.rows, batch, prec.gram, 1) + _gemm_us(a, agg.rows, a, batch, "fp32", 1)
            gemm_us += _gemm_us(a, agg.nc, agg.rows, batch, prec.project, 1)
            gemm_us += _gemm_us(agg.rows, agg.nc, a, batch, prec.update, 2)
            panel_us += a * 0.05  # the T kernel (a guess per column from its first, one-thread-a-row form; not refit)
            n_launches += 6
    host_us = n_launches * HOST_US_PER_LAUNCH
    return Estimate(max(panel_us + gemm_us, host_us), panel_us, gemm_us, host_us)
