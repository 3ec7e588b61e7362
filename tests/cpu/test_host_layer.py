"""CPU layer, CUDA: the panel kernels qrgen ships for NVIDIA GPUs, rendered over the host layer (templates/cuda/
host/) and run on the CPU (qrgen/compile/host.py, threads as fibers) inside the launch sequence
(run/host_engine.py, cuBLAS's products in NumPy), pass the gates on a batch of every stress family with twice the
margin: every panel family (lanes on one warp, on a block and on clusters, cols with and without clusters, rows on
one block, on clusters and cooperative, whole, tsqr with rows and with cols tiles) and the default schedules of the
many-small shapes, those that wait for each other in drawn turn orders too, and random points of the tuning space;
and qrgen.qr's Q and R on each of its paths (the fused Q kernel, a keep plan, h and tau). The T, scale, rowsplit
and fused product kernels run in the sequence too."""
import random
from dataclasses import replace

import numpy as np
import pytest

from kernel_cases import COLS_SCHEDULES, LANES_SCHEDULES, TSQR_COLS_SCHEDULES
from qrgen.compile import host
from qrgen.numerics import reference
from qrgen.numerics.check import FACTOR_GATE, ORTHOGONALITY_GATE, check
from qrgen.numerics.stress import FAMILIES, mixed
from qrgen.plan.family import PANEL_SIGNATURE
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.render.environment import environment, layer
from qrgen.run import host_engine
from qrgen.run.launch import PackedArgs
from qrgen.schedule.files import find
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.targets import Target
from qrgen.tune import space

TARGET = Target()

# the test schedules beside the kernel cases: rows on one block, cooperative (flags) and on a cluster; whole; tsqr;
# a panel's own products by the rowsplit and the fused kernels; the tf32x3 and apply3 product kernels
OTHER_SCHEDULES = {
    "rows_96x64": Schedule(96, 64, (Panel(32, "rows", 128), Panel(32, "rows", 128))),
    "rows_cooperative_2048x64": Schedule(2048, 64, (Panel(32, "rows", 256, 4), Panel(32, "rows", 256, 4))),
    "rows_cluster_1024x64": Schedule(1024, 64, (Panel(32, "rows", 128, 4, cluster=True),) * 2),
    "whole_64x64": Schedule(64, 64, (Panel(64, "whole", 256, slice=16),)),
    # the panels' own products by the rowsplit kernels (partial sums over row blocks, the last block adding them)
    "rows_rowsplit_300x200": Schedule(300, 200, (Panel(32, "rows", 256),) * 6 + (Panel(8, "rows", 256),),
                                      panel_update="rowsplit"),
    "warp_rowsplit_200x96": Schedule(200, 96, (Panel(16, "warp", 32),) * 6, panel_update="rowsplit", aggregate=64),
    # ... and by the fused kernel, on one block and with the rows split over clusters (along z) of 2 to 8 blocks
    "warp_fused_200x96": Schedule(200, 96, (Panel(16, "warp", 32),) * 6, panel_update="fused", aggregate=64),
    "rows_fused_clusters_1024x128": Schedule(1024, 128, (Panel(32, "rows", 256),) * 4, panel_update="fused"),
    # the aggregates' products by the tf32x3 kernels and the apply3 kernel (tensor-core products on the layer)
    "rows_tf32x3_apply3_192x160": Schedule(192, 160, (Panel(32, "rows", 256),) * 5,
                                           Precision("fp32", "tf32x3", "tf32x3"), aggregate=64,
                                           aggregate_update="fused"),
    # a tree of several levels with a ragged last tile, a width no multiple of 4, in aggregates
    "tsqr_3000x21": Schedule(3000, 21, tuple(Panel(min(8, 21 - c), "tsqr", 64, tile=128) for c in range(0, 21, 8)),
                             aggregate=16),
    # cols tiles with the panels' own products by the rowsplit kernels (the default for several tall matrices)
    "tsqr_cols_rowsplit_3000x40": Schedule(3000, 40, (Panel(16, "tsqr", 256, tile=256, slice=2),) * 2
                                           + (Panel(8, "tsqr", 128, tile=256, slice=2),), panel_update="rowsplit"),
}
# the default schedules of the many-small shapes (batch, m, n), whatever families they pick
DEFAULTS = [(4000, 16, 16), (20, 32, 32), (1000, 64, 64), (500, 128, 128), (40, 128, 128), (100, 256, 256)]
TALL = ("4096x64", "1000x300", "2048x96")  # lanes cases on clusters of many blocks: two matrices, not ten


def _gates(schedule, batch=len(FAMILIES), order=0, straggler=-1, target=TARGET, scale=1.0):
    a, labels = mixed(schedule.m, schedule.n, batch, seed=schedule.m + schedule.n)
    a *= np.float32(scale)
    h, tau = host_engine.geqrf(a, schedule, target, order, straggler)
    result = check(a, h, tau, FACTOR_GATE / 2, ORTHOGONALITY_GATE / 2)
    assert result.ok, f"{target.arch} x{scale:g} {[l for l, p in zip(labels, result.passed) if not p]}: {result}"


def _last_warp(schedule):
    """The last warp of the largest group of the schedule's panel kernels (on a cluster, its last block's)."""
    variants = {p.variant for p in schedule.panels}
    return max(k.blocks * k.threads for k in plan(schedule, TARGET).kernels if k.variant in variants) // 32 - 1


def _name(s):
    return f"{s.m}x{s.n}_" + "_".join(f"{p.variant}{p.width}" + (f"b{p.blocks}" if p.blocks > 1 else "")
                                      for p in s.panels[:3])


@pytest.mark.parametrize("schedule", LANES_SCHEDULES + COLS_SCHEDULES + TSQR_COLS_SCHEDULES, ids=_name)
def test_lanes_and_cols_kernels_pass_the_gates_on_the_cpu(schedule):
    _gates(schedule, 2 if f"{schedule.m}x{schedule.n}" in TALL else len(FAMILIES))


@pytest.mark.parametrize("case", OTHER_SCHEDULES)
def test_rows_whole_tsqr_rowsplit_and_fused_kernels_pass_the_gates_on_the_cpu(case):
    schedule = OTHER_SCHEDULES[case]
    assert {p.variant for p in schedule.panels} == {case.split("_")[0]}
    _gates(schedule)


@pytest.mark.parametrize("batch,m,n", DEFAULTS, ids=[f"{b}x{m}x{n}" for b, m, n in DEFAULTS])
def test_the_many_small_defaults_pass_the_gates_on_the_cpu(batch, m, n):
    _gates(find(Problem(m, n, batch), TARGET)[0])


# single tall matrices whose defaults put a panel on a cluster of 16 blocks of more than 256 threads (the layer's
# largest groups: over 4096 fibers), two matrices each
TALL_DEFAULTS = [(1, 5000, 3), (1, 3000, 96)]


@pytest.mark.parametrize("batch,m,n", TALL_DEFAULTS, ids=[f"{b}x{m}x{n}" for b, m, n in TALL_DEFAULTS])
def test_tall_defaults_on_clusters_of_16_blocks_pass_the_gates_on_the_cpu(batch, m, n):
    schedule = find(Problem(m, n, batch), TARGET)[0]
    assert max(k.blocks * k.threads for k in plan(schedule, TARGET).kernels) > 4096
    _gates(schedule, 2)


def test_the_default_for_several_tall_matrices_passes_the_gates_on_the_cpu():
    """Two matrices past FUSED_MAX_ROWS rows: lanes panels on clusters of 16 blocks, their own products by the
    rowsplit kernels (docs/decisions.md#rowsplit-batches); past TSQR_FROM rows tsqr panels with the same products
    (a last panel of 8 columns on 128 threads, docs/decisions.md#tsqr-default), for 2 matrices and for 5 (more than
    the former limit of 4)."""
    from qrgen.schedule.heuristic import TSQR_FROM

    schedule = find(Problem(4200, 40, 2), TARGET)[0]
    assert schedule.panel_update == "rowsplit"
    _gates(schedule, 2)
    for batch in (2, 5):
        schedule = find(Problem(TSQR_FROM + 7, 40, batch), TARGET)[0]
        assert {p.variant for p in schedule.panels} == {"tsqr"} and schedule.panel_update == "rowsplit"
        _gates(schedule, batch)


def test_rowsplit_updates_take_every_row_tile_past_the_grid_limit(monkeypatch):
    """The rowsplit update's grid stops at CUDA's grid.y limit (a matrix of 4,194,241 rows or more has more 64-row
    tiles), the further row tiles coming in grid.x: with the limit at 2 blocks, h and tau are the unlimited
    launch's bit for bit."""
    from qrgen.plan import rowsplit

    assert rowsplit.update_grid(4_200_000, 100, 2) == (8, 65535, 2) and rowsplit.update_grid(300, 40, 3) == (2, 5, 3)
    schedule = OTHER_SCHEDULES["rows_rowsplit_300x200"]
    a, _ = mixed(schedule.m, schedule.n, 2, seed=5)
    h, tau = host_engine.geqrf(a, schedule, TARGET)
    monkeypatch.setattr(rowsplit, "ROW_BLOCKS_MAX", 2)
    h2, tau2 = host_engine.geqrf(a, schedule, TARGET)
    assert np.array_equal(h, h2) and np.array_equal(tau, tau2)


def test_tsqr_aggregates_split_their_projections_and_update_in_row_pieces_on_the_cpu(monkeypatch):
    """One tall matrix's default: tsqr panels whose aggregates' products take the tf32x3 kernels, each projection's
    K in parts (run/buffers.w_parts) added into the first, the update in pieces of rows past CUDA's grid.y (here with
    the limit at 2 row tiles: bit for bit the launch of one piece). docs/decisions.md#tsqr-tf32x3."""
    from qrgen.plan import tf32x3
    from qrgen.schedule.heuristic import TSQR_PANEL, TSQR_PRECISION

    panel = Panel(TSQR_PANEL["width"], "tsqr", TSQR_PANEL["threads"], tile=TSQR_PANEL["tile"],
                  slice=TSQR_PANEL["slice"])
    schedule = Schedule(2048, 128, (panel,) * 8, TSQR_PRECISION, aggregate=64)
    # dense matrices: a stress family's trailing columns may be in the span of the first 64 (W zero)
    a = np.random.default_rng(7).standard_normal((2, schedule.m, schedule.n), dtype=np.float32)
    engine_log = []
    real = host_engine.HostKernelEngine.__init__

    def keep_log(self, *args, **kwargs):
        real(self, *args, **kwargs)
        engine_log.append(self.log)

    monkeypatch.setattr(host_engine.HostKernelEngine, "__init__", keep_log)
    h, tau = host_engine.geqrf(a, schedule, TARGET)
    assert check(a, h, tau, FACTOR_GATE / 2, ORTHOGONALITY_GATE / 2).ok
    # 2048 rows in parts of at least PART_ROWS: 8 parts for the one aggregate with columns right of it
    assert [e for e in engine_log[0] if e[0] == "parts"] == [("parts", "project", 2048 // tf32x3.PART_ROWS)]
    monkeypatch.setattr(tf32x3, "ROW_TILES_MAX", 2)
    assert len(tf32x3.row_pieces("update", 2048)) == 16
    h2, tau2 = host_engine.geqrf(a, schedule, TARGET)
    assert np.array_equal(h, h2) and np.array_equal(tau, tau2)


def test_the_tall_cols_default_passes_the_gates_on_the_cpu():
    """default_cols_tall at 640 x 576: cols panels on clusters of two, the 96-column ones holding one block's share
    of the reflectors (slot reuse), two matrices of every stress family mixed."""
    schedule = find(Problem(640, 576, 60), TARGET)[0]
    assert any(k.name.endswith("_r") for k in plan(schedule, TARGET).kernels)
    _gates(schedule, 2)


# the range of scales README's known limitation states: a batch of every stress family multiplied by 2^-40 and 2^40
# (column norms are float32 sums of squares; past about 2^±50 the smallest or largest fail)
@pytest.mark.parametrize("batch,m,n", [(4, 32, 32), (4, 176, 176), (1, 3000, 96)], ids=["32x32", "176x176", "3000x96"])
def test_matrices_scaled_by_2_to_the_plus_or_minus_40_pass_the_gates_on_the_cpu(batch, m, n):
    schedule = find(Problem(m, n, batch), TARGET)[0]
    for k in (-40, 40):
        _gates(schedule, scale=2.0 ** k)


# the schedules qrgen picks for other architectures (their shared memory and clusters change the panels): the
# reference shapes that differ from sm_90's, four matrices each
OTHER_ARCHS = ("sm_80", "sm_89", "sm_120")
ARCH_SHAPES = [(40, 176, 176), (7, 300, 300), (1, 3000, 96)]


@pytest.mark.parametrize("arch", OTHER_ARCHS)
def test_the_schedules_picked_for_other_archs_pass_the_gates_on_the_cpu(arch):
    target = Target(arch=arch)
    for batch, m, n in ARCH_SHAPES:
        schedule = find(Problem(m, n, batch), target)[0]
        assert schedule != find(Problem(m, n, batch), TARGET)[0]
        _gates(schedule, 4, target=target)


# kernels whose warps or blocks wait for each other: in drawn turn orders (warps sitting out rounds), where a wait
# or barrier a kernel lacked would show (a cooperative panel's flag arriving twice does)
DRAWN = {"cols_176x176": COLS_SCHEDULES[0], "cols_cluster_352x352": COLS_SCHEDULES[6],
         "cols_clusters_3_4_8_352x352": COLS_SCHEDULES[11], "cols_cluster_3_prep_300x200": COLS_SCHEDULES[13],
         "lanes_cluster_2048x96": LANES_SCHEDULES[10], "lanes_block_160x160": LANES_SCHEDULES[17],
         "rows_cooperative_2048x64": OTHER_SCHEDULES["rows_cooperative_2048x64"],
         "rows_cluster_1024x64": OTHER_SCHEDULES["rows_cluster_1024x64"],
         "cols_reuse_1024x192": COLS_SCHEDULES[-2], "tsqr_cols_3000x21": TSQR_COLS_SCHEDULES[0]}


@pytest.mark.parametrize("case", DRAWN)
def test_kernels_that_wait_pass_in_drawn_turn_orders_on_the_cpu(case):
    _gates(DRAWN[case], 2, order=12345)


# ... and with the group's last warp (the last block's, on clusters: the latest consumer) falling as far behind as
# the kernel's waits let it (a straggler: it takes its turns only when no other thread can progress)
@pytest.mark.parametrize("case", DRAWN)
def test_kernels_that_wait_pass_with_a_straggler_on_the_cpu(case):
    _gates(DRAWN[case], 2, straggler=_last_warp(DRAWN[case]))


def test_slot_reuse_without_its_barrier_fails_with_a_straggler_in_the_later_block(monkeypatch):
    # The later block of a tall cluster cols panel puts its own reflectors in the slots of the earlier block's once
    # every warp of it has applied those: without that barrier a warp lagging behind reads a slot overwritten.
    schedule = DRAWN["cols_reuse_1024x192"]
    source = host.source
    barriers = ("        if (g > 0 && c + 1 == g * WARPS * S) block_barrier();\n",
                "      if (g > 0 && own == 0) block_barrier();  // consume_all's barrier, for a warp that applies no "
                "reflector\n")

    def no_barrier(spec, schedule_, target):
        code = source(spec, schedule_, target)
        if spec.name.startswith("qr_cols"):
            for line in barriers:
                assert line in code
                code = code.replace(line, "")
        return code

    monkeypatch.setattr(host, "source", no_barrier)
    a, _ = mixed(schedule.m, schedule.n, 2, seed=5)
    h, tau = host_engine.geqrf(a, schedule, TARGET, straggler=_last_warp(schedule))
    assert not check(a, h, tau).ok


def test_a_cluster_lanes_panel_with_one_receive_buffer_fails_with_a_straggler(monkeypatch):
    # Its blocks push each column's sums into every block's receive buffer, two of them by the column's parity: with
    # one, a block pushes column j + 1's sums while a lagging warp of another block has yet to read column j's. Index
    # and drawn orders did not show it; a straggler does.
    schedule = DRAWN["lanes_cluster_2048x96"]
    source = host.source

    def one_buffer(spec, schedule_, target):
        code = source(spec, schedule_, target)
        if spec.cluster and spec.name.startswith("qr_lanes"):
            assert code.count("sm.xr[buf]") == 4
            code = code.replace("sm.xr[buf]", "sm.xr[0]")
        return code

    monkeypatch.setattr(host, "source", one_buffer)
    a, _ = mixed(schedule.m, schedule.n, 2, seed=5)
    h, tau = host_engine.geqrf(a, schedule, TARGET, straggler=_last_warp(schedule))
    assert not check(a, h, tau).ok


class _RandomTrial:
    """What the tuning space's sample() asks of an optuna trial, answered at random."""

    def __init__(self, rng):
        self.rng = rng

    def suggest_categorical(self, name, choices):
        return self.rng.choice(list(choices))


def _random_point(seed):
    """A random point of the tuning space (fp32 products: the gates are the kernels', not a precision's) at a
    random shape of up to 300 x 300, one the planner accepts and the CPU layer runs."""
    rng = random.Random(seed)
    while True:
        m, n = rng.choice((16, 24, 33, 48, 64, 70, 96, 100, 128, 130, 176, 200, 256, 300)), rng.choice(
            (8, 16, 24, 32, 40, 64, 70, 96, 128, 160, 200, 256, 300))
        problem = Problem(m, n, len(FAMILIES))
        params = dict(space.sample(_RandomTrial(rng), problem), gram="fp32", project="fp32", update="fp32")
        try:
            schedule = space.schedule_from_params(problem, params, TARGET)
        except ValueError:
            continue
        if not any(host.refusal(k) for k in plan(schedule, TARGET).kernels):
            return schedule, rng.choice((0, rng.randrange(1, 1 << 30)))


@pytest.mark.parametrize("seed", range(12))
def test_random_points_of_the_tuning_space_pass_the_gates_on_the_cpu(seed):
    schedule, order = _random_point(seed)
    _gates(schedule, order=order)


# narrow one-warp lanes panels, several matrices a warp (plan/lanes.pack): odd batches leave the last warp's last
# segments past the batch; a square matrix, a tall one, a width no power of two, a packed last panel after a trail one
PACKED = {
    "16x16_p2": (Schedule(16, 16, (Panel(16, "lanes", 32),)), 2),
    "8x8_p4": (Schedule(8, 8, (Panel(8, "lanes", 32),)), 4),
    "40x5_p4": (Schedule(40, 5, (Panel(5, "lanes", 32),)), 4),
    "12x10_p2": (Schedule(12, 10, (Panel(10, "lanes", 32),)), 2),
    "12x3_p8": (Schedule(12, 3, (Panel(3, "lanes", 32),)), 8),
    "20x1_p32": (Schedule(20, 1, (Panel(1, "lanes", 32),)), 32),
    "48x24_p1_p4": (Schedule(48, 24, (Panel(16, "lanes", 32), Panel(8, "lanes", 32))), 4),
}


def _packed_panel_run(spec, schedule, launch, a, pack):
    """h and tau of one launch of the panel's kernel compiled with `pack` matrices a block, written into buffers two
    matrices longer than the batch and filled with 7 beforehand (a kernel factoring what lies past the batch would
    change them)."""
    batch, m, n = a.shape
    spec = replace(spec, pack=pack, name=f"{spec.name}_as{pack}")
    h = np.full((batch + 2, m, n), 7.0, dtype=np.float32)
    tau = np.full((batch + 2, min(m, n)), 7.0, dtype=np.float32)
    h[:batch] = a
    args = PackedArgs(PANEL_SIGNATURE, (h.ctypes.data, h.ctypes.data, tau.ctypes.data, 0, 0, 0, 0, 0, launch.c0,
                                        launch.rows, launch.v_ld, launch.v_bs, batch))
    host.HostKernel(spec, schedule, TARGET)(args, -(-batch // pack), launch.threads, launch.shared_bytes)
    return h, tau


@pytest.mark.parametrize("case", PACKED)
def test_packed_lanes_kernels_pass_the_gates_on_odd_batches_on_the_cpu(case):
    schedule, pack = PACKED[case]
    assert plan(schedule, TARGET).launches[-1].pack == pack
    _gates(schedule, len(FAMILIES) + 1)
    _gates(schedule, len(FAMILIES) - 1, order=3)


@pytest.mark.parametrize("case", ["16x16_p2", "8x8_p4", "40x5_p4", "20x1_p32"])
def test_a_packed_lanes_kernel_gives_the_unpacked_ones_bits_and_writes_nothing_past_the_batch(case):
    schedule, pack = PACKED[case]
    p = plan(schedule, TARGET)
    (launch,) = p.launches
    spec = next(k for k in p.kernels if k.name == launch.kernel)
    a = mixed(schedule.m, schedule.n, 7, seed=3)[0]
    h1, tau1 = _packed_panel_run(spec, schedule, launch, a, 1)
    hp, tau_p = _packed_panel_run(spec, schedule, launch, a, pack)
    assert np.array_equal(hp[:7], h1[:7]) and np.array_equal(tau_p[:7], tau1[:7])
    assert (hp[7:] == 7.0).all() and (tau_p[7:] == 7.0).all()
    assert np.isfinite(hp[:7]).all() and np.isfinite(tau_p[:7]).all()


# qrgen.qr's reduced mode as the CUDA runtime forms it: the fused kernel that writes Q and R (one-panel lanes
# schedules), a keep plan's kept reflectors through drive_q, or Q from h and tau where no keep plan applies
QR_CASES = {
    "fused_20x32x32": (find(Problem(32, 32, 20), TARGET)[0], "fused"),
    "fused_4000x16x16": (find(Problem(16, 16, 4000), TARGET)[0], "fused"),  # two matrices a warp
    "fused_8x6": (Schedule(8, 6, (Panel(6, "lanes", 32),)), "fused"),  # four a warp, the last warp's last past the batch
    "keep_lanes_300x200": (LANES_SCHEDULES[3], "keep"),
    "keep_cols_t_out_192x192": (COLS_SCHEDULES[8], "keep"),  # panels that form their aggregate's T
    "keep_cols_clusters_300x200": (COLS_SCHEDULES[7], "keep"),
    "keep_cols_cluster_3_300x200": (COLS_SCHEDULES[13], "keep"),  # clusters of 3 and 2
    "keep_cols_tall_736x224": (COLS_SCHEDULES[-1], "keep"),  # slot reuse, aggregates of (96, 128)
    "h_tau_1000x64x64": (find(Problem(64, 64, 1000), TARGET)[0], "h_tau"),
}


@pytest.mark.parametrize("case", QR_CASES)
def test_qr_on_the_cpu(case):
    schedule, path = QR_CASES[case]
    fused = any(k.formq for k in plan(schedule, TARGET).kernels)
    try:
        plan(schedule, TARGET, keep=True)
        keeps = True
    except ValueError:
        keeps = False
    assert path == ("fused" if fused else "keep" if keeps else "h_tau")
    m, n = schedule.m, schedule.n
    a = mixed(m, n, len(FAMILIES), seed=7)[0]
    q, r = host_engine.qr(a, schedule, TARGET)
    eps = np.finfo(np.float32).eps
    assert q.shape == a.shape and r.shape == (len(FAMILIES), n, n) and np.array_equal(r, np.triu(r))
    assert np.abs(q.astype(np.float64) @ r - a).max() <= 10 * n * eps * np.abs(a).max()
    assert np.abs(np.swapaxes(q, 1, 2).astype(np.float64) @ q - np.eye(n)).max() <= 10 * n * eps


@pytest.mark.parametrize("project", ["fp32", "tf32x3"])
def test_t_late_aggregates_apply_t_by_the_merge_kernel_on_the_cpu(project, monkeypatch):
    """Aggregates whose projections (fp32 by cuBLAS, or the tf32x3 kernels' with K in parts on the side stream) run
    beside G and T (planner.t_late): W = T^T (V^T C) by the merge kernel, A = T, B = V^T C of the aggregate's nc
    columns (never (VT)^T: B of its rows); the gates with twice the margin."""
    from qrgen.plan import tf32x3

    schedule = Schedule(352, 352, (Panel(96, "cols", 384, 2, 4, cluster=True),) * 3
                        + (Panel(64, "cols", 256, 2, 4, cluster=True),), Precision("fp32", project, "tf32x3"),
                        aggregate=96)
    merges, route = [], tf32x3.route

    def recorded(*args, **kw):  # (rows, cols, depth) of each product of the stage "aggregate" (args[9])
        if args[9:10] == ("aggregate",):
            merges.append(args[2:5])
        return route(*args, **kw)

    monkeypatch.setattr(tf32x3, "route", recorded)
    _gates(schedule)
    aggs = [a for a in plan(schedule, TARGET).aggregates if a.nc > 0]
    assert plan(schedule, TARGET).t_late == (0, 1, 2) and len(aggs) == 3
    assert sorted(set(merges)) == sorted((96, a.nc, 96) for a in aggs)


# A wide matrix's one cols panel, its aggregate, forming its T (t_out), with columns right of it: widths whose rows
# of T are no whole quads (2, 6 columns), 8 and 64 (the first panel reads a copy of the input in h: the columns right
# of it are updated there, run/sequence.reads_input).
T_OUT_SCHEDULES = {
    "cols2_2x9": Schedule(2, 9, (Panel(2, "cols", 32, 1, 2),), aggregate=2),
    "cols6_6x13": Schedule(6, 13, (Panel(6, "cols", 96, 1, 2),), aggregate=6),
    "cols8_8x20": Schedule(8, 20, (Panel(8, "cols", 64, 1, 4),), aggregate=8),
    "cols64_64x100": Schedule(64, 100, (Panel(64, "cols", 256, 1, 8),), Precision("fp32", "tf32x3", "tf32x3"),
                              aggregate=64),
}


@pytest.mark.parametrize("case", sorted(T_OUT_SCHEDULES))
def test_a_panel_that_forms_its_t_writes_lapacks_t_on_the_cpu(case):
    """The T that a t_out panel writes (its aggregate's, read by the merge or the projections) is slarft's T of the
    panel's own V and tau, zero below its diagonal; and the factorization passes the gates with twice the margin."""
    schedule = T_OUT_SCHEDULES[case]
    fac = host_engine.CpuFactorizer(schedule, target=TARGET)
    assert [L.t_out for L in fac.launches] == [True] and fac.aggregates[0].nc == schedule.n - schedule.m
    assert not host_engine.reads_input(fac)
    a = mixed(schedule.m, schedule.n, len(FAMILIES), seed=7)[0]
    h, tau = a.copy(), np.zeros((len(a), fac.k), dtype=np.float32)
    engine = host_engine.HostKernelEngine(fac, h, tau, TARGET)
    host_engine.drive(fac, engine)
    w = schedule.m
    v = np.tril(h[:, :, :w].astype(np.float64), -1) + np.eye(w)
    want = reference.tmatrix(np.swapaxes(v, 1, 2) @ v, tau.astype(np.float64))
    got = engine.buffers["tmat"][:, :w * w].reshape(-1, w, w)
    scale = np.abs(want).max(axis=(1, 2), keepdims=True) + 1e-30
    assert (np.abs(got - want) / scale).max() < 1e-4
    _gates(schedule)


def test_the_aggregates_t_runs_on_the_t_kernel():
    schedule = COLS_SCHEDULES[6]  # aggregates of 96 columns
    fac = host_engine.CpuFactorizer(schedule, target=TARGET)
    a = np.zeros((1, schedule.m, schedule.n), dtype=np.float32)
    engine = host_engine.HostKernelEngine(fac, a, np.zeros((1, fac.k), dtype=np.float32), TARGET)
    assert "qr_tmat" in engine.kernels and fac.aggregates


def test_a_scaled_schedule_factors_2_to_the_40_times_a_matrix_to_the_same_bits_on_the_cpu():
    """The scale kernel's phases: V and tau the same bits, R exactly 2^40 times (fp16 products overflow unscaled)."""
    schedule = Schedule(256, 192, (Panel(32, "rows", 256),) * 6, Precision("fp32", "fp16", "fp16"), aggregate=64)
    assert schedule.scaled
    a = mixed(256, 192, len(FAMILIES), seed=2)[0]
    h1, tau1 = host_engine.geqrf(a, schedule, TARGET)
    h2, tau2 = host_engine.geqrf(a * np.float32(2.0 ** 40), schedule, TARGET)
    assert np.isfinite(h1).all() and np.array_equal(tau1, tau2) and np.array_equal(np.tril(h1, -1), np.tril(h2, -1))
    assert np.array_equal(np.triu(h1) * np.float32(2.0 ** 40), np.triu(h2))


@pytest.mark.parametrize("kind", ["project", "project64", "update", "gram"])
def test_the_tf32x3_products_are_fp32_accurate_on_the_cpu(kind):
    """One tile's product by the tf32x3 kernel, its mma.sync tiles emulated by the layer: within fp32's error of
    float64 (one tf32 product alone would be a thousand times off); G's upper tiles where the kernel is the Gram
    matrix's (V^T V: A and B the same)."""
    from qrgen.plan import tf32x3
    from qrgen.run.launch import PackedArgs

    rng = np.random.default_rng(0)
    rows, cols, depth = (128, 128, 96) if kind == "gram" else (128, 64, 96)
    a = rng.standard_normal((depth, rows) if kind == "update" else (rows, depth), dtype=np.float32)
    b = a if kind == "gram" else rng.standard_normal((depth, cols), dtype=np.float32)
    want = (a.T if kind == "update" else a).astype(np.float64) @ (b.T if kind == "gram" else b)
    c = np.zeros((rows, cols), dtype=np.float32)
    args = PackedArgs(tf32x3.SIGNATURE, (a.ctypes.data, a.shape[1], a.size, b.ctypes.data, b.shape[1], b.size,
                                         c.ctypes.data, cols, c.size, rows, cols, depth, 1.0, 0.0, 1, c.size))
    config = tf32x3.CONFIGS[kind]
    host.HostKernel(tf32x3.kernel(kind), None, TARGET)(args, tf32x3.grid(kind, rows, cols, 1),
                                                       tf32x3.threads(config), tf32x3.shared_bytes(config))
    got, want = (np.triu(c), np.triu(want)) if kind == "gram" else (c, want)
    assert np.abs(got - want).max() <= 4 * np.finfo(np.float32).eps * np.abs(want).max() * np.sqrt(depth)


@pytest.mark.parametrize("width", [96, 128])
def test_the_merge_kernel_stops_each_row_tile_at_t_s_diagonal(width):
    """An aggregate's (VT)^T = T^T V^T by the merge kernel (each row tile's K ends at its last row, T^T being lower
    triangular): bit for bit the update kernel's product over the whole K where T is upper triangular (96: a last
    row tile cut short), and the first row tile reads none of T's rows past it (the update kernel does)."""
    from qrgen.plan import tf32x3
    from qrgen.run.launch import PackedArgs

    rng = np.random.default_rng(width)
    cols = 192
    t = np.triu(rng.standard_normal((width, width), dtype=np.float32))  # T row-major: A = T^T, M contiguous
    b = rng.standard_normal((width, cols), dtype=np.float32)

    def product(kind, tm):
        c = np.zeros((width, cols), dtype=np.float32)
        args = PackedArgs(tf32x3.SIGNATURE, (tm.ctypes.data, width, tm.size, b.ctypes.data, cols, b.size,
                                             c.ctypes.data, cols, c.size, width, cols, width, 1.0, 0.0, 1, c.size))
        config = tf32x3.CONFIGS[kind]
        host.HostKernel(tf32x3.kernel(kind), None, TARGET)(args, tf32x3.grid(kind, width, cols, 1),
                                                           tf32x3.threads(config), tf32x3.shared_bytes(config))
        return c

    merged = product("merge", t)
    assert np.array_equal(merged, product("update", t))
    assert np.abs(merged - t.T.astype(np.float64) @ b).max() <= 1e-5 * np.abs(merged).max()
    below = t.copy()
    below[64:, :64] = 1e3  # below the diagonal, in rows past the first row tile
    assert np.array_equal(product("merge", below), merged) and not np.array_equal(product("update", below), merged)


def test_a_group_larger_than_the_layer_is_refused_with_the_reason():
    schedule = Schedule(8192, 64, (Panel(32, "rows", 256, 20),) * 2)  # a cooperative panel of 20 blocks a matrix
    spec = plan(schedule, TARGET).kernels[0]
    assert "20 blocks of 256 threads" in host.refusal(spec)
    with pytest.raises(ValueError, match="at most 16 blocks and 16384 threads"):
        host.HostKernel(spec, schedule, TARGET)


def test_a_barrier_not_every_thread_reaches_is_an_error_on_the_cpu():
    schedule = LANES_SCHEDULES[1]  # 176 x 176: panels of 32 columns on six warps, warp 0 adding their sums
    spec = plan(schedule, TARGET).kernels[0]
    assert spec.threads > 32
    code = host.source(spec, schedule, TARGET)
    broken = code.replace("      block_barrier();\n      if (warp == 0) {\n",
                          "      if (warp > 0) block_barrier();\n      if (warp == 0) {\n", 1)
    assert broken != code
    kernel = host.HostKernel(spec, schedule, TARGET, code=broken)
    a = np.ones((1, schedule.m, schedule.n), dtype=np.float32)
    fac = host_engine.CpuFactorizer(schedule, target=TARGET)
    engine = host_engine.HostKernelEngine(fac, a, np.zeros((1, fac.k), dtype=np.float32), TARGET)
    engine.kernels[spec.name] = kernel
    with pytest.raises(RuntimeError, match="deadlocked"):
        engine.panel(0, fac.launches[0], 0, ("h", 0), ("h", 0))


def test_the_host_layer_replaces_only_the_dialect_and_feature_headers():
    """The kernel bodies are the GPU's: under the layer the same templates render, with the headers of
    templates/cuda/host/ in place of the dialect and the feature headers."""
    schedule = Schedule(64, 64, (Panel(64, "lanes", 32),))
    spec = plan(schedule, TARGET).kernels[0]
    gpu = environment().get_template("cuda/panel_lanes_wide.cuh").render()
    with layer("host"):
        assert environment().get_template("cuda/panel_lanes_wide.cuh").render() == gpu
        assert "qrl::" in environment().get_template("cuda/dialect.cuh").render()
    code = host.source(spec, schedule, TARGET)
    body = code.split("namespace qrl {", 1)[1]
    assert gpu in code and "__syncwarp" not in body and "asm(" not in body and "asm volatile" not in body


@pytest.mark.parametrize("aggregate", [64, 96])
def test_aggregates_projections_apply_t_on_the_cpu(aggregate, monkeypatch):
    """tf32x3.t_fused: an aggregate's projection W = T^T (V^T C) by a _t kernel (its epilogue applies T: 64-row tiles
    for 64 reflectors, 128-row tiles for 96), no (VT)^T formed; R within rounding of the same schedule with (VT)^T
    formed, every stress family within the gates. (The plan takes them where the aggregate's panel formed T, t_out;
    here rows panels, quicker on the CPU, with planner.t_late off, which would project beside G and T instead.)"""
    from qrgen.plan import planner, tf32x3

    monkeypatch.setattr(planner, "t_late", lambda *args, **kwargs: False)
    schedule = Schedule(384, 320, (Panel(32, "rows", 256),) * 10, Precision("fp32", "tf32x3", "tf32x3"),
                        aggregate=aggregate)
    fac = host_engine.CpuFactorizer(schedule, target=TARGET)
    # (of 96: the third aggregate has 32 columns right of it, fewer than the kernels take: (VT)^T formed there)
    assert fac.plan.t_fused == ((0, 1, 2, 3) if aggregate == 64 else (0, 1))
    assert {k.kind for k in fac.kernels if k.kind and k.kind.endswith("_t")} == {
        "project64_t" if aggregate == 64 else "project_t"}
    a = mixed(384, 320, len(FAMILIES), seed=4)[0]
    monkeypatch.setattr(tf32x3, "t_fills", lambda *args: True)  # (of 96 on ten matrices the grid is small)
    h, tau = host_engine.geqrf(a, schedule, TARGET)
    r = check(a, h, tau)
    assert r.ok, (float(np.max(r.factor)), float(np.max(r.orthogonality)))
    monkeypatch.setattr(tf32x3, "t_fused", lambda *args, **kwargs: False)
    h0, tau0 = host_engine.geqrf(a, schedule, TARGET)
    scale = np.abs(np.triu(h0)).max(axis=(1, 2))
    assert (np.abs(np.triu(h) - np.triu(h0)).max(axis=(1, 2)) <= 1e-3 * scale).all()
