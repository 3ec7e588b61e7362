"""A first call's two tiers (qrgen.compile.background), without a GPU: quick binaries are entries of their own, the
second tier's process compiles the optimized ones into the cache, and a Factorizer made with an empty cache starts
on quick binaries and changes to the optimized ones when that process is done; with a warm cache, with
QRGEN_FIRST_CALL=wait or with no writable cache there is one tier."""
import logging
import os

import pytest

from qrgen.compile import background, nvrtc
from qrgen.problem import Problem
from qrgen.run.factorizer import Factorizer
from qrgen.schedule.heuristic import default_schedule
from qrgen.targets import Target

from kernel_cases import needs_nvrtc

TARGET = Target("cuda", "sm_90")
KERNEL = 'extern "C" __global__ void first_call_probe(float* x) { x[threadIdx.x] *= 2.0f; }'


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("QRGEN_FIRST_CALL", "quick")
    return tmp_path / "cache"


def small_factorizer() -> Factorizer:
    problem = Problem(32, 32, 20)
    return Factorizer(32, 32, default_schedule(problem, TARGET), TARGET)


def test_mode_comes_from_the_environment_or_the_block(monkeypatch):
    monkeypatch.delenv("QRGEN_FIRST_CALL", raising=False)
    assert background.mode() == "quick"
    monkeypatch.setenv("QRGEN_FIRST_CALL", "wait")
    assert background.mode() == "wait"
    with background.first_calls("quick"):
        assert background.mode() == "quick"
    assert background.mode() == "wait"
    monkeypatch.setenv("QRGEN_FIRST_CALL", "later")
    with pytest.raises(ValueError, match=r"QRGEN_FIRST_CALL='later': expected one of quick, wait"):
        background.mode()
    with pytest.raises(ValueError, match="expected one of quick, wait"):
        with background.first_calls("fast"):
            pass


def test_no_second_tier_without_a_writable_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_FIRST_CALL", "quick")
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    assert not background.tiered(1.0)
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path / "cache"))
    assert background.tiered(1.0)
    assert not background.tiered(2 * background.QUICK_MAX_FLOPS)  # its quick run would cost what compiling does
    monkeypatch.setenv("QRGEN_FIRST_CALL", "wait")
    assert not background.tiered(1.0)


@needs_nvrtc
def test_quick_binaries_are_entries_of_their_own(empty_cache):
    quick = nvrtc.compile_source("first_call_probe", KERNEL, "sm_90", quick=True)
    assert quick.quick and not quick.cached
    assert nvrtc.cached("first_call_probe", KERNEL, "sm_90") is None  # the optimized entry is another
    assert nvrtc.cached("first_call_probe", KERNEL, "sm_90", quick=True).cubin == quick.cubin
    full = nvrtc.compile_source("first_call_probe", KERNEL, "sm_90")
    assert not full.quick and nvrtc.cached("first_call_probe", KERNEL, "sm_90").cubin == full.cubin
    assert "--Ofast-compile=mid" in nvrtc.options("sm_90", quick=True)
    assert "--Ofast-compile=max" in nvrtc.options("sm_90", quick="max")
    assert not any(o.startswith("--Ofast-compile") for o in nvrtc.options("sm_90"))
    assert nvrtc.cache_key(KERNEL, "sm_90", quick="max") != nvrtc.cache_key(KERNEL, "sm_90", quick="mid")
    with pytest.raises(ValueError, match="quick level"):
        nvrtc.options("sm_90", quick="fastest")


def test_each_family_has_a_quick_level():
    from qrgen.plan.family import quick_level
    from qrgen.plan.planner import plan
    from qrgen.schedule.files import find

    whole, _ = find(Problem(64, 32, 1000), TARGET)
    rows, _ = find(Problem(1024, 1024, 60), TARGET)
    assert {quick_level(k) for k in plan(whole, TARGET).kernels} == {"max"}
    for m, n, batch in [(64, 64, 1000), (128, 128, 500)]:  # lanes panels past 32 columns (their loops rolled)
        wide, _ = find(Problem(m, n, batch), TARGET)
        assert {(k.variant, quick_level(k)) for k in plan(wide, TARGET).kernels} == {("lanes", "mid")}
    assert {quick_level(k) for k in plan(rows, TARGET).kernels} == {"mid"}  # lanes, rows loop, products
    tall, _ = find(Problem(20000, 400, 1), TARGET)  # rows panels with their loop over columns unrolled
    assert {(k.variant, quick_level(k)) for k in plan(tall, TARGET).kernels} == {("rows", "max")}


@needs_nvrtc
def test_the_second_tier_process_fills_the_cache(empty_cache):
    job = background.Job([("first_call_probe", KERNEL)], TARGET)
    job.wait()
    assert job.done() and job.process.returncode == 0
    assert nvrtc.cached("first_call_probe", KERNEL, "sm_90") is not None
    assert not os.path.exists(job.path)  # the process removed its job file


@needs_nvrtc
def test_a_first_use_with_an_empty_cache_runs_quick_binaries_until_the_optimized_ones_are_in(empty_cache, caplog):
    fac = small_factorizer()
    with caplog.at_level(logging.INFO, logger="qrgen"):
        fac.prepare(20)
        assert fac.provisional and fac.binaries and all(b.quick and not b.cached for b in fac.binaries)
        fac.finish()
    assert "compiled quickly; the optimized ones compile in process" in caplog.text
    assert "now runs its optimized kernels" in caplog.text
    assert not fac.provisional
    assert fac.binaries and not any(b.quick for b in fac.binaries)
    assert all(b.cached for b in fac.binaries)  # compiled by the second tier's process, read from the cache

    again = small_factorizer()  # a later process: everything optimized from the cache, no second tier
    again.prepare(20)
    assert not again.provisional and all(b.cached and not b.quick for b in again.binaries)


@needs_nvrtc
def test_waiting_first_calls_compile_optimized_binaries(empty_cache, monkeypatch):
    monkeypatch.setenv("QRGEN_FIRST_CALL", "wait")
    fac = small_factorizer()
    fac.prepare(20)
    assert not fac.provisional and not any(b.quick for b in fac.binaries)


@needs_nvrtc
def test_a_large_first_call_compiles_optimized_binaries(empty_cache):
    batch = int(background.QUICK_MAX_FLOPS / Problem(32, 32).flops) + 1
    fac = small_factorizer()
    fac.prepare(batch)
    assert not fac.provisional and not any(b.quick for b in fac.binaries)
    unknown = small_factorizer()
    unknown.prepare()  # no batch given: no second tier
    assert not unknown.provisional


def test_problem_flops():
    assert Problem(1000, 1000).flops == pytest.approx(2e9 - 2e9 / 3)
    assert Problem(1000, 10, 3).flops == pytest.approx(3 * (2 * 1000 * 100 - 2000 / 3))
    assert Problem(10, 1000, 3).flops == Problem(1000, 10, 3).flops


@needs_nvrtc
def test_no_second_process_means_one_tier(empty_cache, monkeypatch):
    def refuse(*args):
        raise OSError("no processes here")

    monkeypatch.setattr(background, "Job", refuse)
    fac = small_factorizer()
    fac.prepare(20)
    assert not fac.provisional and fac.binaries and not any(b.quick for b in fac.binaries)


def test_a_job_that_cannot_start_leaves_no_file(tmp_path, monkeypatch):
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(OSError):
        background.Job([("first_call_probe", KERNEL)], TARGET)
    assert not list(tmp_path.iterdir())
