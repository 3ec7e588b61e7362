"""CPU layer: the schedule model (Panel, Precision, Schedule), the target's checks of it (plan.planner.check),
schedule files (schedule.files) and the default heuristic (schedule.heuristic, schedule.panels)."""
import json

import pytest

from qrgen.paths import schedule_dir
from qrgen.plan.planner import check, plan
from qrgen.problem import Problem, parse_case, parse_shape
from qrgen.render.sources import render
from qrgen.schedule.files import find, load, save
from qrgen.schedule.heuristic import default_schedule
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.targets import Target

SHAPES = [(1, 1), (2, 5), (5, 2), (31, 31), (32, 32), (33, 33), (100, 100), (176, 176), (255, 255), (257, 257),
          (352, 352), (512, 512), (1000, 1000), (1024, 1024), (2048, 2048), (4096, 4096), (4096, 1024),
          (8192, 512), (100000, 32), (40000, 256), (256, 1024)]


@pytest.mark.parametrize("m,n", SHAPES)
def test_default_schedule_covers_min_mn(m, n):
    s = default_schedule(Problem(m, n, 4))
    assert sum(p.width for p in s.panels) == min(m, n)
    assert s.starts()[0] == 0


def test_widths_must_sum():
    with pytest.raises(ValueError, match=r"panels widths \[32\] sum to 32, must sum to min\(m, n\) = 40"):
        Schedule(40, 40, (Panel(32, "warp", 32),))


def test_register_budget_names_the_panel():
    schedule = Schedule(4096, 32, (Panel(32, "rows", 1024),))  # a decision; whether a target can run it is checked
    with pytest.raises(ValueError, match=r"panels\[0\].*registers.*cap is 64"):
        check(schedule, Target())
    with pytest.raises(ValueError, match=r"panels\[0\].*registers.*cap is 64"):
        plan(schedule)


@pytest.mark.parametrize("kwargs,field", [
    (dict(width=0), "Panel.width"),
    (dict(width=8, variant="magic"), "Panel.variant"),
    (dict(width=8, threads=96), "Panel.threads"),
    (dict(width=8, blocks=0), "Panel.blocks"),
    (dict(width=33, variant="rows", threads=64), "Panel.width"),
    (dict(width=8, variant="warp", threads=64), "warp"),
])
def test_panel_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Panel(**kwargs)


def test_precision_field():
    with pytest.raises(ValueError, match="Precision.update"):
        Precision(update="fp8")
    # the three-product tf32 split is a choice for the two products only: gram is formed inside the panel kernels
    assert (Precision(project="tf32x3", update="tf32x3").project, Precision(update="tf32x3").update) == ("tf32x3",) * 2
    with pytest.raises(ValueError, match=r"Precision.gram must be one of \('fp32', 'tf32', 'bf16', 'fp16'\)"):
        Precision(gram="tf32x3")


def test_problem_and_target_fields():
    with pytest.raises(ValueError, match="Problem.m"):
        Problem(0, 4)
    with pytest.raises(ValueError, match="Problem.dtype"):
        Problem(4, 4, dtype="float64")
    with pytest.raises(ValueError, match=r"unknown cuda architecture 'hopper'.*known: .*sm_90"):
        Target(arch="hopper")
    with pytest.raises(ValueError, match="Target.backend"):
        Target("vulkan", "apple9")
    assert Target.parse("sm_80") == Target("cuda", "sm_80") and Target.parse("cpu") == Target("cpu", "numpy")
    assert parse_shape("1024x512") == (1024, 512)
    with pytest.raises(ValueError, match="MxN"):
        parse_shape("1024")
    assert parse_case("60x1024x512") == (60, 1024, 512)
    with pytest.raises(ValueError, match="BATCHxMxN"):
        parse_case("1024x512")


def test_json_round_trip_and_find(tmp_path):
    problem, target = Problem(100, 60, 7), Target()
    sched = Schedule(100, 60, (Panel(32, "rows", 64), Panel(28, "warp", 32)), Precision(project="tf32"))
    assert find(problem, target, tmp_path) == (default_schedule(problem), "default (heuristic)")
    path = save(sched, problem, target, {"origin": "test"}, root=tmp_path)
    assert path == tmp_path / "sm_90" / "100x60_b7.json"
    loaded, prov = load(path)
    assert loaded == sched and prov == {"origin": "test"}
    found, origin = find(problem, target, tmp_path)
    assert found == sched and origin == str(path)
    data = json.loads(path.read_text())
    assert (data["format"], data["backend"], data["arch"], data["batch"]) == (2, "cuda", "sm_90", 7)
    data["panels"][0]["width"] = 31
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="sum to"):
        load(path)


def test_unknown_json_field():
    data = default_schedule(Problem(32, 32)).to_json()
    data["panels"][0]["colour"] = "red"
    with pytest.raises(ValueError, match="unknown or missing field"):
        Schedule.from_json(data)


def test_cluster_panels():
    """Rows panels on a cluster of 2 to 16 blocks (sm_90's most): validated, named apart, no flags or cooperative
    launch."""
    from qrgen.schedule.panels import cluster_panel

    panel = cluster_panel(8192, 32, 8)
    assert panel.cluster and panel.blocks == 8 and panel.variant == "rows"
    assert cluster_panel(8192, 32, 8) != Panel(32, "rows", panel.threads, 8)
    for kwargs in ({"variant": "warp", "threads": 32, "blocks": 1}, {"blocks": 1}, {"cluster": 1}):
        with pytest.raises(ValueError, match="Panel.cluster"):
            Panel(32, **{"variant": "rows", "threads": 128, "blocks": 2, "cluster": True, **kwargs})
    # the cluster's size is the target's to allow (plan.planner.check)
    with pytest.raises(ValueError, match="clusters of 17 blocks; sm_90 allows at most 16"):
        check(Schedule(8192, 32, (Panel(32, "rows", 128, 17, cluster=True),)), Target())
    schedule = Schedule(8192, 64, (panel, cluster_panel(8192 - 32, 32, 8)))
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    assert "cluster" not in default_schedule(Problem(64, 64, 3)).to_json()["panels"][0]
    assert "(cluster)" in schedule.describe()
    p = plan(schedule)
    kernels, launches = p.kernels, p.launches
    assert all(k.cluster and "_c8_" in k.name for k in kernels)
    assert all(L.cluster and L.barriers == 0 for L in launches)  # no flag arrivals: the epoch does not move
    assert not any(L.cooperative for L in launches)
    source = render(kernels[0], schedule, Target()).source
    assert "__cluster_dims__(8, 1, 1)" in source and "cluster_sync();" in source


def test_column_loop_panels():
    """Panel.loop (warp and rows only): validated, kept in JSON only when set, named apart, rendered as a loop
    that is not unrolled; the default turns it on where more matrices than LANES_MAX_BATCH share the SMs."""
    from qrgen.schedule.heuristic import LANES_MAX_BATCH
    from qrgen.schedule.panels import with_loop

    for kwargs in ({"variant": "lanes", "threads": 64}, {"loop": 1}):
        with pytest.raises(ValueError, match="Panel.loop"):
            Panel(32, **{"variant": "rows", "threads": 128, "loop": True, **kwargs})
    looped = default_schedule(Problem(320, 320, LANES_MAX_BATCH + 1))
    assert all(p.loop for p in looped.panels[:-1]) and {p.variant for p in looped.panels[:-1]} <= {"warp", "rows"}
    assert looped.panels[-1] == Panel(32, "lanes", 32)  # 32 rows: one warp, its own loop (Panel.loop not taken)
    assert not any(p.loop for p in default_schedule(Problem(320, 320, LANES_MAX_BATCH)).panels)
    assert Schedule.from_json(json.loads(json.dumps(looped.to_json()))) == looped
    assert "loop" not in default_schedule(Problem(512, 512, 8)).to_json()["panels"][0]
    assert "column loop" in looped.describe()
    assert with_loop(Panel(32, "lanes", 64), True) == Panel(32, "lanes", 64)
    kernels = plan(looped).kernels
    assert all(k.loop and k.name.endswith("_loop") for k in kernels if k.variant in ("warp", "rows"))
    source = render(kernels[0], looped, Target()).source
    assert "for (int j = 0; j < STEPS; ++j) column(j);" in source and ", false, true>(" in source  # not a cluster
    unrolled = Schedule(320, 320, tuple(with_loop(p, False) for p in looped.panels))
    kernels = plan(unrolled).kernels
    assert not any(k.loop or "_loop" in k.name for k in kernels)
    assert ", false, false>(" in render(kernels[0], unrolled, Target()).source


def test_find_in_fp32_keeps_the_panels():
    """precision="fp32" runs the shape's schedule (here the committed tuned one, tf32 aggregate products) with
    every stage in fp32; anything but None or "fp32" is refused before any work, naming what is accepted."""
    import numpy as np

    import qrgen

    problem, target = Problem(2048, 2048, 8), Target("cuda", "sm_90")
    tuned, origin = find(problem, target)
    assert tuned.precision.project == "tf32" and origin.endswith("2048x2048_b8.json")
    fp32, origin32 = find(problem, target, precision="fp32")
    assert fp32.precision == Precision() and fp32.panels == tuned.panels and fp32.aggregate == tuned.aggregate
    assert "fp32" in origin32
    assert tuned.lookahead == 32 and fp32.lookahead == 2  # fp32 products: the side update in pieces
    assert find(Problem(64, 64, 3), target, precision="fp32")[0] == default_schedule(Problem(64, 64, 3))
    for call in (lambda: find(problem, target, precision="tf32"),
                 lambda: qrgen.geqrf(np.ones((2, 4, 4), np.float32), precision="fast"),
                 lambda: qrgen.lstsq(np.ones((2, 4, 4), np.float32), np.ones((2, 4), np.float32), precision=32),
                 lambda: qrgen.qr(np.ones((2, 4, 4), np.float32), precision="bf16")):
        with pytest.raises(ValueError, match="precision must be None"):
            call()


@pytest.mark.parametrize("m,n,batch,direct", [(10, 100, 4, False), (32, 200, 4, False), (1, 64, 4, False),
                                              (32, 32, 4, True), (100, 8, 4, True), (64, 64, 4, True),
                                              (96, 64, 4, False), (128, 512, 4, False), (128, 512, 100, False),
                                              (128, 129, 100, False), (128, 128, 100, True)])
def test_input_read_directly_only_by_a_lone_panel_with_nothing_right_of_it(m, n, batch, direct):
    """A one-panel schedule may read the caller's array in place of a copy into h, but only if no columns lie
    right of the panel: a wide matrix's trailing columns must be in h before the panel's update or its aggregate's
    (128 x 512: one cols panel whose aggregate updates the 384 columns right of it). Nor is such a schedule the fast
    lane's one launch."""
    from qrgen.run.factorizer import Factorizer

    schedule = default_schedule(Problem(m, n, batch))
    fac = Factorizer(m, n, schedule, Target("cuda", "sm_90"))
    assert (fac.direct_vec > 0) == direct
    assert not fac.one_launch or direct


@pytest.mark.parametrize("m,n,batch,expect", [
    (1024, 1024, 4, ("tf32", "tf32x3", 2)),  # aggregates: updates as three tf32 products (lookahead in pieces), ...
    (1536, 1536, 8, ("tf32", "tf32x3", 2)),  # ... projections in tf32 from TF32_PROJECT_FROM columns
    (1024, 1024, 200, ("tf32", "tf32x3", 2)),
    (8192, 1024, 2, ("tf32x3", "tf32x3", 2)),  # ... not where cuBLAS takes the panels' own products with them
    (2048, 2048, 8, ("tf32", "tf32", 32)),     # from TF32_FROM columns with fp32 panel products: tf32, one piece
    (600, 600, 8, ("fp32", "fp32", 0)),        # no aggregates below AGGREGATE_FROM: every product fp32 ...
    (1024, 1024, 60, ("tf32", "tf32x3", 0)),   # ... except cols panels each their own aggregate (default_cols_tall)
    (768, 768, 60, ("tf32x3", "tf32x3", 0)),
    (600, 600, 40, ("tf32x3", "tf32x3", 0)),
    (512, 512, 40, ("tf32x3", "tf32x3", 0)),   # ... except cols panels each their own aggregate (cols_aggregates)
    (512, 512, 640, ("tf32x3", "tf32x3", 0)),  # ... past 132 matrices too where they are 64 columns wide
    (512, 1024, 100, ("tf32x3", "tf32x3", 0)),  # ... and wide ones, over their first m columns
])
def test_default_precision_of_the_aggregates(m, n, batch, expect):
    s = default_schedule(Problem(m, n, batch))
    assert (s.precision.project, s.precision.update, s.lookahead) == expect
    assert s.precision.gram == "fp32"


def test_one_warp_tail_moves_only_panels_of_at_most_32_rows():
    """schedule.panels.one_warp_tail: a panel whose rows (m less its first column) are at most ONE_WARP_ROWS goes onto one
    warp's lanes panel, whatever it ran on; every other panel stays as it was; the committed 176² and 352² files (cols
    panels, the last of 96 rows at 352²) stay."""
    from qrgen.schedule.panels import ONE_WARP_ROWS, one_warp_tail

    cluster = Panel(32, "lanes", 64, 8, cluster=True)
    s = Schedule(96, 96, (Panel(32, "lanes", 128), cluster, Panel(16, "lanes", 32, 2, cluster=True),
                          Panel(16, "warp", 32, loop=True)))
    t = one_warp_tail(s)
    assert t.panels[:2] == s.panels[:2]  # 96 and 64 rows
    assert t.panels[2:] == (Panel(16, "lanes", 32), Panel(16, "lanes", 32))  # 32 and 16 rows
    assert ONE_WARP_ROWS == 32 and one_warp_tail(t) == t
    for n in (176, 352):
        committed, _ = find(Problem(n, n, 40), Target("cuda", "sm_90"))
        assert one_warp_tail(committed) == committed


def test_with_cluster_moves_only_cluster_panels():
    """schedule.panels.with_cluster: every cluster panel (from min_rows rows) onto clusters of the given size, lanes panels
    of CLUSTER_LANE_SLOTS rows per warp where they fit; panels on one block and the widths stay as they were."""
    from qrgen.schedule.panels import cluster_lanes_panel, default_panel, lanes_panel, with_cluster

    panels, col = [], 0
    for width in (32, 32, 16, 32):
        rows = 4096 - col
        panels.append(cluster_lanes_panel(rows, width, 8) if col < 80 else default_panel(rows, width))
        col += panels[-1].width
    s = Schedule(4096, col, tuple(panels), aggregate=64)
    t = with_cluster(s, 16)
    assert [p.width for p in t.panels] == [p.width for p in s.panels] and t.aggregate == 64
    assert [p.cluster for p in s.panels] == [True] * 3 + [False]
    assert [(p.cluster, p.blocks) for p in t.panels[:3]] == [(True, 16)] * 3 and t.panels[3] == s.panels[3]
    assert t.panels[0] == lanes_panel(4096, 32, 16, 16) and t.panels[0].threads == 512
    u = with_cluster(s, 16, min_rows=4096 - 40)
    assert [p.blocks for p in u.panels[:3]] == [16, 16, 8] and u.panels[3] == s.panels[3]
    assert with_cluster(t, 16) == t
    v = with_cluster(s, 16, every=True)  # the one-block panel too
    assert v.panels[:3] == t.panels[:3] and v.panels[3] == lanes_panel(4096 - 80, s.panels[3].width, 16, 16)


def test_with_cluster_onto_one_block():
    """with_cluster(schedule, 1): the cluster panels on one block each (how the 176² and 352² files were amended):
    lanes panels of about `slots` rows a warp where one block holds them, else rows panels on one block, never a
    "cluster" of one block (which Panel refuses)."""
    from qrgen.schedule.panels import cluster_lanes_panel, lanes_panel, with_cluster

    s = Schedule(512, 64, (cluster_lanes_panel(512, 32, 2), cluster_lanes_panel(480, 32, 2)))
    assert all(p.cluster and p.blocks == 2 for p in s.panels)
    one = with_cluster(s, 1, slots=16)
    # 512 or 480 rows as lanes of 16 rows a warp: 30-32 warps, more registers than 1,024 threads leave
    assert all(p.blocks == 1 and not p.cluster and p.variant == "rows" for p in one.panels)
    assert with_cluster(one, 1, slots=16) == one
    m = Schedule(352, 64, (cluster_lanes_panel(352, 32, 8), cluster_lanes_panel(320, 32, 8)))
    assert with_cluster(m, 1, slots=16).panels == (lanes_panel(352, 32, 16), lanes_panel(320, 32, 16))
    assert lanes_panel(352, 32, 16).threads == 704


def test_default_for_many_matrices_of_384_to_512_rows():
    """default_many: from MANY_FROM matrices with min(m, n) >= 384 and m <= 512, the recipe of a 640 x 512² file
    tuned before cols panels (16-wide looped rows panels, warp panels below 129 rows, lanes on one warp for the last
    32 columns, aggregates of 64 in tf32x3, lookahead 2, fused panel products, no clusters), where cols panels do
    not take them (default_cols_aggregates: on sm_90 they take every one, wide ones over their first m columns; on
    sm_89's smaller shared memory not those of 400 rows or more). Outside the bounds the former default."""
    from qrgen.schedule.heuristic import MANY_FROM, default_many

    sm89 = Target("cuda", "sm_89")
    many = default_schedule(Problem(512, 1024, 640), sm89)
    assert default_many(Problem(512, 1024, 640)) and len(many.panels) == 32
    assert {(p.width, p.variant, p.loop) for p in many.panels[:-2]} == {(16, "rows", True), (16, "warp", True)}
    assert many.panels[-2:] == (Panel(16, "lanes", 32), Panel(16, "lanes", 32))
    assert (many.precision, many.aggregate, many.lookahead, many.panel_update, many.reach) == (
        Precision(project="tf32x3", update="tf32x3"), 64, 2, "fused", False)
    for problem in (Problem(512, 512, 640), Problem(400, 1000, MANY_FROM), Problem(512, 600, 300)):
        s = default_schedule(problem, sm89)
        assert default_many(problem) and s.aggregate == 64 and s.precision.update == "tf32x3", problem
        assert {p.width for p in s.panels} == {16} and all(p.loop for p in s.panels if p.variant != "lanes")
    for problem in (Problem(512, 512, 640), Problem(384, 384, 133), Problem(512, 384, 300), Problem(512, 1024, 640),
                    Problem(384, 500, 300), Problem(400, 1000, MANY_FROM)):  # sm_90: cols panels
        assert default_many(problem) and default_schedule(problem).panels[0].variant == "cols", problem
    narrow = Problem(512, 383, 640)
    assert not default_many(narrow) and default_schedule(narrow).panels[0].variant == "cols"
    for problem in (Problem(400, 1000, MANY_FROM - 1), Problem(513, 513, 640)):
        assert not default_many(problem), problem
        assert default_schedule(problem, sm89).aggregate == 0
        assert 32 in {p.width for p in default_schedule(problem, sm89).panels}
    assert not default_many(Problem(383, 512, 640))  # a wide one: cols panels of 64 where they fit, sm_89's too
    assert default_schedule(Problem(383, 512, 640), sm89).panels[0].variant == "cols"


def test_default_for_tall_cols_panels():
    """default_cols_tall: 513 to 1,024 rows, n >= 512, 16 to 132 matrices, on sm_90: cols panels on
    clusters of two with 4 columns a warp, each the widest of 128, 96 and 64 columns that fits its rows with 8
    registers to spare at 512 threads, each its own aggregate, tf32x3_precision's products; the tuner's default point
    gives it. Outside the bounds the former default."""
    from qrgen.plan import cols, family
    from qrgen.schedule.heuristic import COLS_TALL_HEADROOM, default_cols_tall
    from qrgen.tune.space import default_params, schedule_from_params

    s = default_schedule(Problem(1024, 1024, 60))
    assert [p.width for p in s.panels] == [96, 96, 96, 128, 128, 128, 128, 128, 96]
    assert s.aggregate == tuple(p.width for p in s.panels) and s.lookahead == 0
    assert all(p.variant == "cols" and p.cluster and p.blocks == 2 and p.slice == 4 for p in s.panels)
    assert s.precision == Precision(project="tf32", update="tf32x3")  # tf32 projections from 1,024 columns
    assert default_schedule(Problem(768, 768, 60)).precision == Precision(project="tf32x3", update="tf32x3")
    for problem in (Problem(1024, 1024, 16), Problem(1000, 1000, 132), Problem(768, 768, 60), Problem(1024, 512, 60),
                    Problem(600, 600, 40)):
        tall = default_schedule(problem)
        assert tall == default_cols_tall(problem) == schedule_from_params(problem, default_params(problem)), problem
        for panel, c0 in zip(tall.panels, tall.starts()):
            cap = family.register_cap(panel.threads, Target().limits)
            cap -= COLS_TALL_HEADROOM if panel.threads >= 512 else 0
            assert cols.registers(panel, problem.m - c0) <= cap
    for problem in (Problem(1024, 1024, 15), Problem(1024, 1024, 133), Problem(1025, 1025, 60),
                    Problem(1024, 511, 60), Problem(2048, 2048, 60)):
        assert default_cols_tall(problem) is None, problem
        assert not all(p.variant == "cols" for p in default_schedule(problem).panels), problem
    assert default_cols_tall(Problem(512, 512, 40)) is None  # default_cols_aggregates's
    for arch in ("sm_80", "sm_100", "sm_120"):  # no clusters; measured on sm_90 only (sm_100's ptxas spills them)
        assert default_cols_tall(Problem(1024, 1024, 60), Target("cuda", arch)) is None


def test_a_tuned_file_serves_the_batches_near_its_own(tmp_path, monkeypatch):
    """BATCH_REACH: a file for batch B serves b with B / 1.25 <= b <= 1.25 B where no file for b exists, the
    nearest by ratio; the user's folder is searched before the shipped one; a named folder alone."""
    from dataclasses import replace as with_

    from qrgen.paths import schedule_dir
    from qrgen.schedule.files import BATCH_REACH, lookup, save

    target = Target()
    shipped = schedule_dir() / "sm_90" / "1024x1024_b60.json"
    for batch in (48, 59, 61, 75):
        assert lookup(Problem(1024, 1024, batch), target) == shipped
    for batch in (47, 76, 1):
        assert lookup(Problem(1024, 1024, batch), target) is None
    assert BATCH_REACH == 1.25
    base = default_schedule(Problem(96, 64, 10))
    root = tmp_path / "mine"
    for batch in (10, 14):
        save(with_(base, lookahead=0), Problem(96, 64, batch), target, {"origin": "test"}, root=root)
    assert lookup(Problem(96, 64, 11), target, root).name == "96x64_b10.json"
    assert lookup(Problem(96, 64, 12), target, root).name == "96x64_b14.json"  # 12/10 > 14/12
    assert lookup(Problem(96, 64, 14), target, root).name == "96x64_b14.json"
    assert find(Problem(96, 64, 13), target, root)[1].endswith("96x64_b14.json")
    monkeypatch.setenv("QRGEN_SCHEDULE_DIR", str(root))
    mine = save(base, Problem(1024, 1024, 60), target, {"origin": "test"})
    assert mine == root / "sm_90" / "1024x1024_b60.json" and lookup(Problem(1024, 1024, 59), target) == mine
    assert lookup(Problem(1024, 1024, 59), target, schedule_dir()) == shipped


def test_a_keep_plan_whose_panel_does_not_fit_shared_memory_is_refused():
    """A cols panel over all 176 columns fits its blocks (each holds every reflector, tau and mbarrier), but kept for Q it needs
    G and T of 176 columns too: no keep plan (qr then forms Q from h and tau); narrower panels keep theirs."""
    schedule, _ = find(Problem(176, 176, 40), Target("cuda", "sm_90"))
    assert schedule.panels == (Panel(176, "cols", 704, 2, 4, cluster=True),)
    assert len(plan(schedule).kernels) == 1
    with pytest.raises(ValueError, match="no keep plan"):
        plan(schedule, keep=True)
    narrow = Schedule(176, 176, (Panel(96, "cols", 768, 1, 4), Panel(80, "cols", 640, 1, 4)))
    assert plan(narrow, keep=True).keep


def test_the_panels_own_products_split_over_blocks_for_several_tall_matrices():
    """Past FUSED_MAX_ROWS rows, SPLIT_MIN_BATCH or more matrices of at most SPLIT_MAX_COLS columns take the rowsplit
    kernels for the panels' own products (tsqr panels too), one matrix cuBLAS; up to FUSED_MAX_ROWS the fused kernel
    (docs/decisions.md#rowsplit-batches)."""
    from qrgen.schedule.heuristic import FUSED_MAX_ROWS, SPLIT_MAX_COLS, SPLIT_MIN_BATCH

    def update(batch, m, n):
        return default_schedule(Problem(m, n, batch)).panel_update

    tall = FUSED_MAX_ROWS + 1
    assert update(SPLIT_MIN_BATCH, tall, 64) == update(4, 40000, 128) == update(2, 100000, 32) == "rowsplit"
    assert update(SPLIT_MIN_BATCH, tall, SPLIT_MAX_COLS) == "rowsplit"
    assert update(SPLIT_MIN_BATCH, tall, SPLIT_MAX_COLS + 1) == "cublas"
    assert update(1, tall, 64) == update(1, 40000, 128) == "cublas"
    assert update(SPLIT_MIN_BATCH, FUSED_MAX_ROWS, 64) == "fused"
    assert default_schedule(Problem(40000, 128, 4)).panels[0].variant == "tsqr"
