"""CPU layer: the launch sequence (run/sequence.drive: offsets, leading dimensions, batch strides, aggregates,
lookahead, reach, Q from kept blocks) run by the NumPy engine (the CPU backend, run/numpy_engine.py) gives the
reference's factorization."""
import dataclasses

import numpy as np
import pytest

from qrgen.numerics import reference
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, stress
from qrgen.plan import apply3, planner, tf32x3
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.run import numpy_engine
from qrgen.run.numpy_engine import CpuFactorizer, NumpyEngine
from qrgen.run.sequence import drive
from qrgen.schedule.heuristic import default_schedule
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.targets import Target


def _uniform(m, n, width, aggregate=0, precision=Precision(), variant="rows", panel_update="cublas",
             lookahead=0, reach=False):
    k = min(m, n)
    widths = [width] * (k // width) + ([k % width] if k % width else [])
    if variant == "cols":
        panels = tuple(Panel(w, "cols", 32 * -(-w // 4), 1, 4) for w in widths)
    elif variant == "lanes":
        panels = tuple(Panel(w, "lanes", 256) for w in widths)
    else:
        panels = tuple(Panel(w, "rows", 64) for w in widths)
    return Schedule(m, n, panels, precision, aggregate, panel_update, lookahead, reach)


SCHEDULES = [
    default_schedule(Problem(100, 100)),
    default_schedule(Problem(130, 70)),
    default_schedule(Problem(70, 130)),
    _uniform(200, 200, 16, aggregate=64),
    _uniform(300, 130, 16, aggregate=64),
    _uniform(96, 160, 32, aggregate=32),
    _uniform(150, 150, 8, aggregate=48, precision=Precision("tf32", "tf32", "bf16")),
    _uniform(160, 160, 32, aggregate=96, variant="cols"),
    _uniform(192, 170, 64, aggregate=64, variant="cols"),
    _uniform(192, 192, 64, aggregate=64, precision=Precision("fp32", "tf32x3", "tf32x3"), variant="cols"),
    _uniform(160, 120, 16, aggregate=64, precision=Precision("tf32", "fp32", "fp32"), variant="lanes"),
    _uniform(200, 150, 8, aggregate=64, panel_update="rowsplit"),
    _uniform(90, 120, 32, panel_update="rowsplit", variant="lanes"),
    _uniform(200, 200, 16, aggregate=32, lookahead=32),
    _uniform(300, 170, 16, aggregate=48, lookahead=2, panel_update="rowsplit"),
    _uniform(130, 230, 32, aggregate=32, lookahead=1, variant="lanes"),
    _uniform(192, 160, 16, aggregate=64, precision=Precision("fp16", "bf16", "fp16"), panel_update="rowsplit"),
    _uniform(224, 160, 16, aggregate=64, precision=Precision("fp32", "tf32x3", "tf32x3"), lookahead=2),
    _uniform(200, 150, 8, aggregate=64, panel_update="fused"),
    _uniform(90, 120, 32, panel_update="fused", variant="lanes"),
    _uniform(300, 170, 16, aggregate=48, lookahead=2, panel_update="fused"),
    _uniform(150, 150, 20, aggregate=40, precision=Precision("fp32", "tf32x3", "tf32x3"), panel_update="fused"),
    _uniform(300, 170, 16, aggregate=48, lookahead=2, panel_update="fused", reach=True),
    _uniform(130, 230, 32, aggregate=32, lookahead=1, variant="lanes", reach=True),
    _uniform(224, 160, 16, aggregate=32, precision=Precision("fp16", "bf16", "fp16"), lookahead=32, reach=True),
]


def _id(s):
    return (f"{s.m}x{s.n}-a{s.aggregate}-{s.panel_update}" + ("-ahead" if s.lookahead else "")
            + ("-reach" if s.reach else ""))


@pytest.mark.parametrize("schedule", SCHEDULES, ids=_id)
def test_launch_sequence_matches_the_reference(schedule):
    a = stress("random", schedule.m, schedule.n, 3, seed=schedule.m)
    h, tau, log = numpy_engine.geqrf(a, schedule)
    hr, tr = reference.geqrf(a, schedule, dtype=np.float32)
    scale = np.abs(a).max()
    assert np.abs(h - hr).max() <= 1e-4 * scale and np.abs(tau - tr).max() <= 1e-4
    panels = [entry for entry in log if entry[0] == "panel"]
    assert len(panels) == len(schedule.panels)


@pytest.mark.parametrize("family", FAMILIES)
def test_aggregated_schedule_passes_the_gates(family):
    schedule = _uniform(192, 192, 16, aggregate=64)
    a = stress(family, 192, 192, 2, seed=3)
    h, tau, _ = numpy_engine.geqrf(a, schedule)
    assert check(a, h, tau).ok


def test_fused_panel_products():
    """panel_update "fused": each panel's two products are one fused launch in fp32 (whatever the aggregates'
    precision), the aggregates' products stay GEMMs; saved and loaded with the schedule; panels of up to 32."""
    schedule = _uniform(150, 150, 20, aggregate=40, precision=Precision("fp32", "tf32", "tf32"), panel_update="fused")
    _, _, log = numpy_engine.geqrf(stress("random", 150, 150, 2, seed=2), schedule)
    fused = [e for e in log if e[0] == "fused"]
    assert fused
    panels_with_products = [L for L in plan(schedule).launches if L.nc > 0]
    assert [(e[1], e[2], e[3]) for e in fused] == [(L.width, L.rows, L.nc) for L in panels_with_products]
    gemms = [e for e in log if e[0] == "gemm"]
    assert {e[1] for e in gemms} == {"gram", "aggregate", "project", "update"}
    assert {e[2] for e in gemms if e[1] in ("project", "update")} == {"tf32"}
    assert Schedule.from_json(schedule.to_json()) == schedule and schedule.to_json()["panel_update"] == "fused"
    assert [k.name for k in plan(schedule).kernels if k.variant == "fused"] == [
        "qr_fused_w20", "qr_fused_w20_c2", "qr_fused_w20_c4", "qr_fused_w20_c8"]
    with pytest.raises(ValueError, match="'fused' takes panels of at most 32"):
        _uniform(128, 128, 64, panel_update="fused", variant="cols")


@pytest.mark.parametrize("m,n,aggregate,lookahead", [(320, 256, 64, 0), (320, 320, 128, 2), (1400, 256, 64, 0)])
def test_fused_aggregate_products(m, n, aggregate, lookahead, monkeypatch):
    """aggregate_update "fused": each aggregate's W = (VT)^T C and C -= V W as one apply3 launch where its shared
    memory holds the aggregate's rows (the two tf32x3 GEMMs elsewhere), h and tau bit for bit the two-GEMM
    schedule's with (VT)^T formed (the same products, W rounded to fp32 between; T applied neither by the projection
    nor after it: tf32x3.t_fused and planner.t_late off); saved and loaded with the schedule; refused without
    aggregates or tf32x3 products."""
    monkeypatch.setattr(tf32x3, "t_fused", lambda *args, **kwargs: False)
    monkeypatch.setattr(planner, "t_late", lambda *args, **kwargs: False)
    gemm = _uniform(m, n, 32, aggregate=aggregate, precision=Precision("fp32", "tf32x3", "tf32x3"),
                    lookahead=lookahead)
    if m > 1024:  # the default's panels (lanes on clusters)
        gemm = dataclasses.replace(gemm, panels=default_schedule(Problem(m, n)).panels)
    fused = dataclasses.replace(gemm, aggregate_update="fused")
    a = stress("random", m, n, 2, seed=3)
    h0, t0, _ = numpy_engine.geqrf(a.copy(), gemm)
    h1, t1, log = numpy_engine.geqrf(a.copy(), fused)
    assert np.array_equal(h0, h1) and np.array_equal(t0, t1)
    applied = [e for e in log if e[0] == "apply"]
    aggs = [g for g in plan(fused).aggregates if g.nc > 0]
    fits = [g for g in aggs if apply3.takes(aggregate, g.rows, Target())]
    assert applied and all(e[1] == aggregate for e in applied)
    assert {e[2] for e in applied} == {g.rows for g in fits}
    assert (len(fits) < len(aggs)) == (m == 1400)  # 1,400 rows of C's 32 columns do not fit shared memory
    spec = next(k for k in plan(fused).kernels if k.variant == "apply3")
    assert (spec.name, spec.shared_bytes) == (apply3.name(aggregate), apply3.shared_bytes(aggregate,
                                                                                          max(g.rows for g in fits)))
    assert Schedule.from_json(fused.to_json()) == fused and fused.to_json()["aggregate_update"] == "fused"
    assert "aggregate_update" not in gemm.to_json() and "aggregate products fused" in fused.describe()
    with pytest.raises(ValueError, match="'fused' needs aggregates"):
        dataclasses.replace(gemm, precision=Precision(), aggregate_update="fused")
    with pytest.raises(ValueError, match="aggregate_update must be one of"):
        dataclasses.replace(gemm, aggregate_update="one")


def test_fused_cluster_choice():
    """A fused launch splits its rows over a cluster where its 32-column blocks leave SMs idle: the most blocks per
    cluster (up to 8) within two resident blocks per SM of 132, at least 128 rows a block."""
    from qrgen.plan.fused import cluster

    cases = {(60, 96, 1024): 1, (60, 64, 1024): 2, (60, 32, 1024): 4, (60, 32, 200): 1, (640, 32, 512): 1,
             (8, 96, 2048): 8, (2, 120, 4096): 8, (1, 1000, 1000): 4, (1, 32, 100): 1}
    assert {case: cluster(*case, 132) for case in cases} == cases
    # the cost model walks a block's share of the rows: less time where a cluster splits them, same where none does
    from qrgen.tune.costmodel import FUSED_FIXED_US, FUSED_US_PER_ROW, fused_us

    assert fused_us(2048, 1000, 32, 1) < (FUSED_FIXED_US + 2048 * FUSED_US_PER_ROW) / 2
    assert fused_us(1024, 96, 32, 60) == pytest.approx(FUSED_FIXED_US + 1024 * FUSED_US_PER_ROW * (180 / 132) ** 1.4)


def test_aggregates_do_rank_a_updates():
    schedule = _uniform(256, 256, 16, aggregate=128)
    _, _, log = numpy_engine.geqrf(stress("random", 256, 256, 1), schedule)
    assert [e[1] for e in log if e[0] == "gemm"].count("gram") == 1  # one aggregate has columns right of it
    assert sum(1 for e in log if e[0] == "tmat") == 1 and ("zero", "reflectors") in log


@pytest.mark.parametrize("project", ["tf32", "tf32x3"])
def test_t_late_aggregates(project):
    """Where one stream runs the merges (no lookahead), an aggregate with columns right of it whose panel does not
    form its T forks: G and T on the main stream, V^T C on the side stream into W's buffer, then the join,
    W = T^T (V^T C) into the (VT)^T buffer and the update (planner.t_late); a tf32x3 projection (which then does
    not apply T itself: not t_fused) only where fewer columns than rows lie right of the aggregate; none with
    lookahead, apply3, in keep plans, or where the panel formed T (t_out)."""
    m, n = (256, 320) if project == "tf32" else (320, 256)
    schedule = _uniform(m, n, 32, aggregate=64, precision=Precision("fp32", project, "tf32x3"), variant="cols")
    _, _, log = numpy_engine.geqrf(stress("random", m, n, 2, seed=4), schedule)
    merges = [i for i, e in enumerate(log) if e[0] == "fork"]
    # every aggregate with columns right of it (256 x 320: the last has 64)
    assert plan(schedule).t_late == ((0, 1, 2, 3) if project == "tf32" else (0, 1, 2)) and plan(schedule).t_fused == ()
    assert len(merges) == len(plan(schedule).t_late)
    for i in merges:
        assert log[i + 1:i + 7] == [("gemm", "gram", "tf32x3", "cublas"), ("tmat", log[i + 2][1]),
                                    ("gemm", "project", project, "cublas", "side"), ("join",),
                                    ("gemm", "aggregate", "tf32x3", "cublas"), ("gemm", "update", "tf32x3", "cublas")]
    for other in (dataclasses.replace(schedule, lookahead=2),
                  dataclasses.replace(schedule, precision=Precision("fp32", "tf32x3", "tf32x3"),
                                      aggregate_update="fused")):
        assert plan(other).t_late == ()
    # as many columns right of each aggregate as rows: the tf32x3 projections apply T (t_fused)
    wide = _uniform(256, 320, 32, aggregate=64, precision=Precision("fp32", "tf32x3", "tf32x3"), variant="cols")
    assert plan(wide).t_late == () and plan(wide).t_fused == (0, 1, 2, 3)
    # one cols panel an aggregate on one block forms its T: its tf32x3 projection applies it (t_fused), no fork
    own = Schedule(256, 320, (Panel(64, "cols", 256, 1, 8),) * 4, Precision("fp32", "tf32x3", "tf32x3"), aggregate=64)
    assert plan(own).t_late == () and plan(own).t_fused == (0, 1, 2, 3)
    assert plan(schedule, keep=True).t_late == ()
    for s in SCHEDULES:  # disjoint: sequence.drive and bench take a t_late aggregate as never t_fused
        assert not set(plan(s).t_late) & set(plan(s).t_fused), _id(s)


def test_aggregate_validation():
    with pytest.raises(ValueError, match="straddle"):
        Schedule(100, 100, (Panel(24, "rows", 64),) * 4 + (Panel(4, "rows", 64),), aggregate=32)
    with pytest.raises(ValueError, match="Schedule.aggregate"):
        _uniform(100, 100, 20, aggregate=-1)
    s = _uniform(100, 100, 20, aggregate=40)
    assert Schedule.from_json(s.to_json()) == s and s.to_json()["aggregate"] == 40
    assert "aggregate" not in default_schedule(Problem(50, 50)).to_json()


@pytest.mark.parametrize("lookahead,reach", [(0, False), (2, False), (2, True)])
def test_aggregates_of_given_widths(lookahead, reach):
    """Schedule.aggregate as a tuple: each aggregate's width in turn (narrower where the columns are tallest); the
    planner's aggregates follow it (with reach, each reaching through the next), it saves and loads, its products
    pass the gates on every stress family; widths that do not sum to min(m, n), a window a panel straddles, or a
    non-positive width are refused."""
    from qrgen.plan.layout import aggregates

    panels = (Panel(16, "rows", 64),) * 6 + (Panel(32, "rows", 64),) * 3
    schedule = Schedule(240, 192, panels, Precision("fp32", "tf32x3", "tf32x3"), aggregate=(32, 64, 96),
                        lookahead=lookahead, reach=reach)
    assert schedule.windows() == [(0, 32), (32, 96), (96, 192)] and schedule.widest_aggregate == 96
    aggs = aggregates(schedule)
    assert [(a.a0, a.a1, a.c1, a.first, a.last) for a in aggs] == [
        (0, 32, 96 if reach else 32, 0, 1), (32, 96, 192 if reach else 96, 2, 5), (96, 192, 192, 6, 8)]
    assert Schedule.from_json(schedule.to_json()) == schedule and schedule.to_json()["aggregate"] == [32, 64, 96]
    assert "aggregates of 1x32 + 1x64 + 1x96 columns" in schedule.describe()
    for family in FAMILIES:
        a = stress(family, 240, 192, 2, seed=4)
        h, tau, log = numpy_engine.geqrf(a, schedule)
        assert check(a, h, tau).ok, family
    # a merge for each aggregate whose form updates columns (with reach: past the next aggregate)
    assert sum(1 for e in log if e[0] == "tmat") == (1 if reach else 2)
    with pytest.raises(ValueError, match="summing to"):
        Schedule(240, 192, panels, aggregate=(32, 64))
    with pytest.raises(ValueError, match="straddle"):
        Schedule(240, 192, panels, aggregate=(40, 56, 96))
    with pytest.raises(ValueError, match="Schedule.aggregate"):
        Schedule(240, 192, panels, aggregate=(0, 96, 96))


def test_skipping_stages_leaves_the_others():
    """The engine wrapper that `qrgen bench --profile` times by difference passes everything but the named stages."""
    from qrgen.run.engine import SkipStages

    schedule = _uniform(200, 200, 16, aggregate=64)
    a = stress("random", 200, 200, 2, seed=1)
    fac = CpuFactorizer(schedule)
    engine = NumpyEngine(fac, a.copy(), np.zeros((2, 200), dtype=np.float32))
    drive(fac, SkipStages(engine, ("project", "update", "gram", "tmat", "aggregate")))
    assert {entry[0] for entry in engine.log} == {"panel", "zero", "fork", "join"}  # (t_late aggregates' streams)
    assert sum(entry[0] == "panel" for entry in engine.log) == len(schedule.panels)
    full = numpy_engine.geqrf(a, schedule)[2]
    engine = NumpyEngine(fac, a.copy(), np.zeros((2, 200), dtype=np.float32))
    drive(fac, SkipStages(engine, ("gram", "tmat", "aggregate")))
    assert [e for e in full if e[:2] not in (("gemm", "gram"), ("gemm", "aggregate")) and e[0] != "tmat"] == engine.log
    # "own": the panels' own products (the pair after each panel with columns left in its aggregate) and nothing else
    engine = NumpyEngine(fac, a.copy(), np.zeros((2, 200), dtype=np.float32))
    drive(fac, SkipStages(engine, ("own",)))
    owned = {i + k for i, e in enumerate(full[:-1]) if e[0] == "panel" and full[i + 1][:2] == ("gemm", "project")
             for k in (1, 2)}
    assert len(owned) == 2 * sum(L.nc > 0 for L in fac.launches) > 0
    assert engine.log == [e for i, e in enumerate(full) if i not in owned]
    with pytest.raises(ValueError, match="unknown stages"):
        SkipStages(engine, ("panels",))


def test_split_panel_products():
    """panel_update "rowsplit": the panels' own products go to the rowsplit kernels in fp32 (whatever the precision
    of the aggregates' products), the aggregates' through cuBLAS. The default takes the fused kernel up to 4,096 rows
    (one matrix: up to 4096 x 1024), with the aggregates' products in tf32 from 2,048 columns as with rowsplit, and
    past 4,096 rows rowsplit for several matrices of up to 512 columns."""
    from qrgen.plan.rowsplit import split_rows

    schedule = _uniform(200, 150, 8, aggregate=64, precision=Precision("fp32", "tf32", "tf32"), panel_update="rowsplit")
    _, _, log = numpy_engine.geqrf(stress("random", 200, 150, 2, seed=2), schedule)
    gemms = [e for e in log if e[0] == "gemm"]
    panel_level = [e for e in gemms if e[3] == "rowsplit"]
    assert panel_level and {e[2] for e in panel_level} == {"fp32"} and {e[1] for e in panel_level} == {"project",
                                                                                                        "update"}
    assert {e[2] for e in gemms if e[3] == "cublas" and e[1] in ("project", "update")} == {"tf32"}
    assert Schedule.from_json(schedule.to_json()) == schedule and schedule.to_json()["panel_update"] == "rowsplit"
    assert "panel_update" not in _uniform(100, 100, 20).to_json()
    for problem in (Problem(4096, 4096, 2), Problem(2048, 2048, 8)):
        chosen = default_schedule(problem)
        assert chosen.panel_update == "fused" and chosen.precision == Precision("fp32", "tf32", "tf32")
    for problem in (Problem(4096, 4096, 1), Problem(4097, 1000, 1), Problem(8192, 513, 8), Problem(40000, 256, 1)):
        assert default_schedule(problem).panel_update == "cublas"
    for problem in (Problem(8192, 512, 8), Problem(40000, 128, 4)):  # several tall matrices
        assert default_schedule(problem).panel_update == "rowsplit"
    for problem in (Problem(1024, 1024, 200), Problem(600, 600, 3), Problem(520, 1024, 100), Problem(1000, 1000, 1),
                    Problem(4096, 1024, 1), Problem(2048, 2048, 1), Problem(4096, 64, 64)):
        assert default_schedule(problem).panel_update == "fused"
    assert default_schedule(Problem(1024, 1024, 60)).precision.update == "tf32x3"  # under 2,048 columns
    for bad in ("splitk", "split"):  # (and the former name: schedule files spelling it are upgraded on read)
        with pytest.raises(ValueError, match="panel_update"):
            _uniform(100, 100, 20, panel_update=bad)
    # about two blocks per SM of 132, whole tiles of 64 rows, every row covered once
    for rows, nc, batch in [(4096, 120, 2), (100, 8, 1), (1000, 480, 640), (64, 32, 1), (100000, 24, 1)]:
        splits, chunk = split_rows(rows, nc, batch, 132)
        assert chunk % 64 == 0 and (splits - 1) * chunk < rows <= splits * chunk
        assert splits == 1 or batch * -(-nc // 32) * (splits - 1) < 2 * 132


def test_lookahead_lanes():
    """Lookahead: each aggregate but the last two updates the next aggregate's columns on the main stream, then
    forks the rest to the side stream, joined before the next aggregate's own update; the NumPy engine runs side
    work at the join (the latest the GPU could), so a join left out shows as a wrong factorization."""
    schedule = _uniform(256, 256, 16, aggregate=64, lookahead=32)
    a = stress("random", 256, 256, 2, seed=4)
    h, tau, log = numpy_engine.geqrf(a, schedule)
    hr, tr = reference.geqrf(a, schedule, dtype=np.float32)
    assert np.abs(h - hr).max() <= 1e-4 * np.abs(a).max()
    marks = [e[0] for e in log if e[0] in ("fork", "join")]
    assert marks == ["fork", "join"] * 2  # aggregates 0 and 1 fork; 2 has nothing past aggregate 3
    side = [e for e in log if e[-1] == "side"]
    assert [e[1] for e in side] == ["project", "update"] * 2
    assert ("zero", "reflectors_2") in log and ("zero", "reflectors") in log
    assert Schedule.from_json(schedule.to_json()) == schedule and schedule.to_json()["lookahead"] == 32
    assert "lookahead" not in _uniform(256, 256, 16, aggregate=64).to_json()
    with pytest.raises(ValueError, match="lookahead needs aggregates"):
        _uniform(100, 100, 20, lookahead=2)
    for bad in (True, -1, 2.0):
        with pytest.raises(ValueError, match="Schedule.lookahead"):
            _uniform(256, 256, 16, aggregate=64, lookahead=bad)

    class LateJoin(NumpyEngine):  # a plan that joined only at the end would read stale columns
        def join(self):
            pass

    fac = CpuFactorizer(schedule)
    late = a.copy()
    engine = LateJoin(fac, late, np.zeros((2, 256), dtype=np.float32))
    drive(fac, engine)
    NumpyEngine.join(engine)
    assert np.abs(late - hr).max() > 1e-2 * np.abs(a).max()


def test_reach():
    """Reach: each panel's own products run through the next aggregate's columns; each aggregate's merge and all
    its products go to the side lane (first the aggregate after next's columns, then a mark the next aggregate's
    first products wait for, then the rest), joined once at the end. The NumPy engine runs side work at the latest
    point the GPU could (a wait_mark for what precedes the mark, else the join), so a plan without the wait, or
    with two V^T buffers instead of three, gives a wrong factorization."""

    schedule = _uniform(320, 320, 32, aggregate=64, lookahead=32, panel_update="fused", reach=True)
    a = stress("random", 320, 320, 2, seed=4)
    h, tau, log = numpy_engine.geqrf(a, schedule)
    hr, tr = reference.geqrf(a, schedule, dtype=np.float32)
    assert np.abs(h - hr).max() <= 1e-4 * np.abs(a).max()
    plain, _, _ = numpy_engine.geqrf(a, _uniform(320, 320, 32, aggregate=64, lookahead=32, panel_update="fused"))
    assert np.abs(h - plain).max() <= 1e-4 * np.abs(a).max()
    # aggregates 0, 1 and 2 are merged (3 and 4 have nothing past the next aggregate), each marking the columns of
    # the aggregate after next (which the next one's panels reach into)
    assert [e[0] for e in log if e[0] in ("fork", "join", "mark", "wait_mark")] == [
        "fork", "mark", "wait_mark"] * 3 + ["join"]
    assert [e[1] for e in log if e[0] == "gemm" and e[-1] == "side"][:4] == ["gram", "aggregate", "project", "update"]
    assert ("tmat", 0, "side") in log and ("zero", "reflectors_3") in log
    fac = CpuFactorizer(schedule)
    assert [L.nc for L in fac.launches[:3]] == [96, 64, 96]  # to the next aggregate's end, not their own
    assert [(g.c1, g.nc) for g in fac.aggregates] == [(128, 192), (192, 128), (256, 64), (320, 0), (320, 0)]
    assert Schedule.from_json(schedule.to_json()) == schedule and schedule.to_json()["reach"] is True
    assert "reach" not in _uniform(320, 320, 32, aggregate=64, lookahead=32).to_json()
    with pytest.raises(ValueError, match="reach needs lookahead"):
        _uniform(320, 320, 32, aggregate=64, reach=True)
    with pytest.raises(ValueError, match="Schedule.reach"):
        _uniform(320, 320, 32, aggregate=64, lookahead=2, reach=1)

    class NoWait(NumpyEngine):
        def wait_mark(self):
            pass

    class TwoBuffers(NumpyEngine):
        def __init__(self, *args):
            super().__init__(*args)
            self.buffers["reflectors_3"] = self.buffers["reflectors"]
            self.buffers["aggregate_wy_3"] = self.buffers["aggregate_wy"]

    for engine_type in (NoWait, TwoBuffers):
        wrong = a.copy()
        engine = engine_type(fac, wrong, np.zeros((2, 320), dtype=np.float32))
        drive(fac, engine)
        NumpyEngine.join(engine)
        assert np.abs(wrong - hr).max() > 1e-2 * np.abs(a).max(), engine_type.__name__


class _SideAtOnce(NumpyEngine):
    """Side-stream work run as soon as it is queued, the earliest the GPU could (its fork waits for what the main
    stream queued before it): with the default engine, which runs it at the latest, the two bracket every order the
    GPU may take, so a main-stream operation queued after a fork that reads what the side stream writes shows
    here."""

    def gemm(self, stage, *args, side=False, **kwargs):
        super().gemm(stage, *args, **kwargs)

    def tmat(self, agg, side=False):
        super().tmat(agg)


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s.lookahead or plan(s).t_late], ids=_id)
def test_side_stream_work_at_its_earliest(schedule):
    a = stress("random", schedule.m, schedule.n, 2, seed=7)
    hr, _ = reference.geqrf(a, schedule, dtype=np.float32)
    fac = CpuFactorizer(schedule)
    h = a.copy()
    engine = _SideAtOnce(fac, h, np.zeros((2, fac.k), dtype=np.float32))
    drive(fac, engine)
    NumpyEngine.join(engine)
    assert not engine.held and any(e[0] == "fork" for e in engine.log)
    assert np.abs(h - hr).max() <= 1e-4 * np.abs(a).max()


def test_side_pieces_cover_the_columns_once():
    from qrgen.run.sequence import side_pieces

    for c0, c1, rows, batch, waves in [(256, 4096, 3840, 2, 2), (256, 4096, 3840, 2, 32), (128, 1024, 896, 60, 2),
                                       (64, 100, 50, 1, 1), (384, 2048, 1664, 8, 2)]:
        pieces = side_pieces(c0, c1, rows, batch, 132, waves)
        assert pieces[0][0] == c0 and pieces[-1][1] == c1
        assert all(a1 == b0 for (_, a1), (b0, _) in zip(pieces, pieces[1:]))
        assert all((b - a) % 64 == 0 and b - a >= 128 for a, b in pieces[:-1])
    assert len(side_pieces(256, 4096, 3840, 2, 132, 32)) == 1  # 32 waves: one piece at 2 x 4096²
    assert len(side_pieces(256, 4096, 3840, 2, 132, 2)) == 8  # 2 waves of 128² tiles: 512 columns a piece


@pytest.mark.parametrize("m,n,width,variant,panel_update", [(176, 176, 32, "lanes", "cublas"),
                                                             (200, 120, 16, "rows", "rowsplit"),
                                                             (90, 130, 32, "lanes", "cublas"),
                                                             (64, 64, 8, "rows", "cublas")])
@pytest.mark.parametrize("complete", [False, True])
def test_q_from_the_kept_panels(m, n, width, variant, panel_update, complete):
    """qr's Q from a keep plan (every panel's V^T and (VT)^T kept, two GEMMs a panel from the last:
    run/sequence.drive_q) matches the NumPy reference's Q; the factorization itself is unchanged by keeping."""
    from qrgen.numerics import qmatrix

    schedule = _uniform(m, n, width, variant=variant, panel_update=panel_update)
    a = stress("random", m, n, 2, seed=m + n)
    q, h, log = numpy_engine.qr(a, schedule, complete)
    hr, tr = reference.geqrf(a.astype(np.float64), schedule, dtype=np.float64)
    qr_ = qmatrix.householder_product(hr, tr, complete)
    assert q.shape == qr_.shape and np.abs(q - qr_).max() <= 2e-5 * max(m, n)
    h0, _, _ = numpy_engine.geqrf(a, schedule)
    assert np.array_equal(h, h0)
    assert [e[1] for e in log if e[0] == "gemm"][-2 * len(schedule.panels):] == ["qproject", "qupdate"] * len(
        schedule.panels)


KEPT_AGGREGATED = [_uniform(200, 200, 16, aggregate=64), _uniform(300, 130, 16, aggregate=64),
                   _uniform(96, 160, 32, aggregate=32), _uniform(200, 200, 16, aggregate=256),
                   _uniform(200, 200, 16, aggregate=32, lookahead=32),
                   _uniform(300, 170, 16, aggregate=48, lookahead=2, panel_update="rowsplit"),
                   _uniform(130, 230, 32, aggregate=32, lookahead=1, variant="lanes"),
                   _uniform(192, 160, 16, aggregate=64, precision=Precision("fp16", "bf16", "fp16"),
                            panel_update="rowsplit"),
                   _uniform(300, 170, 16, aggregate=48, lookahead=2, panel_update="fused", reach=True),
                   _uniform(130, 230, 32, aggregate=32, lookahead=1, variant="lanes", reach=True),
                   _uniform(192, 170, 64, aggregate=64, variant="cols")]  # panels writing V^T alone


@pytest.mark.parametrize("schedule", KEPT_AGGREGATED, ids=_id)
@pytest.mark.parametrize("complete", [False, True])
def test_q_from_the_kept_aggregates(schedule, complete, monkeypatch):
    """A keep plan with aggregates keeps each aggregate's V^T and (VT)^T (the last aggregate merged for Q alone;
    under lookahead every aggregate in a region of its own, no second buffers): Q from two GEMMs an aggregate
    matches the reference's Q, the factorization is geqrf's bit for bit (geqrf's with (VT)^T where its plan applies
    T after the projection instead, planner.t_late, which keep plans do not), and the regions do not overlap."""
    from qrgen.numerics import qmatrix
    from qrgen.run.buffers import Sizes, buffer_names

    m, n = schedule.m, schedule.n
    a = stress("random", m, n, 2, seed=m + n)
    q, h, log = numpy_engine.qr(a, schedule, complete)
    with monkeypatch.context() as patch:  # (keep plans form (VT)^T for Q: geqrf's plan without t_late aggregates)
        patch.setattr(planner, "t_late", lambda *args, **kwargs: False)
        h0, tau0, _ = numpy_engine.geqrf(a, schedule)
    assert np.array_equal(h, h0)
    # Q of the same reflectors, formed in float64 by blocks of 128: the kept aggregates' Q to fp32 rounding
    qr_ = qmatrix.householder_product(h0.astype(np.float64), tau0.astype(np.float64), complete)
    assert q.shape == qr_.shape and np.abs(q - qr_).max() <= 2e-5 * max(m, n)
    fac = CpuFactorizer(schedule, keep=True)
    aggs = fac.aggregates
    assert [(b.c0, b.width, b.wy) for b in fac.kept] == [(g.a0, g.a1 - g.a0, "aggregate_wy") for g in aggs]
    assert all(b.offset + b.width * b.rows == c.offset for b, c in zip(fac.kept, fac.kept[1:]))
    sizes = Sizes.of(fac)
    assert sizes.reflectors == sizes.aggregate_wy == fac.kept[-1].offset + fac.kept[-1].width * fac.kept[-1].rows
    assert "reflectors_2" not in buffer_names(fac) and "aggregate_wy_2" not in buffer_names(fac)
    gemms = [e[1] for e in log if e[0] == "gemm"]
    # per aggregate from the last: W's identity part (depth w), the rest over P22 alone where P has columns past
    # the block, then the update
    qcols = m if complete else min(m, n)
    expect = [g for b in reversed(fac.kept) for g in ["qproject"] * (1 + (qcols - b.c0 > b.width)) + ["qupdate"]]
    assert gemms.count("aggregate") == len(aggs) and gemms[-len(expect):] == expect
    assert gemms[-len(expect) - 1] != "qproject"
    assert log.count(("zero", "reflectors")) == 1 and log[0] in (("zero", "reflectors"), ("scale", 0))


def test_qr_keeps_q_only_where_every_kept_t_is_exact():
    """qrgen.qr's choice of a keep plan: aggregates when their Gram is fp32 (Q's orthogonality is T's accuracy: the
    committed 4096² schedules' fp16 Gram stays with qrgen.numerics.qmatrix); without aggregates, one panel or a
    small Q, and panels whose own G is exact (lanes) or fp32."""
    from qrgen.api import KEEP_MAX_FLOATS, keeps_q

    agg = _uniform(256, 256, 16, aggregate=64)
    assert keeps_q(agg, 16, 1 << 30)
    assert not keeps_q(_uniform(256, 256, 16, aggregate=64, precision=Precision("fp16", "bf16", "fp16")), 16, 1)
    assert not keeps_q(_uniform(256, 256, 16, aggregate=64, precision=Precision("tf32", "fp32", "fp32")), 16, 1)
    rows_tf32 = _uniform(256, 256, 16, precision=Precision("tf32", "fp32", "fp32"))
    lanes_tf32 = _uniform(256, 256, 16, variant="lanes", precision=Precision("tf32", "fp32", "fp32"))
    assert not keeps_q(rows_tf32, 16, 1) and keeps_q(lanes_tf32, 16, 1)
    plain = _uniform(256, 256, 16)
    assert keeps_q(plain, 16, KEEP_MAX_FLOATS) and not keeps_q(plain, 16, KEEP_MAX_FLOATS + 1)
    assert keeps_q(plain, 1, KEEP_MAX_FLOATS + 1)
    # aggregates wider than KEEP_MAX_AGGREGATE: Q from h and tau instead (measured faster at 176)
    assert not keeps_q(_uniform(176, 176, 16, aggregate=256), 11, 1)
    assert keeps_q(_uniform(128, 176, 16, aggregate=256), 11, 1)
    assert keeps_q(_uniform(256, 256, 16, aggregate=128), 16, 1)
    # precision="fp32": no keep plan whose Q products would be tf32x3 (aggregates of 64 or more)
    assert not keeps_q(agg, 16, 1, exact=True) and keeps_q(_uniform(256, 256, 16, aggregate=32), 16, 1, exact=True)
    assert keeps_q(plain, 16, 1, exact=True)


def test_q_from_the_kept_panels_of_a_scaled_schedule():
    """A keep plan under Schedule.scaled: the kept V^T and (VT)^T do not depend on the scale, so Q of a 2^40 is Q
    of a, bit for bit, and R is scaled back before drive_q runs."""
    schedule = _uniform(128, 96, 16, precision=Precision("fp32", "fp32", "fp16"))
    assert schedule.scaled
    a = stress("random", 128, 96, 2, seed=4)
    q, h, log = numpy_engine.qr(a, schedule)
    qb, hb, _ = numpy_engine.qr(np.ldexp(a, 40), schedule)
    upper = np.triu(np.ones((128, 96), dtype=bool))
    assert np.array_equal(q, qb) and np.array_equal(hb[:, ~upper], h[:, ~upper])
    assert np.array_equal(hb[:, upper], np.ldexp(h[:, upper], 40))
    assert log.index(("scale", 2)) < [i for i, e in enumerate(log) if e[:2] == ("gemm", "qproject")][0]


def test_keep_plan_kernels(monkeypatch):
    """A keep plan compiles the last panels with their trailing outputs (and no fused Q kernel); with aggregates,
    the T kernel too, even where only the last aggregate is merged."""
    schedule = _uniform(176, 176, 32, variant="lanes")
    plain, keep_plan = plan(schedule), plan(schedule, keep=True)
    launches, kept_kernels, kept = plain.launches, keep_plan.kernels, keep_plan.launches
    assert keep_plan.keep and not plain.keep
    assert not launches[-1].trail and all(L.trail for L in kept)
    assert kept[-1].kernel.endswith("_trail") and not any(k.formq for k in kept_kernels)
    # what a keep Factorizer compiles is what its plan launches (the kernels' names are the binaries' names)
    from qrgen.render.sources import render_all
    from qrgen.run.factorizer import Factorizer

    fac = Factorizer(176, 176, schedule, Target(), keep=True)
    assert [r.name for r in render_all(schedule, Target(), keep=True)] == [k.name for k in fac.kernels]
    monkeypatch.setattr("qrgen.run.factorizer.compile_many", lambda items, *args, **kw: [name for name, _ in items])
    assert fac.build() == [k.name for k in fac.kernels]
    assert {L.kernel for L in kept} <= {k.name for k in fac.kernels}
    one = _uniform(32, 32, 32, variant="lanes")
    assert any(k.formq for k in plan(one).kernels) and not any(k.formq for k in plan(one, keep=True).kernels)
    one_agg = _uniform(200, 200, 16, aggregate=256)  # a single aggregate: nothing after it to update
    assert not any(k.name == "qr_tmat" for k in plan(one_agg).kernels)
    assert sum(k.name == "qr_tmat" for k in plan(one_agg, keep=True).kernels) == 1


def test_q_products_of_wide_kept_blocks_in_tf32x3(monkeypatch):
    """drive_q's two products per kept block take tf32x3.q_precision's precision: tf32x3 for aggregates of 64
    columns or more (their keep plans compile the tf32x3 project and update kernels whatever the schedule's own
    precisions), fp32 through cuBLAS for 32-wide panels and aggregates; the emulated Q keeps fp32's accuracy."""
    from gates import q_gates
    from qrgen.run.factorizer import Factorizer

    q_precision = tf32x3.q_precision
    assert q_precision(32) == q_precision(48) == "fp32" and q_precision(64) == q_precision(128) == "tf32x3"

    def q_precisions(log):
        return {e[2] for e in log if e[0] == "gemm" and e[1] in ("qproject", "qupdate")}

    def tf32x3_kinds(schedule, keep):
        return [k.kind for k in plan(schedule, keep=keep).kernels if k.variant == "tf32x3"]

    wide = _uniform(256, 256, 32, aggregate=128)  # fp32 products: of its own only the gram kernel (G in parts)
    a = stress("rowscaled", 256, 256, 2, seed=8)
    q, h, log = numpy_engine.qr(a, wide)
    assert q_precisions(log) == {"tf32x3"}
    assert tf32x3_kinds(wide, False) == ["gram"] and tf32x3_kinds(wide, True) == ["project", "project64", "update", "gram"]
    # the update's own tf32x3 kernels (update, merge for (VT)^T, gram): the keep plan adds the projection's, for
    # blocks of 64 rows the 64-row tiles' (tf32x3.project_kind)
    update3 = _uniform(256, 256, 32, aggregate=64, precision=Precision("fp32", "fp32", "tf32x3"))
    assert tf32x3_kinds(update3, False) == ["update", "merge", "gram"]
    assert tf32x3_kinds(update3, True) == ["project64", "update", "merge", "gram"]
    for narrow in (_uniform(176, 176, 32, variant="lanes"), _uniform(96, 160, 32, aggregate=32)):
        _, _, narrow_log = numpy_engine.qr(stress("random", narrow.m, narrow.n, 1, seed=1), narrow)
        assert q_precisions(narrow_log) == {"fp32"} and tf32x3_kinds(narrow, True) == []
    # what a keep Factorizer compiles: the tf32x3 kernels too
    monkeypatch.setattr("qrgen.run.factorizer.compile_many", lambda items, *args, **kw: [name for name, _ in items])
    assert {"qr_tf32x3_project", "qr_tf32x3_update"} <= set(Factorizer(256, 256, wide, Target(), keep=True).build())
    r = np.triu(h[:, :256])
    factor, orth = q_gates(a, q, r)
    monkeypatch.setattr(tf32x3, "q_precision", lambda width: "fp32")
    q32, h32, log32 = numpy_engine.qr(a, wide)
    assert q_precisions(log32) == {"fp32"} and np.array_equal(h, h32)
    factor32, orth32 = q_gates(a, q32, r)
    assert (factor <= 20).all() and (orth <= 100).all()
    assert np.abs(orth - orth32).max() <= 0.1 and np.abs(factor - factor32).max() <= 0.1


FP16 = _uniform(256, 256, 16, aggregate=64, precision=Precision("fp16", "fp32", "fp16"), panel_update="rowsplit")


def test_fp16_products_factor_every_scale_alike():
    """A schedule with fp16 product inputs scales each matrix by a power of two first (Schedule.scaled): matrices
    of any scale then give the unit-scale factorization's bits (R times the scale), where fp16 alone overflows
    (1e5: W past 65504) or flushes to zero (1e-6); the launch sequence and the reference agree."""
    assert FP16.scaled and not _uniform(256, 256, 16, aggregate=64).scaled
    a = stress("random", 256, 256, 2, seed=3)
    h1, t1, log = numpy_engine.geqrf(a, FP16)
    assert [e for e in log if e[0] == "scale"] == [("scale", 0), ("scale", 2)]
    assert check(a, h1, t1, device="cpu").ok
    upper = np.triu(np.ones((256, 256), dtype=bool))
    for p in (20, -20, 100, -100):
        big = np.ldexp(a, p)
        h, t, _ = numpy_engine.geqrf(big, FP16)
        assert np.array_equal(t, t1) and np.array_equal(h[:, ~upper], h1[:, ~upper])
        assert np.array_equal(h[:, upper], np.ldexp(h1[:, upper], p))
        hr, tr = reference.geqrf(big, FP16, dtype=np.float32)
        assert np.array_equal(hr, h) and np.array_equal(tr, t)
    # without the scale: the same products in fp16 on a matrix at 1e5 overflow, at 1e-6 lose the update
    unscaled = NumpyEngine.scale
    try:
        NumpyEngine.scale = lambda self, phase: None
        for factor in (1e5, 1e-6):
            with np.errstate(all="ignore"):
                h, t, _ = numpy_engine.geqrf((a * factor).astype(np.float32), FP16)
            assert not check(a * factor, h, t, device="cpu").ok
    finally:
        NumpyEngine.scale = unscaled
    for factor in (1e5, 1e-6):
        h, t, _ = numpy_engine.geqrf((a * factor).astype(np.float32), FP16)
        assert check(a * factor, h, t, device="cpu").ok


def test_scale_exponents():
    """2^e just above each matrix's largest magnitude, NaN passed over; 0 for zero, inf or all-NaN matrices;
    subnormal maxima clamped so that 2^-e stays a normal float."""
    h = np.zeros((6, 2, 2), dtype=np.float32)
    h[0] = [[1.0, 3.0], [0.25, -7.9]]
    h[2] = [[np.nan, 2.0], [1.0, 1.0]]
    h[3] = [[np.inf, 1.0], [1.0, 1.0]]
    h[4, 0, 0] = 1e-40
    h[5] = np.nan
    assert reference.scale_exponents(h).tolist() == [3, 0, 2, 0, -125, 0]


def test_gram_splits_only_for_few_matrices_with_an_fp32_gram():
    """run.buffers.gram_parts: an aggregate's G is split over the rows of V where the gram kernel takes it (an fp32 Gram
    precision, aggregates of 64 columns or more) and the chunk's upper 64 x 64 tiles fill fewer than two blocks per
    SM of 132, each part at least GRAM_PART_ROWS rows of V; the committed reference files: 8 x 2048² in 8 parts (its
    rows), the others in one; one tall matrix's aggregates of 64 in 264 (two blocks an SM)."""
    from qrgen.plan.tf32x3 import PART_ROWS as GRAM_PART_ROWS
    from qrgen.run.buffers import gram_parts
    from qrgen.run.factorizer import Factorizer
    from qrgen.schedule.files import find

    def splits(m, n, batch, chunk=None):
        schedule, _ = find(Problem(m, n, batch), Target("cuda", "sm_90"))
        return gram_parts(Factorizer(m, n, schedule, Target("cuda", "sm_90")), chunk or batch, 132)

    assert splits(2048, 2048, 8) == 2048 // GRAM_PART_ROWS == 8  # (two blocks an SM would take 11)
    assert splits(300000, 512, 1) == 2 * 132
    assert splits(2048, 2048, 8, chunk=40) == 2 and splits(2048, 2048, 8, chunk=100) == 1
    assert splits(1024, 1024, 60) == 1 and splits(512, 512, 640) == 1
    assert splits(4096, 4096, 2) == 1  # an fp16 Gram matrix stays with cuBLAS
    fp16 = _uniform(256, 256, 32, aggregate=128, precision=Precision("fp16", "fp32", "fp32"))
    assert "gram" not in tf32x3.kinds(fp16) and "gram" in tf32x3.kinds(_uniform(256, 256, 32, aggregate=128))
    assert "gram" not in tf32x3.kinds(_uniform(96, 160, 32, aggregate=32))  # G narrower than the kernels take
    # panels that form their aggregate's G themselves (t_out): no gram kernel in the plan, so no parts for one matrix
    # of 512 rows, where the same aggregates of lanes panels, merged by launches, split G in two
    prec = Precision("fp32", "tf32x3", "tf32x3")
    own = Schedule(512, 512, (Panel(64, "cols", 256, 1, 8),) * 8, prec, aggregate=64)
    fac = Factorizer(512, 512, own, Target("cuda", "sm_90"))
    assert "gram" in tf32x3.kinds(own) and all(L.t_out for L in fac.launches[:-1])
    assert gram_parts(fac, 1, 132) == 1
    lanes = _uniform(512, 512, 32, aggregate=64, precision=prec, variant="lanes")
    assert gram_parts(Factorizer(512, 512, lanes, Target("cuda", "sm_90")), 1, 132) == 2
