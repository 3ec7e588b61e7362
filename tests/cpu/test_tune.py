"""CPU layer: the schedule search (qrgen.tune) over the cost model, its storage, failures and accuracy
constraint, and the schedule files it writes."""
import json

import optuna
import pytest

from qrgen.plan.tsqr import tsqr_levels
from qrgen.problem import Problem
from qrgen.schedule.files import load, read, tuner_params
from qrgen.schedule.heuristic import default_schedule
from qrgen.schedule.model import Panel
from qrgen.targets import Target
from qrgen.tune.costmodel import estimate
from qrgen.tune.evaluate import ModelEvaluator, Outcome, TrialFailed
from qrgen.tune.search import provenance, tune, tune_and_save
from qrgen.tune.space import DEFAULT_PARAMS, default_params, sample, schedule_from_params, variations
from qrgen.tune.study import MIN_GAIN, RUNOFF_ROUNDS, feasible, study_name


def _storage(tmp_path):
    return f"sqlite:///{tmp_path / 'study.sqlite3'}"


@pytest.mark.parametrize("m,n", [(32, 32), (100, 60), (60, 100), (1024, 1024), (4096, 4096), (2048, 2048), (8192, 512),
                                 (100000, 32), (40000, 256), (33000, 100)])
@pytest.mark.parametrize("batch", [1, 3, 8, 640])
def test_default_params_give_the_default_schedule(m, n, batch):
    problem = Problem(m, n, batch)
    assert schedule_from_params(problem, default_params(problem)) == default_schedule(problem)


@pytest.mark.parametrize("m,n,batch,one", [(48, 48, 4000, "lanes"), (64, 32, 2000, "whole"), (64, 64, 1000, "lanes"),
                                           (64, 64, 999, "lanes"), (33, 33, 5000, "lanes"), (64, 40, 3, "lanes"),
                                           (128, 128, 500, "lanes"), (100, 70, 133, "lanes")])
def test_default_params_give_the_default_one_kernel_schedule(m, n, batch, one):
    """Small matrices take one kernel a matrix by default: a wide lanes panel for 32 < n <= m <= 64, and for n <= m
    <= 128 past 132 matrices (schedule.heuristic.default_wide_lanes), a whole kernel for many of n = 32
    (default_whole); the tuner's first
    trial is the same point, and the default without it is among its early variations."""
    problem = Problem(m, n, batch)
    params = default_params(problem)
    schedule = default_schedule(problem)
    assert schedule_from_params(problem, params) == schedule
    (panel,) = schedule.panels
    assert (panel.variant, panel.width) == (one, n)
    assert default_params(problem, clustered=False) in variations(problem)


@pytest.mark.parametrize("m,n,batch", [(176, 176, 40), (128, 128, 1), (192, 160, 132), (176, 176, 133), (127, 127, 40),
                                       (256, 256, 40), (160, 176, 40), (176, 176, 66), (176, 176, 67)])
def test_default_params_give_the_default_cols_schedule(m, n, batch):
    """Few matrices (at most one block each per SM) of 128 to 192 columns, n <= m, take one cols panel over all
    columns by default (schedule.heuristic.default_cols, where it fits one block): on a cluster of two blocks (4
    columns a warp) for at most one matrix per pair of SMs, else on one block (8 columns a warp); the tuner's first
    trial is the same point and the default without it among its early variations."""
    from qrgen.schedule.heuristic import COLS_CLUSTER_MAX_BATCH, COLS_FROM, COLS_MAX_BATCH

    problem = Problem(m, n, batch)
    schedule = default_schedule(problem)
    assert schedule_from_params(problem, default_params(problem)) == schedule
    cols = schedule.panels[0].variant == "cols" and not schedule.aggregate
    assert cols == (batch <= COLS_MAX_BATCH and COLS_FROM <= n <= m and m <= 192)
    if cols:
        expected = (Panel(n, "cols", 32 * -(-n // 8), 2, 4, cluster=True) if batch <= COLS_CLUSTER_MAX_BATCH
                    else Panel(n, "cols", 32 * -(-n // 8), slice=8))
        assert schedule.panels == (expected,)
        assert default_params(problem, clustered=False) in variations(problem)


@pytest.mark.parametrize("m,n,batch,width,blocks", [
    (256, 256, 40, 128, 2), (300, 300, 7, 128, 2), (352, 352, 40, 128, 2), (512, 512, 16, 64, 2), (512, 256, 64, 64, 2),
    (256, 256, 100, 128, 1), (448, 448, 100, 64, 1), (512, 512, 132, 64, 1), (384, 384, 1, 128, 2), (512, 512, 2, 64, 2),
    (512, 512, 1, 0, 0), (512, 512, 133, 64, 1), (512, 512, 640, 64, 1), (384, 384, 300, 64, 1),
    (256, 256, 133, 0, 0), (192, 192, 500, 0, 0), (128, 128, 500, 0, 0), (513, 513, 8, 0, 0), (300, 400, 8, 128, 2),
    (256, 1024, 16, 128, 2), (128, 512, 100, 128, 1), (511, 1000, 2, 64, 2), (512, 1024, 32, 64, 2),
    (513, 1024, 8, 0, 0), (127, 1000, 3, 0, 0), (176, 176, 40, 0, 0)])
def test_default_cols_panels_each_their_own_aggregate(m, n, batch, width, blocks):
    """Matrices of COLS_FROM <= k, m <= COLS_AGGREGATE_MAX_ROWS whose columns one cols panel cannot hold: cols
    panels over the k columns (a wide matrix's others take the aggregates' updates) of the widest of
    COLS_AGGREGATE_WIDTHS that fits (on clusters of two blocks with 4 columns a warp up to COLS_CLUSTER_MAX_BATCH
    matrices, else one block with 8), each its own aggregate, the aggregates' products in tf32x3; past
    COLS_MAX_BATCH matrices only where that width is not the widest. Not for one matrix on the widest clusters
    (from CLUSTER_FROM rows), fewer than COLS_FROM rows or columns, more rows, or where one panel fits. The tuner's
    first trial is the same point; its early variations hold the default without it and the other widths."""
    from qrgen.schedule.heuristic import COLS_AGGREGATE_WIDTHS

    problem = Problem(m, n, batch)
    schedule = default_schedule(problem)
    assert schedule_from_params(problem, default_params(problem)) == schedule
    if not width:
        assert not (schedule.aggregate and schedule.panels[0].variant == "cols")
        return
    assert schedule.aggregate == width and (schedule.precision.project, schedule.precision.update) == ("tf32x3",) * 2
    k = problem.k
    assert [p.width for p in schedule.panels] == [min(width, k - c) for c in range(0, k, width)]
    assert all(p.variant == "cols" and p.blocks == blocks and p.cluster == (blocks == 2) for p in schedule.panels)
    assert schedule.panels[0].slice == (4 if blocks == 2 else 8)
    found = variations(problem)
    assert default_params(problem, clustered=False) in found
    others = [a for a in COLS_AGGREGATE_WIDTHS if a != width and a < k]
    assert [v["aggregate"] for v in found if v.get("family") == "cols" and v["aggregate"] != width] == others
    assert all(v["cols_head"] == v["aggregate"] for v in found if v.get("family") == "cols")


def test_whole_family_is_sampled_and_rejected_where_it_does_not_fit():
    problem = Problem(64, 64, 100)
    study = optuna.create_study()
    study.enqueue_trial({"family": "whole", "whole_threads": 64, "whole_slice": 8, "loop": True})
    params = sample(study.ask(), problem)
    schedule = schedule_from_params(problem, params)
    assert schedule.panels == (Panel(64, "whole", 64, slice=8, loop=True),)
    with pytest.raises(ValueError, match="shared memory"):
        schedule_from_params(Problem(512, 512, 1), params)


def test_two_phases_and_cols_family():
    problem = Problem(200, 200, 2)
    s = schedule_from_params(problem, {**DEFAULT_PARAMS, "head_share": 0.5, "rows_head": 32, "rows_tail": 16})
    assert [p.width for p in s.panels] == [32, 32, 32, 32, 16, 16, 16, 16, 8]
    c = schedule_from_params(problem, {**DEFAULT_PARAMS, "family": "cols", "cols_head": 64, "slice": 4})
    assert {p.variant for p in c.panels} == {"cols"} and c.panels[0].threads == 512


@pytest.mark.parametrize("m,n,batch", [(256, 1024, 16), (300, 300, 7), (3000, 3000, 3), (128, 128, 500)])
def test_every_sampled_point_gives_a_schedule_or_a_refusal(m, n, batch):
    """Any point the sampler may ask for is a schedule or a ValueError (the trial recorded as rejected), never a
    crash: a cols tail never takes "tall" (the head's choice that fits every panel), and an old point with one is
    refused."""
    problem = Problem(m, n, batch)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(300):
        params = sample(study.ask(), problem)
        assert params.get("cols_tail") != "tall"
        try:
            schedule_from_params(problem, params)
        except ValueError:
            pass
    tail = {**default_params(problem, clustered=False), "family": "cols", "head_share": 0.5, "cols_head": 64,
            "cols_tail": "tall", "slice": 4, "cols_cluster": 0}
    with pytest.raises(ValueError, match="tall"):
        schedule_from_params(problem, tail)


def test_cost_model_prefers_fewer_launches_and_lower_precision():
    problem = Problem(1024, 1024, 200)
    base = estimate(default_schedule(problem), problem)
    tf32 = estimate(schedule_from_params(problem, {**default_params(problem), "project": "tf32", "update": "tf32"}),
                    problem)
    assert tf32.gemm_us < base.gemm_us and tf32.panel_us == base.panel_us
    assert base.total_us >= base.host_us > 0


@pytest.mark.parametrize("batch,m,n", [(640, 512, 512), (300, 384, 384)])
def test_cost_model_charges_panels_that_form_t_and_not_their_merges_as_measured(batch, m, n, monkeypatch):
    """A cols panel that forms its aggregate's G and T (Launch.t_out) takes longer, its merge launches neither the
    gram nor the T kernel, and the whole call was faster that way (docs/decisions.md#cols-t-out)."""
    from qrgen.plan import cols

    problem = Problem(m, n, batch)
    schedule = default_schedule(problem)
    with_t = estimate(schedule, problem)
    monkeypatch.setattr(cols, "t_out", lambda *a: False)
    without = estimate(schedule, problem)
    assert with_t.panel_us > without.panel_us and with_t.gemm_us < without.gemm_us
    assert with_t.total_us < without.total_us and with_t.host_us < without.host_us


def test_search_runs_resumes_and_writes_provenance(tmp_path):
    problem, target = Problem(48, 40, 3), Target()
    lines = []
    result, path = tune_and_save(problem, target, 6, _storage(tmp_path), schedule_root=tmp_path,
                                 evaluator=ModelEvaluator(problem), log=lines.append)
    assert path == tmp_path / "sm_90" / "48x40_b3.json"
    data = json.loads(path.read_text())
    assert data["format"] == 2 and read(path) == data  # written in the current format (no upgrade on read)
    schedule, prov = load(path)
    assert schedule == result.schedule
    assert prov["device"] == "cost model (no GPU)" and "params" not in prov
    tuner = prov["tuner"]  # format 2: the tuner's point and its study apart, not stale until the file is amended
    assert tuner["trials_complete"] == result.complete >= 1 and tuner["stale"] is False
    assert tuner["params"] == result.params == tuner_params(prov) and tuner["factor"] <= 10
    assert any(line.startswith("[6/6]") for line in lines)
    # the default schedule is the first trial: its time is reported beside the best, from the same study
    assert result.default is not None and result.default.time_us >= result.outcome.time_us
    assert tuner["default_time_us"] == round(result.default.time_us, 2)
    assert any(line.startswith("default schedule:") for line in lines)
    again = tune(problem, target, 4, ModelEvaluator(problem), _storage(tmp_path), log=lambda _: None)
    study = optuna.load_study(study_name=again.study_name, storage=_storage(tmp_path))
    ran = [t for t in study.trials if t.state != optuna.trial.TrialState.WAITING]  # warm starts may still wait
    assert len(ran) == 10  # the second run resumed the same study


def test_inaccurate_precision_is_never_best(tmp_path):
    """bf16 everywhere (the panels' products too: through cuBLAS, not the fp32 fused kernel) fails the stress
    families: queued first, it is recorded with its time, its reason and an unmet constraint (so the sampler learns
    from it), counted as failed and never returned."""
    problem = Problem(96, 96, 4)
    evaluator = ModelEvaluator(problem)
    bf16 = {**default_params(problem), "gram": "bf16", "project": "bf16", "update": "bf16", "panel_update": "cublas"}
    fast = evaluator(schedule_from_params(problem, bf16), bf16)
    assert not fast.accurate
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = _storage(tmp_path)
    name = study_name(problem, Target(), evaluator.name)
    optuna.create_study(study_name=name, storage=storage).enqueue_trial(bf16)
    result = tune(problem, Target(), 8, evaluator, storage, log=lambda _: None)
    assert result.params != bf16 and result.outcome.accurate and result.failed >= 1
    study = optuna.load_study(study_name=name, storage=storage)
    (first,) = [t for t in study.trials if t.params == bf16]
    assert first.state == optuna.trial.TrialState.COMPLETE and first.values[0] == first.user_attrs["time_us"]
    assert first.user_attrs["failure"].startswith("inaccurate") and max(first.user_attrs["constraint"]) > 0
    assert first not in feasible(study) and all(max(t.user_attrs["constraint"]) <= 0 for t in feasible(study))


def test_sampler_learns_where_the_gates_fail(tmp_path):
    """A stand-in evaluator whose fp16 and bf16 products are fast but miss the gates: with the misses kept as
    infeasible trials, the sampler asks for them far less often after its warm-up than at random (three trials in
    four would miss: fp16 or bf16 in either product; optuna 5.0, seed 0: 9 of the last 30, and 28 when the misses
    count as fast feasible trials)."""
    problem = Problem(64, 64, 2)
    low = {"fp16", "bf16"}

    def evaluator(schedule, params):
        bad = params["update"] in low or params["project"] in low
        return Outcome(50.0 if bad else 100.0 + (params["update"] != "fp32"), 30.0 if bad else 0.1, 0.1)

    result = tune(problem, Target(), 60, evaluator, _storage(tmp_path), log=lambda _: None)
    study = optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path))
    late = [t for t in study.trials[-30:] if t.state == optuna.trial.TrialState.COMPLETE]
    misses = sum(t.params.get("update") in low or t.params.get("project") in low for t in late)  # whole: fp32
    assert result.outcome.factor < 1 and len(late) >= 20 and misses <= len(late) // 2, (misses, len(late))


def test_nan_accuracy_is_an_unmet_constraint(tmp_path):
    """A schedule whose result is NaN on some family (factor NaN) is infeasible, not a crash: optuna refuses NaN
    constraint values, so the excess is recorded as infinite."""
    problem = Problem(64, 64, 2)
    calls = []

    def evaluator(schedule, params):
        calls.append(1)
        return Outcome(40.0 if len(calls) == 1 else 100.0 + len(calls), float("nan") if len(calls) == 1 else 0.1, 0.1)

    result = tune(problem, Target(), 4, evaluator, _storage(tmp_path), log=lambda _: None)
    study = optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path))
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.COMPLETE and first.user_attrs["constraint"][0] == float("inf")
    assert first not in feasible(study) and result.outcome.time_us > 40.0 and result.failed >= 1


def test_rejected_and_crashing_trials_are_recorded(tmp_path):
    problem = Problem(64, 64, 2)
    calls = []

    def evaluator(schedule, params):
        calls.append(params)
        if len(calls) == 2:
            raise TrialFailed("launch failure: simulated")
        return Outcome(100.0 + len(calls), 0.1, 0.1)

    result = tune(problem, Target(), 5, evaluator, _storage(tmp_path), log=lambda _: None)
    study = optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path))
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) >= 1 and result.failed >= 1
    assert result.outcome.time_us in [t for _, t in result.final_round]  # chosen on the final round's medians


def test_ctrl_c_leaves_the_study_saved(tmp_path):
    problem = Problem(64, 64, 2)
    calls = []

    def evaluator(schedule, params):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return Outcome(50.0 + len(calls), 0.1, 0.1)

    lines = []
    result = tune(problem, Target(), 10, evaluator, _storage(tmp_path), log=lines.append)
    assert result.complete == 2 and any("interrupted" in line for line in lines)
    assert len(optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path)).trials) >= 2


def test_multi_objective_front(tmp_path):
    problem = Problem(64, 64, 2)
    result = tune(problem, Target(), 6, ModelEvaluator(problem), _storage(tmp_path), multi_objective=True,
                  log=lambda _: None)
    assert result.pareto and all(outcome.accurate for _, outcome in result.pareto)


@pytest.mark.parametrize("batch,m,n,lanes_faster", [(40, 176, 176, True), (40, 352, 352, True),
                                                    (640, 512, 512, False)])
def test_cost_model_ranks_lanes_and_rows_as_measured(batch, m, n, lanes_faster):
    """The orderings the H200 showed in graph replays (BENCHMARKS.md, second session; at 20 x 32², where lanes
    were faster too, both families now give the same one-warp lanes panel: test_one_warp_panels_in_every_family)."""
    problem = Problem(m, n, batch)
    lanes = estimate(schedule_from_params(problem, {**DEFAULT_PARAMS, "family": "lanes", "lanes_head": 32,
                                                    "lane_slots": "auto"}), problem)
    rows = estimate(schedule_from_params(problem, DEFAULT_PARAMS), problem)
    gpu_time = lambda e: e.panel_us + e.gemm_us  # noqa: E731  (graph replays leave the host's cost out)
    assert (gpu_time(lanes) < gpu_time(rows)) == lanes_faster


@pytest.mark.parametrize("batch", [20, 20000])
def test_one_warp_panels_in_every_family(batch):
    """Panels of at most 32 rows are lanes panels on one warp in the rows family too, at any batch (measured on
    the H200, BENCHMARKS.md eighteenth session: 20,000 x 32² 388 -> 130 µs against warp panels)."""
    problem = Problem(32, 32, batch)
    lanes = schedule_from_params(problem, {**DEFAULT_PARAMS, "family": "lanes", "lanes_head": 32, "lane_slots": "auto"})
    rows = schedule_from_params(problem, DEFAULT_PARAMS)
    assert lanes.panels == rows.panels == (Panel(32, "lanes", 32),)
    assert default_schedule(problem).panels == rows.panels


def test_next_trial_is_prepared_while_this_one_is_measured(tmp_path):
    """An evaluator with prepare() (the GPU one compiles there) is handed the next trial's schedule before the
    current one is measured; an interruption leaves no trial running in the study."""
    problem = Problem(64, 64, 2)
    events = []

    class Evaluator:
        def prepare(self, schedules):
            events.extend(("prepare", s) for s in schedules)

        def __call__(self, schedule, params):
            events.append(("measure", schedule))
            if sum(e[0] == "measure" for e in events) == 4:
                events.append(("interrupt", None))
                raise KeyboardInterrupt
            return Outcome(10.0, 0.1, 0.1)

    lines = []
    result = tune(problem, Target(), 8, Evaluator(), _storage(tmp_path), log=lines.append)
    assert result.interrupted
    events = events[:events.index(("interrupt", None))]  # the final round follows
    measured = [s for kind, s in events if kind == "measure"]
    prepared = [s for kind, s in events if kind == "prepare"]
    assert len(measured) == 4 and all(s in prepared for s in measured[1:])  # every later one was prepared first
    assert all(events.index(("prepare", s)) < events.index(("measure", s)) for s in measured[1:])
    study = optuna.load_study(study_name=optuna.get_all_study_names(_storage(tmp_path))[0], storage=_storage(tmp_path))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert any("interrupted" in line for line in lines)


@pytest.mark.parametrize("batch,m,n,split_faster", [(2, 4096, 4096, True), (8, 2048, 2048, True),
                                                    (60, 1024, 1024, False)])
def test_cost_model_ranks_rowsplit_and_cublas_panel_products_as_measured(batch, m, n, split_faster):
    """skinny_bench (tools/) on the H200: the rowsplit kernels 5.9x faster than cuBLAS for 2 x 4096 rows, 2.4x for
    8 x 2048, 0.5x for 60 x 1024, measured at the narrow (8 and 16 wide) panels of the heuristic's one-block
    schedules, not its clusters' 32-wide ones."""
    problem = Problem(m, n, batch)
    params = {**default_params(problem, clustered=False), "aggregate": 128}
    split = estimate(schedule_from_params(problem, {**params, "panel_update": "rowsplit"}), problem)
    cublas = estimate(schedule_from_params(problem, {**params, "panel_update": "cublas"}), problem)
    assert (split.gemm_us < cublas.gemm_us) == split_faster, (split, cublas)


def test_time_limit_stops_starting_trials(tmp_path):
    problem = Problem(40, 40, 2)
    lines = []
    result = tune(problem, Target(), 20, ModelEvaluator(problem), _storage(tmp_path), log=lines.append, time_limit=0)
    assert result.complete + result.failed == 1  # the first trial always runs
    assert any("time limit" in line for line in lines)


def test_aggregates_other_precision_and_clusters_are_early_trials(tmp_path):
    """From 2048 columns with aggregates the default has tf32 aggregate products (panels' own fp32: fused) and the
    second trial is the same schedule in fp32; for up to 16 matrices, clusters follow (not for 60)."""
    problem = Problem(2048, 2048, 8)
    default = default_params(problem)
    assert default["project"] == default["update"] == "tf32" and default["panel_update"] == "fused"
    result = tune(problem, Target(), 2, ModelEvaluator(problem), _storage(tmp_path), log=lambda _: None)
    study = optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path))
    second = study.trials[1].params
    assert second["project"] == second["update"] == "fp32" and second["panel_update"] == "fused"
    assert {k: v for k, v in second.items() if k not in ("project", "update")} == {
        k: v for k, v in default.items() if k not in ("project", "update")}

    problem = Problem(4096, 4096, 2)
    result = tune(problem, Target(), 4, ModelEvaluator(problem), _storage(tmp_path), log=lambda _: None)
    study = optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path))
    assert [t.params.get("cluster", 0) for t in study.trials[:4]] == [0, 0, 8, 4]
    for batch, clusters in ((8, [8, 4, 8, 8]), (60, [])):
        assert [v["cluster"] for v in variations(Problem(2048, 2048, batch)) if "cluster" in v] == clusters
    # fewer rows per thread on clusters of 8: more threads per block
    found = {v.get("cluster_slots"): schedule_from_params(problem, v).panels[0] for v in variations(problem)
             if v.get("cluster") == 8}
    assert [(found[s].threads, found[s].blocks, found[s].cluster) for s in (4, 2, 1)] == [
        (128, 8, True), (256, 8, True), (512, 8, True)]


def test_column_loop_is_an_early_trial():
    """Where the default has warp or rows panels (the lanes family has them where lanes do not fit), the same point
    with the other column loop is tried early; schedules without such panels have no such trial."""
    for problem in (Problem(520, 1024, 100), Problem(8192, 512, 1), Problem(4096, 4096, 9), Problem(1024, 1024, 200)):
        default = default_params(problem)
        assert {**default, "loop": not default["loop"]} in variations(problem)
        assert schedule_from_params(problem, {**default, "loop": True}).panels != default_schedule(problem).panels \
            or default["loop"]
    problem = Problem(176, 176, 40)
    assert not any(v.get("loop") for v in variations(problem))


def test_neighbouring_aggregate_sizes_are_early_trials():
    """The default with aggregates of half and twice its size (half only where that is at least 64), or of 64 and
    128 where it has none (640 x 512²'s better schedule, found by hand in the eleventh session), each with
    lookahead 2; cols panels each their own aggregate at the other width, with their own lookahead."""
    aggregates = {problem: [(v["aggregate"], v.get("lookahead")) for v in variations(problem)
                            if v["aggregate"] != default_params(problem)["aggregate"]]
                  for problem in (Problem(512, 512, 40), Problem(512, 1024, 100), Problem(512, 512, 640),
                                  Problem(1024, 1024, 200), Problem(176, 176, 40), Problem(1024, 1024, 60))}
    assert default_params(Problem(512, 512, 40))["aggregate"] == 64  # cols panels (default_cols_aggregates)
    assert aggregates[Problem(512, 512, 40)] == [(0, None), (128, 0)]  # the default without cols panels too
    assert default_params(Problem(512, 1024, 100))["aggregate"] == 64  # cols panels over a wide matrix's k columns
    assert aggregates[Problem(512, 1024, 100)] == [(128, 0)]  # (the default without them: default_many's, also 64)
    assert aggregates[Problem(512, 512, 640)] == [(128, 0)]  # cols panels past one wave: the other width
    assert default_params(Problem(1024, 1024, 200))["aggregate"] == 128
    assert aggregates[Problem(1024, 1024, 200)] == [(64, 2), (256, 2)]
    # tall cols panels, each the widest its rows fit and its own aggregate: the default without cols panels, then
    # the uniform widths, each its own aggregate
    assert default_params(Problem(1024, 1024, 60))["cols_head"] == "tall"
    assert aggregates[Problem(1024, 1024, 60)] == [(128, 2), (128, None), (64, None)]
    assert aggregates[Problem(176, 176, 40)] == []  # too few columns for aggregates


@pytest.mark.parametrize("m,n", [(100000, 32), (40000, 256)])
def test_cost_model_ranks_tsqr_as_measured(m, n):
    """Without a GPU the tuner's objective: tsqr panels below the multi-block rows panels at the shapes where the
    H200 measured them faster (BENCHMARKS.md, thirteenth session), and a tsqr panel costs each level's columns."""
    from qrgen.tune.costmodel import TSQR_US_PER_COLUMN

    problem = Problem(m, n, 1)
    tsqr = {**DEFAULT_PARAMS, "family": "tsqr", "tsqr_head": 16, "tsqr_threads": 256, "tsqr_tile": 512,
            "loop": True}
    rows = estimate(schedule_from_params(problem, DEFAULT_PARAMS), problem)
    fast = estimate(schedule_from_params(problem, tsqr), problem)
    assert fast.total_us < rows.total_us
    levels = len(tsqr_levels(m, 16, 512))
    assert fast.panel_us >= min(m, n) * levels * TSQR_US_PER_COLUMN


def test_single_tall_matrices_default_to_clusters():
    """One matrix of CLUSTER_FROM rows or more: panels on clusters of 16 blocks where they fit, no aggregates; from
    TSQR_SINGLE_FROM rows (past a cluster's registers) and TSQR_ASPECT rows a column, tsqr panels where a panel has
    two tiles of rows; several matrices (any number) from TSQR_FROM rows, multi-block panels before."""
    from qrgen.schedule.heuristic import CLUSTER_FROM, TSQR_ASPECT, TSQR_FROM, TSQR_PANEL, TSQR_SINGLE_FROM
    from qrgen.tune.space import MAX_CLUSTER

    schedule = default_schedule(Problem(8192, 512, 1))
    assert Target().limits.cluster_max == MAX_CLUSTER == 16  # sm_90's most blocks per cluster
    assert all(p.cluster and p.blocks == 16 for p in schedule.panels) and schedule.aggregate == 0
    schedule = default_schedule(Problem(TSQR_SINGLE_FROM - 1, 32, 1))  # the tallest a cluster's panel holds
    assert schedule.panels[0].cluster and schedule.panels[0].variant == "rows"
    schedule = default_schedule(Problem(TSQR_SINGLE_FROM, 32, 1))
    assert {p.variant for p in schedule.panels} == {"tsqr"}
    schedule = default_schedule(Problem(TSQR_FROM - 1, 32, 2))  # (a cluster's registers hold the later panels)
    assert not schedule.panels[0].cluster and schedule.panels[0].blocks > 1
    assert not any(p.cluster for p in default_schedule(Problem(8192, 512, 8)).panels)  # 8 x 16 blocks: too many
    for batch in (1, 64, 256, 5000):
        schedule = default_schedule(Problem(100000, 32, batch))
        assert [(p.variant, p.width, p.slice) for p in schedule.panels] == [("tsqr", 16, TSQR_PANEL["slice"])] * 2
    schedule = default_schedule(Problem(32768, 32768 // TSQR_ASPECT, 1))
    assert {p.variant for p in schedule.panels} == {"tsqr"} and schedule.aggregate == 64
    assert default_schedule(Problem(32768, 32768 // TSQR_ASPECT + 1, 1)).panels[0].variant != "tsqr"
    # several matrices past the rows their 16-block clusters hold (8,192), where the rows panels leave them
    assert default_schedule(Problem(TSQR_FROM - 1, 64, 2)).panels[0].cluster
    assert {p.variant for p in default_schedule(Problem(TSQR_FROM, 64, 2)).panels} == {"tsqr"}
    assert all(p.blocks == 16 for p in default_schedule(Problem(CLUSTER_FROM, CLUSTER_FROM, 1)).panels)
    # below CLUSTER_FROM rows no wide clusters (a wide matrix's cols panels take pairs: cols-aggregates-default)
    assert all(p.blocks <= 2 for p in default_schedule(Problem(CLUSTER_FROM - 1, 2 * CLUSTER_FROM, 1)).panels)
    assert all(p.blocks == 16 for p in default_schedule(Problem(2048, 32, 1)).panels)  # one panel: from 2048 rows


@pytest.mark.parametrize("m,n,batch,blocks", [
    (2048, 2048, 2, 8), (2048, 2048, 8, 8), (2048, 2048, 9, 4), (2048, 2048, 16, 4), (2048, 2048, 17, 0),
    (4096, 4096, 4, 16), (4096, 4096, 5, 8), (4096, 4096, 8, 8), (4096, 4096, 9, 0), (1024, 1024, 15, 4),
    (1024, 1024, 200, 0), (1536, 1536, 2, 4), (520, 1024, 32, 2), (520, 1024, 33, 0),
    (8192, 512, 2, 16), (4096, 32, 2, 0), (1024, 32, 1, 0), (2048, 33, 2, 8)])
def test_batches_default_to_clusters_of_256_to_512_rows_a_block(m, n, batch, blocks):
    """Several matrices of CLUSTER_FROM rows or more and more than one panel's columns: clusters of 256 to 512 rows
    a block (a power of two, at most 16 blocks), the most blocks with at most CLUSTER_BLOCKS_MAX in all, or none
    where even the fewest exceed it; the aggregates and lookahead the batch would have without clusters."""
    problem = Problem(m, n, batch)
    schedule = default_schedule(problem)
    assert {p.blocks for p in schedule.panels} == {blocks or 1} and all(p.cluster == bool(blocks)
                                                                        for p in schedule.panels)
    unclustered = schedule_from_params(problem, default_params(problem, clustered=False))
    assert (schedule.aggregate, schedule.lookahead) == (unclustered.aggregate, unclustered.lookahead)


@pytest.mark.parametrize("gain", [0.01, 0.05])
def test_default_stays_unless_a_point_is_clearly_faster(tmp_path, gain):
    """A point within timing noise of the default (MIN_GAIN) does not replace it."""
    problem = Problem(64, 64, 2)
    defaults = default_params(problem)

    def evaluator(schedule, params):
        return Outcome(100.0 if params == defaults else 100.0 * (1 - gain), 0.1, 0.1)

    result = tune(problem, Target(), 4, evaluator, _storage(tmp_path), log=lambda _: None)
    kept = gain < MIN_GAIN
    assert (result.params == defaults) == kept and result.default.time_us == 100.0
    assert result.outcome.time_us == (100.0 if kept else 100.0 * (1 - gain))
    assert ("choice" in provenance(result, "test")["tuner"]) == kept


@pytest.mark.parametrize("m,n,batch", [(8192, 512, 1), (4096, 1024, 1), (2048, 2048, 8), (4096, 4096, 2),
                                       (512, 512, 640), (32, 32, 20), (100000, 32, 1), (176, 176, 40),
                                       (352, 352, 40)])
def test_early_trials_fix_every_parameter_they_sample(m, n, batch):
    """Every enqueued point (the default and its variations) names every parameter the sampler asks for, so optuna
    samples nothing at random in it: the first trial is the default schedule itself (a clustered default once got a
    random cluster_slots and measured 2x slower than the default) and is recognised as the default afterwards."""
    problem = Problem(m, n, batch)
    for params in [default_params(problem), *variations(problem)]:
        assert sample(optuna.trial.FixedTrial(params), problem) == params


def test_study_name_follows_the_search_space(monkeypatch):
    """optuna refuses to resume a study whose categorical choices changed ("Cannot set different distribution"),
    so a changed space must give a new study name; the same space, the same name."""
    from qrgen.tune import space, study

    problem = Problem(32, 32, 20)
    name = study_name(problem, Target(), "GPU")
    assert name == study_name(problem, Target(), "GPU") and "(space " in name
    for choices, more in (("LANES_SLOTS", 96), ("COLS_CLUSTERS", 8)):
        with monkeypatch.context() as patch:
            for module in (space, study):  # the space's choices, where the sampler and the study's digest read them
                patch.setattr(module, choices, getattr(space, choices) + (more,))
            assert study_name(problem, Target(), "GPU") != name, choices
    assert study_name(problem, Target(), "GPU") == name


class _NoisyEvaluator:
    """True times per schedule (the default 100 µs, every other 99 + its index, a 'fast' one 97, a 'slow' one
    110), and one lucky first measurement: the schedule measured second reads 50 µs once, as the minimum of many
    noisy timings can."""

    def __init__(self, problem, fast=None, slow=None):
        self.defaults, self.fast, self.slow = default_params(problem), fast, slow
        self.seen: list = []
        self.calls = 0

    def __call__(self, schedule, params):
        self.calls += 1
        if schedule not in self.seen:
            self.seen.append(schedule)
            if len(self.seen) == 2:
                return Outcome(50.0, 0.1, 0.1)
        if schedule in (self.fast, self.slow):
            return Outcome(97.0 if schedule == self.fast else 110.0, 0.1, 0.1)
        true = 100.0 if params == self.defaults else 99.0 + self.seen.index(schedule)
        return Outcome(true, 0.1, 0.1)


def test_final_round_undoes_a_lucky_first_measurement(tmp_path):
    """The study's best (a lucky 50 µs) is measured again beside the others: on the medians no schedule is MIN_GAIN
    faster than the default, which stays; the final round's times are in the provenance."""
    problem = Problem(64, 64, 2)
    evaluator = _NoisyEvaluator(problem)
    lines = []
    result, path = tune_and_save(problem, Target(), 6, _storage(tmp_path), schedule_root=tmp_path,
                                 evaluator=evaluator, log=lines.append)
    study = optuna.load_study(study_name=result.study_name, storage=_storage(tmp_path))
    assert min(t.values[0] for t in study.trials if t.values) == 50.0
    assert result.params == default_params(problem) and result.outcome.time_us == 100.0
    labels = [label for label, _ in result.final_round]
    assert "default" in labels and len(labels) >= 2
    assert any(line.startswith(f"final round (median of {RUNOFF_ROUNDS})") for line in lines)
    assert load(path)[1]["tuner"]["final_round_us"]["default"] == 100.0


@pytest.mark.parametrize("existing_faster", [True, False])
@pytest.mark.parametrize("file_format", [1, 2])
def test_final_round_keeps_a_faster_schedule_file(tmp_path, existing_faster, file_format):
    """A schedule file already there runs in the final round: kept (the file untouched) unless a schedule of the
    study is MIN_GAIN faster than it. A format 1 file (the tuner's fields beside the others in its provenance) is
    read as format 2 (schedule.files.upgrade): its tuner point under "tuner", not stale while not amended."""
    from qrgen.schedule.files import save, schedule_path, to_document, write

    problem, target = Problem(64, 64, 2), Target()
    params = {**DEFAULT_PARAMS, "rows_head": 16}
    rows = schedule_from_params(problem, params)
    if file_format == 2:
        path = save(rows, problem, target, {"origin": "an earlier study", "tuner": {"params": params, "stale": False}},
                    root=tmp_path)
    else:
        data = to_document(rows, problem, target, {"origin": "an earlier study", "params": params})
        del data["format"], data["backend"]
        path = write(schedule_path(problem, target, tmp_path), data)
    assert "format" not in json.loads(path.read_text()) or file_format == 2
    schedule, prov = load(path)
    assert schedule == rows and tuner_params(prov) == params and prov["tuner"]["stale"] is False
    assert read(path)["format"] == 2 and "params" not in prov
    before = path.read_text()
    evaluator = _NoisyEvaluator(problem, **{"fast" if existing_faster else "slow": rows})
    lines = []
    result, written = tune_and_save(problem, target, 4, _storage(tmp_path), schedule_root=tmp_path,
                                    evaluator=evaluator, log=lines.append)
    assert written == path
    assert any(label.startswith("existing file") for label, _ in result.final_round)
    assert result.kept == existing_faster
    assert (path.read_text() == before) == existing_faster
    assert any(line.startswith("kept ") for line in lines) == existing_faster


def test_tf32x3_that_no_product_takes_is_written_as_fp32():
    """A point whose tf32x3 stages no product can take (no aggregate with columns right of it, no panel 64 wide)
    is the fp32 schedule, so the tuner measures it once; with trailing aggregates tf32x3 stays."""
    params = {**default_params(Problem(176, 176, 40), clustered=False), "project": "tf32x3", "update": "tf32x3"}
    for aggregate in (0, 256):
        s = schedule_from_params(Problem(176, 176, 40), {**params, "aggregate": aggregate})
        assert (s.precision.project, s.precision.update) == ("fp32", "tf32x3" if aggregate else "fp32")
    s = schedule_from_params(Problem(1024, 1024, 60), {**params, "aggregate": 128})
    assert (s.precision.project, s.precision.update) == ("tf32x3", "tf32x3")


def test_tuned_files_go_to_the_user_folder_and_leave_the_shipped_ones(tmp_path, monkeypatch):
    """Without --schedules the tuner compares against the file that serves the shape now (here a shipped one) and
    writes to the user's folder, which lookups then search first; the shipped file is untouched."""
    from qrgen.paths import schedule_dir
    from qrgen.schedule.files import find, lookup

    user = tmp_path / "user"
    monkeypatch.setenv("QRGEN_SCHEDULE_DIR", str(user))
    problem, target = Problem(1024, 1024, 60), Target()
    shipped = schedule_dir() / "sm_90" / "1024x1024_b60.json"
    before = shipped.read_text()
    assert lookup(problem, target) == shipped
    lines = []

    class Faster:  # every schedule 90 µs except the shipped one, 100
        name = "test"

        def __call__(self, schedule, params):
            return Outcome(100.0 if schedule == load(shipped)[0] else 90.0, 0.1, 0.1)

    result, path = tune_and_save(problem, target, 3, _storage(tmp_path), evaluator=Faster(), log=lines.append)
    assert path == user / "sm_90" / "1024x1024_b60.json" and shipped.read_text() == before
    assert any(label.startswith("existing file") for label, _ in result.final_round)
    assert lookup(problem, target) == path and find(problem, target)[1] == str(path)


def test_ctrl_c_runs_the_final_round_before_writing(tmp_path):
    """Ctrl-C stops the search; the final round still compares before anything is written; Ctrl-C again there
    writes nothing. The CLI exits 130 either way."""
    from qrgen import cli

    problem, target = Problem(64, 64, 2), Target()
    calls = []

    def evaluator(schedule, params):
        calls.append(schedule)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return Outcome(50.0 + len(calls), 0.1, 0.1)

    lines = []
    result, path = tune_and_save(problem, target, 10, _storage(tmp_path), schedule_root=tmp_path,
                                 evaluator=evaluator, log=lines.append)
    assert result.interrupted and result.final_round and path.is_file()
    assert any(line.startswith("final round (median") for line in lines)

    def twice(schedule, params):  # Ctrl-C in the search, and again in the final round
        calls.append(schedule)
        if len(calls) in (3, 4):
            raise KeyboardInterrupt
        return Outcome(50.0 + len(calls), 0.1, 0.1)

    root = tmp_path / "again"
    root.mkdir()
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        tune_and_save(problem, target, 10, _storage(root), schedule_root=root, evaluator=twice, log=lambda _: None)
    assert not list(root.rglob("*.json"))
    assert cli.main(["tune", "--shape", "48x40", "--batch", "3", "--trials", "3", "--cost-model", "--schedules",
                     str(root), "--storage", _storage(root)]) == 0


def test_multi_objective_runs_the_final_round(tmp_path):
    problem = Problem(64, 64, 2)
    lines = []
    result, path = tune_and_save(problem, Target(), 6, _storage(tmp_path), multi_objective=True,
                                 schedule_root=tmp_path, evaluator=ModelEvaluator(problem), log=lines.append)
    assert result.pareto and (result.final_round or result.kept)
    assert any(line.startswith("final round") for line in lines)


def test_one_study_per_objective_with_its_attributes(tmp_path):
    """Single- and multi-objective searches of one shape keep separate studies (an earlier run of the other kind
    no longer breaks the next); a study of the right name and the wrong objective count is a clear error; the
    qrgen version and the device are attributes, not part of the name."""
    from qrgen.version import __version__

    problem, target, evaluator = Problem(64, 64, 2), Target(), ModelEvaluator(Problem(64, 64, 2))
    multi = tune(problem, target, 3, evaluator, _storage(tmp_path), multi_objective=True, log=lambda _: None)
    single = tune(problem, target, 3, evaluator, _storage(tmp_path), log=lambda _: None)
    assert multi.study_name != single.study_name and __version__ not in single.study_name
    assert "64x64 b2 sm_90" in single.study_name and "time" in single.study_name
    attrs = optuna.load_study(study_name=single.study_name, storage=_storage(tmp_path)).user_attrs
    assert attrs["qrgen"] == __version__ and attrs["device"] == evaluator.name and attrs["objective"] == "time"
    other = tmp_path / "other.sqlite3"
    optuna.create_study(study_name=single.study_name, storage=f"sqlite:///{other}", directions=["minimize"] * 2)
    with pytest.raises(ValueError, match="objective"):
        tune(problem, target, 3, evaluator, f"sqlite:///{other}", log=lambda _: None)


def test_cli_exits_130_when_interrupted(monkeypatch, tmp_path):
    from qrgen import cli
    from qrgen.tune import search

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "tune_and_save", interrupted)
    assert cli.main(["tune", "--shape", "48x40", "--trials", "2", "--cost-model", "--schedules", str(tmp_path)]) == 130
