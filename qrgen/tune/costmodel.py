"""A rough time model of a schedule on the H200, for searching without a GPU: per-column latency of each panel
family, the multi-block flag exchange and the clusters' exchange, the trailing-update products by rate and by
bytes, the rowsplit, fused, tsqr and whole kernels, and the host's cost per launch, each term fitted to launches
measured on the H200 (docs/decisions.md#costmodel-calibration and the entries after it). It ranks schedules; it does
not replace measuring them."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..plan import fused, tf32x3, whole
from ..plan.family import panel_grid
from ..plan.layout import aggregates
from ..plan.planner import plan, resources, t_late
from ..problem import Problem
from ..schedule.model import Schedule
from ..targets import Target

SM90 = Target()

SMS = 132
CLOCK_HZ = 1.7e9
BANDWIDTH = 3.0e12  # bytes/s a trailing-update GEMM reaches at rank 32
RATE = {"fp32": 25e12, "tf32": 200e12, "bf16": 350e12, "fp16": 350e12,  # FLOP/s reached, not peak
        "tf32x3": 40e12}  # the tf32x3 kernels (docs/decisions.md#costmodel-tf32x3-rate)
HOST_US_PER_LAUNCH = 10.0
GEMM_FIXED_US = 8.0
MULTI_BLOCK_US_PER_COLUMN = 10.0
# A cluster's exchange per column over one block's chain (docs/decisions.md#costmodel-lanes-and-clusters)
CLUSTER_US_PER_COLUMN = 0.25
# FLOP/s of the rowsplit kernels where they split the rows, and where the batch alone fills the GPU and each block
# walks long row ranges (docs/decisions.md#costmodel-split)
SPLIT_RATE = {True: 5.5e12, False: 2.7e12}
SPLIT_FIXED_US = 5.0
# tsqr panels: a level's factorization per column, an expansion, the final phase (docs/decisions.md#costmodel-tsqr)
TSQR_US_PER_COLUMN = 0.95
TSQR_EXPAND_US = 4.0
TSQR_FINAL_US = 17.0
TSQR_FINAL_US_PER_ENTRY = 8.75e-6  # per row and column of the panel


# A "whole" kernel: per column for each wave of resident blocks (docs/decisions.md#costmodel-whole)
WHOLE_US_PER_COLUMN = 1.5
# A cols panel that forms its aggregate's G and T (Launch.t_out), per column for each wave of blocks; its merge
# then launches neither the gram nor the T kernel (docs/decisions.md#costmodel-t-out)
T_OUT_US_PER_COLUMN = 0.15


@dataclass(frozen=True)
class Estimate:
    total_us: float
    panel_us: float
    gemm_us: float
    host_us: float


def _column_us(variant: str, threads: int, slots: int, width: int, slice_: int) -> float:
    if variant == "lanes":  # fitted to one panel alone (docs/decisions.md#costmodel-lanes-and-clusters)
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


# The fused panel products: a time per row for a block alone, slower where blocks share SMs; where a launch splits
# the rows over a cluster (plan/fused.cluster) each block walks its share (docs/decisions.md#costmodel-fused)
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
            waves = max(1.0, panel_grid(L, batch) / (SMS * _blocks_per_sm(L.threads, res.registers)))
            per_column = _column_us(panel.variant, L.threads, res.slots, L.width, panel.slice)
            if L.blocks > 1:
                per_column += CLUSTER_US_PER_COLUMN if L.cluster else MULTI_BLOCK_US_PER_COLUMN
            panel_us += L.width * (per_column + (T_OUT_US_PER_COLUMN if L.t_out else 0.0)) * waves
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
            if not launches[agg.last].t_out:  # G and T, unless its panel formed them
                gemm_us += _gemm_us(a, a, agg.rows, batch, prec.gram, 1)
                panel_us += a * 0.05  # the T kernel (a guess per column from its first, one-thread-a-row form)
                n_launches += 2
            if t_late(schedule, agg, launches[agg.last].t_out):  # W = T^T (V^T C), G and T beside V^T C
                gemm_us += _gemm_us(a, agg.nc, a, batch, "fp32", 1)
                n_launches += 1
            elif not tf32x3.t_fused(schedule, agg):  # (VT)^T, unless the projection applies T
                gemm_us += _gemm_us(a, agg.rows, a, batch, "fp32", 1)
                n_launches += 1
            gemm_us += _gemm_us(a, agg.nc, agg.rows, batch, prec.project, 1)
            gemm_us += _gemm_us(agg.rows, agg.nc, a, batch, prec.update, 2)
            n_launches += 2
    host_us = n_launches * HOST_US_PER_LAUNCH
    return Estimate(max(panel_us + gemm_us, host_us), panel_us, gemm_us, host_us)
