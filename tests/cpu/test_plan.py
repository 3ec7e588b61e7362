"""CPU layer: planning (kernel specs, launches, the families' resource models) and rendering (the strict Jinja
environment, the constants and launch signatures in the sources), without NVRTC."""
import ctypes
import dataclasses
import json
import re

import jinja2
import numpy as np
import pytest

from kernel_cases import LANES_SCHEDULES
from qrgen.plan import cols, family, fused, tmat
from qrgen.plan.family import PANEL_SIGNATURE
from qrgen.plan.planner import check, plan
from qrgen.problem import Problem
from qrgen.render.environment import environment
from qrgen.render.sources import render, render_all
from qrgen.run.launch import CTYPES
from qrgen.schedule.heuristic import cols_as_measured, default_schedule
from qrgen.schedule.model import MAX_AGGREGATE, Panel, Precision, Schedule
from qrgen.targets import Target

SM90 = Target("cuda", "sm_90")


def test_environment_is_strict():
    env = environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_plan_shares_kernels_and_orders_launches():
    s = Schedule(100, 100, (Panel(32, "rows", 64), Panel(32, "rows", 64), Panel(32, "warp", 32), Panel(4, "warp", 32)))
    p = plan(s)
    kernels, launches = p.kernels, p.launches
    assert [L.c0 for L in launches] == [0, 32, 64, 96]
    assert [L.rows for L in launches] == [100, 68, 36, 4]
    assert [L.trail for L in launches] == [True, True, True, False]
    assert len({k.name for k in kernels}) == len(kernels) == 3
    assert launches[0].kernel == launches[1].kernel  # 100 and 68 rows over 64 threads: two rows each
    assert p.kernel(launches[0].kernel).columns == (0, 32)


def test_render_is_deterministic_and_constants_are_in_the_source():
    s = default_schedule(Problem(176, 176, 40))
    first = render_all(s, SM90)
    assert [r.source for r in first] == [r.source for r in render_all(s, SM90)]
    src = first[0].source
    # one kernel
    assert "Do not edit" in src
    assert "panel_cols<176, 176, 176, 6, 176, 4, 4, 0, false, false, 2, false, false, false>" in src
    lanes_src = render_all(default_schedule(Problem(176, 176, 200)), SM90)[0].source  # past one block per SM: lanes
    assert "panel_lanes<176, 176, 176, 8, 32, 704, true, 1, false, false, 1>" in lanes_src
    rows_src = render_all(default_schedule(Problem(176, 176, 640)), SM90)[0].source  # past two blocks per SM: rows
    assert "panel_rows<176, 176, 176," in rows_src


def test_vector_width_follows_alignment():
    """The panel kernels' loads (the fused products choose 16 or 4 bytes at run time)."""
    kernels = plan(default_schedule(Problem(33, 33, 640))).kernels
    assert {k.vec for k in kernels if k.variant != "fused"} == {1}
    kernels = plan(default_schedule(Problem(96, 64, 640))).kernels
    assert {k.vec for k in kernels if k.variant != "fused"} == {4}
    kernels = plan(default_schedule(Problem(96, 64, 4))).kernels
    panels = [k for k in kernels if k.variant != "fused"]
    assert {k.variant for k in panels} == {"lanes"} and {k.vec for k in panels} == {1}  # one float per lane


def test_cols_plan_shared_memory_and_names():
    from kernel_cases import COLS_SCHEDULES

    p = plan(COLS_SCHEDULES[0])
    kernels, launches = p.kernels, p.launches
    assert [k.variant for k in kernels] == ["cols", "cols"]
    assert launches[0].shared_bytes == cols.shared_bytes_of(96, 6, True) > 48 * 1024
    assert launches[1].shared_bytes == cols.shared_bytes_of(80, 3, False)
    assert kernels[0].name == "qr_cols_w96_c4_s6_v4_trail"


def test_cols_panels_write_vt_alone_where_no_products_of_their_own_follow():
    """A cols panel whose aggregate's merge computes T (no products of its own) writes V^T alone: no G, T or
    (VT)^T in its shared memory, a name of its own; a panel with products of its own keeps them."""
    from kernel_cases import COLS_SCHEDULES

    launches = plan(COLS_SCHEDULES[7]).launches
    assert [(L.nc, L.trail, L.vt_only) for L in launches] == [(64, True, False), (0, True, True), (8, True, False),
                                                              (0, False, False)]
    assert launches[1].kernel.endswith("_vt") and launches[0].kernel.endswith("_trail")
    assert launches[1].shared_bytes == cols.shared_bytes_of(64, 8, False)
    assert launches[0].shared_bytes == cols.shared_bytes_of(64, 10, True)
    assert plan(COLS_SCHEDULES[7], keep=True).launches[1].vt_only  # Q takes its aggregate's merged (VT)^T
    # one panel an aggregate of 128 at 352 rows: V^T alone fits, V^T with G and T does not
    wide = Schedule(352, 352, (Panel(128, "cols", 512, 2, 4, cluster=True),) * 2
                    + (Panel(96, "cols", 384, 2, 4, cluster=True),), aggregate=128)
    assert plan(wide).launches[0].shared_bytes <= SM90.limits.shared_bytes < cols.shared_bytes_of(128, 11, True)

    with pytest.raises(ValueError, match="shared memory"):
        check(dataclasses.replace(wide, aggregate=0), SM90)


def test_tall_cols_panels_reuse_slots_and_stream_reflectors():
    """A cols panel on a cluster of two without products of its own, too tall for every reflector to fit in shared
    memory, holds one block's share of them (the later block reuses the earlier one's slots, `_r`); where a held reflector would pass the register cap, consumers
    stream it (`_st`). Neither is what the defaults were measured with (cols_as_measured), which keeps them."""
    from kernel_cases import COLS_SCHEDULES

    tall = COLS_SCHEDULES[-2]  # 1024 x 192, two 96-column panels on clusters of two, aggregates of 96
    launches = plan(tall).launches
    assert [L.kernel for L in launches] == ["qr_cols_w96_c4_x2_s32_v4_vt_st_r", "qr_cols_w96_c4_x2_s29_v4_r"]
    assert launches[0].shared_bytes == cols.shared_bytes_of(96, 32, False, 48) <= SM90.limits.shared_bytes
    assert cols.shared_bytes_of(96, 32, False) > SM90.limits.shared_bytes  # every reflector would not fit
    assert cols.streams(32, 4, 384) and not cols.streams(29, 4, 384) and not cols.streams(32, 4, 256)
    assert cols.held(96, 32, 4, 2, False) == 48 and cols.held(96, 32, 4, 2, True) == 96
    assert cols.held(96, 32, 4, 1, False) == 96
    # where every reflector fits, a cluster panel holds them all: no slot reuse and no barrier for it (40 x 176²)
    assert not cols.reuses(176, 6, 2, False) and cols.held(176, 6, 4, 2, False) == 176
    assert not cols_as_measured(tall, SM90)
    assert cols_as_measured(default_schedule(Problem(352, 352, 40)), SM90)


def test_cols_panels_that_are_their_aggregate_write_t():
    """On one block, a cols panel that is its (merged) aggregate forms G and T itself (KernelSpec.t_out, `_vtt`,
    with their shared memory), so the plan has neither the T kernel nor the gram kernel where no other aggregate
    needs them; the last panel (no merge) writes nothing more. Not on clusters, not with reach (its merges run beside
    the next panels), not where G does not fit the target's shared memory."""
    from kernel_cases import COLS_SCHEDULES

    s = COLS_SCHEDULES[8]  # 192 x 192, panels of 64 columns on one block, each its aggregate, tf32x3 products
    p = plan(s)
    assert [L.t_out for L in p.launches] == [True, True, False]
    assert [L.kernel for L in p.launches] == ["qr_cols_w64_c8_s6_v4_vtt", "qr_cols_w64_c8_s4_v4_vtt",
                                              "qr_cols_w64_c8_s2_v4"]
    assert p.launches[0].shared_bytes == cols.shared_bytes_of(64, 6, True, t_out=True) > cols.shared_bytes_of(64, 6,
                                                                                                         False)
    assert cols.shared_bytes_of(64, 6, True, t_out=True) < cols.shared_bytes_of(64, 6, True)  # T in G's triangle
    assert not any(k.name == tmat.NAME or k.kind == "gram" for k in p.kernels)
    assert [L.t_out for L in plan(s, keep=True).launches] == [True, True, True]  # in keep plans the last one too
    assert not any(L.t_out for L in plan(COLS_SCHEDULES[6]).launches)  # clusters of two
    reach = dataclasses.replace(s, precision=Precision(), lookahead=2, reach=True)
    assert not any(L.t_out for L in plan(reach).launches)
    # 352 rows of 64 reflectors: 88 KiB, with G 105 KiB, past sm_86's shared memory (99 KiB), within sm_90's
    tall = Schedule(352, 352, (Panel(64, "cols", 256, 1, 8),) * 5 + (Panel(32, "cols", 128, 1, 8),), aggregate=64)
    sm86 = Target("cuda", "sm_86")
    assert (cols.shared_bytes_of(64, 11, False) <= sm86.limits.shared_bytes
            < cols.shared_bytes_of(64, 11, True, t_out=True))
    assert plan(tall).launches[0].t_out and not plan(tall, sm86).launches[0].t_out


def test_one_block_cols_panels_are_compiled_for_the_blocks_an_sm_holds():
    """cols.resident_blocks: a one-block panel's __launch_bounds__ asks for as many blocks an SM as a register cap
    that holds its columns (with headroom; at least RESIDENT_MIN_REGISTERS, and T_OUT_REGISTERS where it forms T)
    and the SM's shared memory and threads allow; panels on clusters ask for one. 640 x 512²'s panels of 64
    columns: the tall ones fill an SM alone, from 320 rows two share one, the last (64 rows, no T) four."""
    s = default_schedule(Problem(512, 512, 640))
    p = plan(s)
    specs = [p.kernel(L.kernel) for L in p.launches]
    blocks = [cols.resident_blocks(k) for k in specs]
    assert blocks == [1, 1, 1, 2, 2, 2, 2, 4]

    def need(spec):
        registers = cols.column_registers(spec.slots, spec.slice, spec.threads) + cols.RESIDENT_HEADROOM
        return max(registers, cols.RESIDENT_MIN_REGISTERS, cols.T_OUT_REGISTERS if spec.t_out else 0)

    for spec, want in zip(specs, blocks):
        cap = family.resident_register_cap(spec.threads, want, SM90.limits)
        assert cap == min(255, 65536 // (spec.threads * want)) and cap >= need(spec)
        assert want * (spec.shared_bytes + 1024) <= SM90.limits.sm_shared_bytes
        assert f"__launch_bounds__({spec.threads}, {want})" in render(spec, s, SM90).source
    # one block more and the cap no longer holds the columns
    assert family.resident_register_cap(specs[2].threads, 2, SM90.limits) < need(specs[2])
    assert family.resident_register_cap(specs[-1].threads, 5, SM90.limits) < need(specs[-1])
    # blocks of fewer than four warps: the warps a scheduler holds set the cap (13 one-warp blocks: 4 a scheduler)
    assert family.resident_register_cap(32, 13, SM90.limits) == 128 < (65536 // (32 * 13)) // 8 * 8
    from kernel_cases import COLS_SCHEDULES
    cluster = plan(COLS_SCHEDULES[6])  # clusters of two
    assert {cols.resident_blocks(k) for k in cluster.kernels if k.variant == "cols"} == {1}


@pytest.mark.parametrize("width,slice_", [(1, 2), (2, 2), (4, 4), (8, 8)])
def test_cols_cluster_whose_last_block_owns_no_columns_is_refused(width, slice_):
    """A cols panel on a cluster must give its last block columns: a block without any leaves the cluster while the
    first still writes its reflectors there (Panel refuses it). schedule.panels.cols_panel puts such a (narrow last) panel on one
    block; another warp's columns make the cluster valid."""
    from qrgen.schedule.panels import cols_panel

    with pytest.raises(ValueError, match="no columns"):
        Panel(width, "cols", 32, 2, slice_, cluster=True)
    assert cols_panel(width, slice_, 2) == Panel(width, "cols", 32, 1, slice_)
    assert cols_panel(width + slice_, slice_, 2).blocks == 2


def test_cols_panels_on_clusters_of_up_to_eight_blocks():
    """A cols panel takes clusters of 2 to 8 blocks (the portable most), each block a run of warps, named in its
    kernel and its description; a panel with products of its own has the last block (which holds every reflector)
    prepare them; only clusters of two reuse reflector slots, so a tall panel on more blocks is refused for its
    shared memory."""
    from kernel_cases import COLS_SCHEDULES
    from qrgen.schedule.panels import cols_panel

    assert Panel(128, "cols", 256, 8, 2, cluster=True).blocks == 8
    with pytest.raises(ValueError, match="2 to 8 blocks with cluster=True; got blocks=9"):
        Panel(128, "cols", 32, 9, 4, cluster=True)
    schedule = COLS_SCHEDULES[11]
    assert "x3 blocks (cluster)" in schedule.describe() and "x8 blocks (cluster)" in schedule.describe()
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    p = plan(schedule)
    assert [k.name for k in p.kernels if k.variant == "cols"] == [
        "qr_cols_w128_c4_x3_s11_v4_vt", "qr_cols_w128_c4_x4_s7_v4_vt", "qr_cols_w96_c4_x8_s3_v4"]
    assert [L.blocks for L in p.launches] == [3, 4, 8] and all(L.cluster for L in p.launches)
    assert "__cluster_dims__(3, 1, 1)" in render(p.kernels[0], schedule, SM90).source
    prep = COLS_SCHEDULES[13]  # the first panel on 3 blocks, with products of its own
    kernel = plan(prep).kernels[0]
    assert (kernel.name, kernel.trail, kernel.vt_only) == ("qr_cols_w64_c4_x3_s10_v4_trail", True, False)
    assert "if (g != BLOCKS - 1) return;" in render(kernel, prep, SM90).source
    tall = COLS_SCHEDULES[-2]  # 1024 rows: the later block reuses the earlier one's slots
    assert "_r" in plan(tall).kernels[0].name
    with pytest.raises(ValueError, match="shared memory"):
        check(dataclasses.replace(tall, panels=tuple(cols_panel(q.width, q.slice, 3) for q in tall.panels)), SM90)


def test_cols_shared_memory_budget_is_checked():
    schedule = Schedule(288, 288, (Panel(128, "cols", 512, 1, 8), Panel(128, "cols", 512, 1, 8), Panel(32, "warp", 32)))
    with pytest.raises(ValueError, match="shared memory"):
        check(schedule, SM90)
    with pytest.raises(ValueError, match="shared memory"):
        plan(schedule)


def test_aggregated_schedule_plan():
    schedule = Schedule(256, 256, tuple(Panel(32, "rows", 64) for _ in range(8)), aggregate=128)
    p = plan(schedule)
    kernels, launches = p.kernels, p.launches
    tmat_spec = next(k for k in kernels if k.name == tmat.NAME)
    assert tmat_spec.threads == tmat.THREADS == 1024
    assert kernels[-1].name == "qr_tf32x3_gram"  # an fp32 G of few matrices in parts (run/buffers.gram_parts)
    assert [L.nc for L in launches[:4]] == [96, 64, 32, 0] and all(L.trail for L in launches[:4])
    assert [L.v_row for L in launches[:4]] == [0, 32, 64, 96] and {L.v_ld for L in launches[:4]} == {256}


TF32X3_PANELS = tuple(Panel(32, "rows", 64) for _ in range(8))


def test_tf32x3_products_plan_and_render():
    """A schedule whose products are tf32x3 brings the tf32x3 kernels (only the stages that ask); an fp32 Gram
    matrix of aggregates brings the gram kernel whatever the products (G in tf32x3 where an update in tf32x3 takes
    the merge, whose (VT)^T the merge kernel forms, or in parts for few matrices: run/buffers.gram_parts). An
    aggregate whose panels do not form its T projects beside G and T (planner.t_late: the plain projections); one
    whose panel forms it (t_out) has its tf32x3 projection apply it (tf32x3.t_fused: the _t kernels, 128-row tiles
    past 64 rows); neither in qr's keep plans nor beside a lookahead. (Their compilation: tests/compile.)"""
    names = {}
    for project, update in (("fp32", "fp32"), ("tf32x3", "fp32"), ("tf32x3", "tf32x3")):
        schedule = Schedule(256, 256, TF32X3_PANELS, Precision("fp32", project, update), aggregate=128)
        names[update] = [k.name for k in plan(schedule).kernels if k.variant == "tf32x3"]
        assert plan(schedule).t_fused == () and plan(schedule).t_late == (0,)
        if project == "fp32":
            assert names[update] == ["qr_tf32x3_gram"]
        if update == "fp32" and project == "tf32x3":  # (both projection tiles: tf32x3.project_kinds)
            assert names[update] == ["qr_tf32x3_project", "qr_tf32x3_project64", "qr_tf32x3_gram"]
    assert names["tf32x3"] == ["qr_tf32x3_project", "qr_tf32x3_project64", "qr_tf32x3_update", "qr_tf32x3_merge",
                               "qr_tf32x3_gram"]
    # qr's keep plan and a lookahead: (VT)^T formed, both projection tiles (project_kind)
    ahead = dataclasses.replace(schedule, lookahead=1)
    for p in (plan(schedule, keep=True), plan(ahead)):
        assert [k.name for k in p.kernels if k.variant == "tf32x3"] == names["tf32x3"] and p.t_fused == p.t_late == ()
    # one aggregate over every column: nothing right of it to project, so no projection kernel, and no merge but for
    # qr (the gram kernel in keep plans)
    one = Schedule(256, 256, TF32X3_PANELS, Precision("fp32", "tf32x3", "tf32x3"), aggregate=256)
    assert [k.name for k in plan(one).kernels if k.variant == "tf32x3"] == ["qr_tf32x3_update"]
    assert {"qr_tf32x3_gram", "qr_tf32x3_merge"} <= {k.name for k in plan(one, keep=True).kernels}
    # aggregates of 64: their projections on the 64-row tiles (tf32x3.project_kind), the 128-row kernel not built
    by64 = Schedule(256, 256, TF32X3_PANELS, Precision("fp32", "tf32x3", "tf32x3"), aggregate=64)
    for p in (plan(by64), plan(by64, keep=True)):
        assert [k.name for k in p.kernels if k.variant == "tf32x3"] == [
            "qr_tf32x3_project64", "qr_tf32x3_update", "qr_tf32x3_merge", "qr_tf32x3_gram"]
    # cols panels on one block, each its aggregate, form their T (t_out): the _t projections, no G or T launched
    own = {w: Schedule(256, 256, (Panel(w, "cols", 4 * w, 1, 8),) * (256 // w), Precision("fp32", "tf32x3", "tf32x3"),
                       aggregate=w) for w in (64, 128)}
    for w, t_kernel in ((64, "qr_tf32x3_project64_t"), (128, "qr_tf32x3_project_t")):
        p = plan(own[w])
        assert p.t_late == () and p.t_fused == tuple(range(256 // w - 1)) and all(L.t_out for L in p.launches[:-1])
        assert t_kernel in [k.name for k in p.kernels] and "qr_tf32x3_gram" not in [k.name for k in p.kernels]
    items = dict((r.name, r.source) for s in (schedule, by64, *own.values()) for r in render_all(s, SM90)
                 if "tf32x3" in r.name)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in next(iter(items.values()))
    assert "#define BM 64" in items["qr_tf32x3_project64"] and "#define BM 128" in items["qr_tf32x3_project"]
    assert "#define BM 64" in items["qr_tf32x3_project64_t"] and "#define BM 128" in items["qr_tf32x3_project_t"]
    assert "long long st)" in items["qr_tf32x3_project_t"] and "long long ss)" in items["qr_tf32x3_project"]


def test_lanes_panels_and_gram_precision():
    schedule = LANES_SCHEDULES[1]
    assert [p.variant for p in schedule.panels] == ["lanes"] * 6
    assert [p.threads for p in schedule.panels][:2] == [192, 160]
    kernels = plan(schedule).kernels
    assert kernels[0].name == "qr_lanes_w32_t192_s30_trail" and kernels[-1].name == "qr_lanes_w16_t32_s16_p2"
    tf32 = Schedule(32, 32, (Panel(16, "lanes", 32), Panel(16, "rows", 32)), precision=Precision(gram="tf32"))
    assert (tf32.panel_gram(0), tf32.panel_gram(1)) == ("fp32", "tf32")
    with pytest.raises(ValueError, match="multiple of 32"):
        Panel(32, "lanes", 48)
    with pytest.raises(ValueError, match="registers"):
        check(Schedule(2000, 32, (Panel(32, "lanes", 1024),)), SM90)


def test_lanes_panels_on_clusters():
    """Lanes panels whose rows a cluster of blocks shares: validated, named apart, slots counted over the blocks,
    the cluster launch attribute and the exchange through the blocks' shared memory in the source."""
    schedule = LANES_SCHEDULES[6]
    panel = schedule.panels[0]
    assert (panel.variant, panel.threads, panel.blocks, panel.cluster) == ("lanes", 512, 8, True)
    p = plan(schedule)
    kernels, launches = p.kernels, p.launches
    assert kernels[0].name == "qr_lanes_w32_t512_c8_s32_trail" and kernels[0].slots == 32
    assert all(L.cluster and L.blocks == 8 for L in launches)
    source = render(kernels[0], schedule, SM90).source
    assert "__cluster_dims__(8, 1, 1)" in source and "push_peer_at(peer[q], &sm, &sm.xr[buf][g][lane], sum" in source
    assert "panel_lanes<4096, 64, 64, 32, 32, 512, true, 8, true, false, 1>" in source
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    with pytest.raises(ValueError, match="blocks=1, or 2 or more blocks with cluster=True; got blocks=8"):
        Panel(32, "lanes", 512, 8)
    # more blocks than a cluster of the target may have: refused for the target, naming its most
    with pytest.raises(ValueError, match="at most 16"):
        check(Schedule(4096, 32, (Panel(32, "lanes", 512, 17, cluster=True),)), SM90)


def test_wide_lanes_panels():
    """A lanes panel past 32 columns: up to 64 on one warp, up to 128 on a warp for each 32 columns and 128 rows, as
    its matrix's last panel (no V^T, no keep plan, no fused Q); the default for 32 < n <= m <= 64 at any batch and
    for 64 < n <= m <= 128 past 132 matrices; its result the reference's on the CPU engine."""
    from qrgen.run import numpy_engine
    from qrgen.numerics import reference
    from qrgen.numerics.stress import mixed

    wide = Schedule(64, 64, (Panel(64, "lanes", 32),))
    p = plan(wide)
    (k,) = p.kernels
    assert (k.name, k.slots, k.trail) == ("qr_lanes_w64_t32_s64", 64, False) and p.launches[0].shared_bytes == 0
    assert "panel_lanes_wide<64, 64, 64, 64, 64, false>(src, h, tau, c0, mp);" in render(k, wide, SM90).source
    for bad, words in [(lambda: Panel(64, "lanes", 96), "up to 64 on one warp"),
                       (lambda: Panel(65, "lanes", 32), "up to 64 on one warp"),
                       (lambda: Panel(40, "lanes", 32, 2, cluster=True), "up to 64 on one warp"),
                       (lambda: check(Schedule(64, 96, (Panel(64, "lanes", 32),)), SM90), "must be the last"),
                       (lambda: check(Schedule(72, 64, (Panel(64, "lanes", 32),)), SM90), "registers"),
                       (lambda: plan(wide, keep=True), "no reflectors kept for Q"),
                       (lambda: Panel(96, "lanes", 64), "a warp for each 32 columns"),
                       (lambda: Panel(129, "lanes", 160), "up to 128"),
                       (lambda: check(Schedule(130, 100, (Panel(100, "lanes", 128),)), SM90), "at most 128 rows")]:
        with pytest.raises(ValueError, match=words):
            bad()
    for batch, m, n in [(1, 33, 33), (10, 64, 40), (1000, 64, 64), (5000, 48, 48)]:
        assert default_schedule(Problem(m, n, batch)).panels == (Panel(n, "lanes", 32),)
    # rolled where its code is large, for a warp a scheduler or fewer (528 matrices); unrolled by two otherwise
    for batch, m, n, loop in [(1, 64, 64, True), (528, 64, 64, True), (528, 60, 60, True), (132, 64, 48, True),
                              (529, 64, 64, False), (528, 56, 56, False), (132, 64, 40, False), (1, 48, 48, False)]:
        assert default_schedule(Problem(m, n, batch)).panels == (Panel(n, "lanes", 32, loop=loop),)
    assert plan(Schedule(64, 64, (Panel(64, "lanes", 32, loop=True),))).kernels[0].name == "qr_lanes_w64_t32_s64_loop"
    assert "panel_lanes_wide<64, 64, 64, 64, 64, true>" in render(
        plan(Schedule(64, 64, (Panel(64, "lanes", 32, loop=True),))).kernels[0], wide, SM90).source
    for bad in (lambda: Panel(32, "lanes", 32, loop=True), lambda: Panel(128, "lanes", 128, loop=True)):
        with pytest.raises(ValueError, match="past 32 columns on one warp"):
            bad()
    for batch, m, n, threads in [(500, 128, 128, 128), (133, 100, 70, 96), (1000, 96, 65, 96)]:
        assert default_schedule(Problem(m, n, batch)).panels == (Panel(n, "lanes", threads),)
    assert wide.describe().startswith("1x64 lanes(32 threads, two columns a lane)")
    block = Schedule(128, 128, (Panel(128, "lanes", 128),))
    assert block.describe().startswith("1x128 lanes(128 threads, a warp for each 32 columns)")
    (k,) = plan(block).kernels
    assert (k.name, k.slots) == ("qr_lanes_w128_t128_s128", 128)
    assert "panel_lanes_block<128, 128, 128, 128, 128, 4>(src, h, tau, c0, mp);" in render(k, block, SM90).source
    for batch, m, n in [(1000, 65, 64), (1000, 64, 32), (10, 40, 64), (132, 128, 128), (500, 129, 128)]:
        assert all(p.width <= 32 or p.variant != "lanes" for p in default_schedule(Problem(m, n, batch)).panels)
    after = LANES_SCHEDULES[-4]  # a wide panel at column 32, after a 32-wide one
    assert [p.width for p in after.panels] == [32, 64] and plan(after).launches[1].c0 == 32
    a, _ = mixed(96, 96, 6, seed=5)
    h, tau, _ = numpy_engine.geqrf(a, after)
    hr, tr = reference.geqrf(a, after, dtype=np.float32)
    assert np.abs(h - hr).max() <= 1e-4 * np.abs(a).max() and np.abs(tau - tr).max() <= 1e-4


def test_narrow_one_warp_lanes_panels_pack_several_matrices_a_block():
    """A one-warp lanes panel of at most 16 columns with nothing right of it factors 32 / s matrices a block (s the
    power of two at least its width); the launch's grid counts blocks so, and the batch is the last parameter."""
    from qrgen.plan.family import PANEL_SIGNATURE, panel_grid

    cases = [(Schedule(16, 16, (Panel(16, "lanes", 32),)), 2), (Schedule(40, 5, (Panel(5, "lanes", 32),)), 4),
             (Schedule(8, 8, (Panel(8, "lanes", 32),)), 4), (Schedule(20, 1, (Panel(1, "lanes", 32),)), 32),
             (Schedule(24, 17, (Panel(17, "lanes", 32),)), 1), (Schedule(32, 32, (Panel(32, "lanes", 32),)), 1),
             (Schedule(64, 16, (Panel(16, "lanes", 64),)), 1), (Schedule(48, 24, (Panel(16, "lanes", 32),) * 1
                                                                  + (Panel(8, "lanes", 32),)), 4)]
    for schedule, pack in cases:
        p = plan(schedule)
        assert p.launches[-1].pack == pack and all(L.pack == 1 for L in p.launches[:-1])
        assert [k.pack for k in p.kernels if k.name == p.launches[-1].kernel] == [pack]
        assert panel_grid(p.launches[-1], 7) == -(-7 // pack)
        assert (f"_p{pack}" in p.launches[-1].kernel) == (pack > 1)
    assert PANEL_SIGNATURE.endswith("I")  # nb: the launch's matrices
    assert default_schedule(Problem(16, 16, 4000)).panels == (Panel(16, "lanes", 32),)
    assert plan(default_schedule(Problem(16, 16, 4000))).launches[0].pack == 2


@pytest.mark.parametrize("m,n,batch,fused_q", [(32, 32, 20, True), (100, 20, 3, True), (40, 1, 2, True),
                                               (32, 32, 20000, True), (64, 64, 3, False), (10, 100, 3, False),
                                               (4096, 32, 1, False)])
def test_fused_q_kernel_only_for_one_lanes_panel_on_one_block(m, n, batch, fused_q):
    """qr's one-launch Q and R: a lanes kernel with FORMQ where the schedule is one lanes panel on one block with no
    columns right of it (m >= n, n <= 32); nothing extra for other schedules (warp panels, several panels, a wide
    matrix's trailing columns, clusters)."""
    schedule = default_schedule(Problem(m, n, batch))
    p = plan(schedule)
    q = [k for k in p.kernels if k.formq]
    assert bool(q) == fused_q
    if fused_q:
        (k,) = q
        assert k.name == p.launches[0].kernel + "_q" and k.variant == "lanes" and k.width == n
        source = render(k, schedule, SM90).source
        assert f"true, {k.pack}>(\n      src, h, tau, vt, zt" in source  # FORMQ, then the matrices a block


def test_fused_panel_products_sources():
    """The fused kernel for every padding of W's rows (4, 8, 16, 32) and odd widths: its copies asynchronous, a
    cluster where its name says so. (Spills, registers and shared memory: tests/compile.)"""
    kernels = [fused.kernel(w) for w in (1, 4, 5, 8, 13, 16, 20, 32)]
    kernels += [fused.kernel(w, cl) for w in (5, 32) for cl in fused.CLUSTER_SIZES[1:]]
    items = [(r.name, r.source) for r in (render(k, None, SM90) for k in kernels)]
    assert all("cp.async.cg.shared.global" in src and "cp.async.ca.shared.global" in src for _, src in items)
    assert all(("__cluster_dims__" in src) == ("_c" in name) for name, src in items)
    assert all(2 * k.shared_bytes <= SM90.limits.shared_bytes for k in kernels)  # two blocks per SM


def test_tmat_shared_memory_fits_one_block():
    """The T kernel stages G (a half's diagonal block, then G12), T1, T2 and X in shared memory: within an sm_90
    block's 227 KB for every aggregate size (every width a schedule or qrgen.numerics.qmatrix can give it), growing
    with it; at tmat.BLOCKED_MAX G, T and X of 128 rows less one block for X, as before the halves."""
    assert MAX_AGGREGATE == tmat.MAX == 2 * tmat.BLOCKED_MAX
    sizes = [tmat.shared_bytes(a) for a in range(1, tmat.MAX + 1)]
    assert max(sizes) == sizes[-1] == tmat.kernel(SM90).shared_bytes <= SM90.limits.shared_bytes
    assert all(x <= y for x, y in zip(sizes, sizes[1:]))
    assert tmat.shared_bytes(tmat.BLOCKED_MAX) == 4 * (128 * (132 + 132) + 96 * 36)
    with pytest.raises(ValueError, match="1 to 256"):
        tmat.shared_bytes(tmat.MAX + 1)


def test_tmat_launch_threads_cover_its_warps():
    """The T kernel's launch (tmat.threads): within its bound, whole warps, a warp for each 32-row diagonal block of
    a half (the blocks t_row builds at once), and fewer threads only for aggregates of at most tmat.SMALL."""
    for a in range(1, tmat.MAX + 1):
        threads = tmat.threads(a)
        assert threads <= tmat.kernel(SM90).threads == tmat.THREADS and threads % 32 == 0
        assert threads >= 32 * -(-min(a, tmat.BLOCKED_MAX) // 32)
        assert (threads < tmat.THREADS) == (a <= tmat.SMALL)


def _signature(source: str, name: str) -> tuple:
    """The ctypes of kernel `name`'s parameters as its rendered source declares them."""
    match = re.search(r'extern "C" __global__ void[^(]*(?:\([^)]*\)[^(]*)*?\b' + name + r"\(([^)]*)\)", source)
    assert match, name
    kinds = []
    for param in match.group(1).split(","):
        words = param.replace("*", " * ").split()
        kinds.append(ctypes.c_uint64 if "*" in words else ctypes.c_int64 if words.count("long") == 2
                     else ctypes.c_uint32 if "unsigned" in words else ctypes.c_int32 if "int" in words
                     else ctypes.c_float if "float" in words else None)
    return tuple(kinds)


def test_packed_launch_arguments_match_the_kernels_signatures():
    """The launches pack each kernel's arguments by a signature string (plan.family.PANEL_SIGNATURE and the
    families' SIGNATUREs, turned into ctypes by run.launch.CTYPES) that the driver copies by size: every signature
    has the count, order and widths of the parameters its kernels declare (a mismatch would read the wrong bytes on
    the GPU, with no error)."""
    from qrgen.plan import rowsplit, scale, tf32x3, tsqr

    expected = {"rows": PANEL_SIGNATURE, "lanes": PANEL_SIGNATURE, "warp": PANEL_SIGNATURE, "cols": PANEL_SIGNATURE,
                "tsqr": tsqr.SIGNATURE, "tmat": tmat.SIGNATURE, "tf32x3": tf32x3.SIGNATURE,
                "scale": scale.SIGNATURE, "fused": fused.SIGNATURE, "project": rowsplit.PROJECT_SIGNATURE,
                "update": rowsplit.UPDATE_SIGNATURE}
    schedules = [
        Schedule(256, 256, tuple(Panel(32, "rows", 64) for _ in range(8)), Precision("fp32", "tf32x3", "tf32x3"),
                 aggregate=128, panel_update="fused"),
        Schedule(256, 256, tuple(Panel(16, "lanes", 128) for _ in range(16)), Precision("fp16", "fp32", "fp16"),
                 aggregate=64, panel_update="rowsplit"),
        Schedule(4096, 32, (Panel(16, "tsqr", 256, tile=512), Panel(16, "tsqr", 256, tile=512))),
        Schedule(128, 128, tuple(Panel(32, "warp", 32) for _ in range(4))),
        Schedule(64, 64, (Panel(64, "cols", 256, slice=8),)),
    ]
    seen = set()
    for schedule in schedules:
        kernels = {k.name: k for k in plan(schedule).kernels}
        for rendered in render_all(schedule, SM90):
            variant = kernels[rendered.name].variant
            code = tf32x3.signature(kernels[rendered.name]) if variant == "tf32x3" else expected[variant]
            packed = tuple(CTYPES[c] for c in code)
            assert _signature(rendered.source, rendered.name) == packed, rendered.name
            seen.add(variant)
    assert seen == set(expected)


@pytest.mark.parametrize("arch,most", [("sm_80", 128), ("sm_90", 256), ("sm_86", 64), ("sm_89", 64), ("sm_120", 64)])
def test_t_kernel_and_aggregates_fit_the_target(arch, most):
    """GPUs of 99 KB of shared memory a block take T of at most 64 reflectors: the T kernel asks for no more, the
    default schedules aggregate at most that many columns (so their kernels fit), and the planner refuses wider
    aggregates there."""
    from dataclasses import replace

    target = Target("cuda", arch)
    assert tmat.max_reflectors(target) == most
    assert tmat.kernel(target).shared_bytes == tmat.shared_bytes(most) <= target.limits.shared_bytes
    for m, n, batch in ((1024, 1024, 60), (2048, 2048, 8), (4096, 4096, 2), (512, 512, 640), (40000, 256, 1)):
        schedule = default_schedule(Problem(m, n, batch), target)
        assert schedule.widest_aggregate <= most
        check(schedule, target)
        # every kernel of the plan within the block's shared memory (the projections' _t kernels: W's tile and T)
        assert all(k.shared_bytes <= target.limits.shared_bytes for k in plan(schedule, target).kernels)
    wide = replace(default_schedule(Problem(1024, 1024, 8), SM90), aggregate=128)
    if most < 128:
        with pytest.raises(ValueError, match="T kernel takes at most 64"):
            check(wide, Target("cuda", arch))


def test_aggregates_apply_t_in_their_projections_where_the_grid_fills_the_gpu():
    """tf32x3.t_fills: an aggregate of at most 64 reflectors always applies T in its projection (the same tiles); a
    wider one where the _t kernel's 128-row tiles, K in parts, give at least half as many blocks as SMs (else its
    merge forms (VT)^T and the plain projection takes 64-row tiles)."""
    from qrgen.plan import tf32x3

    fills = tf32x3.t_fills
    assert fills(64, 64, 64, 1, 132)  # one 64 x 64 tile: as many blocks either way
    assert not fills(128, 172, 300, 7, 132)  # 7 x 300²'s first aggregate: 3 x 7 = 21 blocks
    assert fills(128, 128, 256, 40, 132) and fills(128, 224, 352, 40, 132)  # 80 and 160 blocks
    assert fills(128, 384, 300000, 1, 132)  # one tall matrix: K in 22 parts, 132 blocks
    assert not fills(128, 384, 256, 1, 132)  # K too short to split: 3 blocks


def test_the_engines_route_a_product_to_the_tf32x3_and_apply3_kernels_by_one_rule():
    from qrgen.plan import apply3, tf32x3

    strides = (128, 128, 128, 128 * 256, 128 * 256, 128 * 128)
    assert tf32x3.route(False, False, 128, 128, 256, (0, 64, 128), strides, 40, 132) == (
        tf32x3.project_kind(128, 128, 40, 132), tf32x3.grid(tf32x3.project_kind(128, 128, 40, 132), 128, 128, 40))
    assert tf32x3.route(True, False, 128, 128, 256, (0, 64, 128), strides, 40, 132)[0] == "update"
    assert tf32x3.route(False, True, 128, 128, 256, (0, 64, 128), strides, 40, 132)[0] == "gram"
    assert tf32x3.route(True, True, 128, 128, 256, (0, 64, 128), strides, 40, 132) is None  # no such kernel
    assert tf32x3.route(False, False, 128, 128, 256, (0, 68, 128), strides, 40, 132) is None  # misaligned
    assert tf32x3.route(False, False, 128, 128, 256, (0, 64, 128), (130,) + strides[1:], 40, 132) is None
    assert tf32x3.route(False, False, 32, 128, 256, (0, 64, 128), strides, 40, 132) is None  # thin: cuBLAS
    target = Target()
    spec = apply3.kernels(Schedule(512, 512, (Panel(32, "rows", 256),) * 16, Precision("fp32", "tf32x3", "tf32x3"),
                                   aggregate=64, aggregate_update="fused"),
                          plan(Schedule(512, 512, (Panel(32, "rows", 256),) * 16, aggregate=64), target).aggregates,
                          target)[0]
    shared = {spec.name: spec.shared_bytes}
    aligned = apply3.launch_shared(shared, 64, 448, (0, 16, 32), (64, 64, 64, 64, 512, 448, 448))
    assert aligned == apply3.launch_shared(shared, 64, 448) is not None
    assert apply3.launch_shared(shared, 64, 448, (0, 20, 32), (64, 64, 64, 64, 512, 448, 448)) is None
    assert apply3.launch_shared(shared, 64, 448, (0, 16, 32), (64, 64, 64, 64, 512, 448, 446)) is None
