"""CPU layer: a first call's cuBLAS warm-up (run/cublas.warm) without a GPU: a stand-in warm-up thread; which
plans warm cuBLAS up (Factorizer.uses_cublas)."""
import threading
import time

import pytest

from qrgen.problem import Problem
from qrgen.run import cublas
from qrgen.run.factorizer import Factorizer
from qrgen.schedule.model import Precision
from qrgen.targets import Target

TARGET = Target("cuda", "sm_90")


@pytest.fixture
def stand_in(monkeypatch):
    """Fresh warm-up state, a warm-up that takes 50 ms and makes a stand-in handle, and no real handles; returns
    the devices it warmed up."""
    for name, value in (("_WARMED", set()), ("_WARMING", {}), ("_WARM", {}), ("_local", threading.local())):
        monkeypatch.setattr(cublas, name, value)
    started = []

    def warm_up(device_id):
        started.append(device_id)
        time.sleep(0.05)
        return ["warm handle", None, None, 0]

    monkeypatch.setattr(cublas, "_warm_up", warm_up)
    monkeypatch.setattr(cublas, "_new_handle", lambda device_id: ["new handle", None, None, 0])
    return started


def test_a_warm_up_runs_once_and_its_handle_goes_to_the_first_gemm(stand_in):
    cublas.warm(0)
    cublas.warm(0)
    assert cublas.handle(0)[0] == "warm handle"  # waited for the warm-up, then took its handle
    assert stand_in == [0]
    assert cublas.handle(0, slot=1)[0] == "new handle"
    cublas.warm(0)  # once per process and device
    assert stand_in == [0]
    seen = []
    thread = threading.Thread(target=lambda: seen.append(cublas.handle(0)[0]))
    thread.start()
    thread.join()
    assert seen == ["new handle"]  # another thread makes its own


def test_a_call_waits_for_the_warm_up_it_started(stand_in):
    cublas.warm(1)
    start = time.perf_counter()
    cublas.wait_warm()
    assert time.perf_counter() - start > 0.01
    start = time.perf_counter()
    cublas.wait_warm()  # nothing running: returns at once
    assert time.perf_counter() - start < 0.01
    assert cublas.handle(1)[0] == "warm handle"


def _factorizer(schedule):
    return Factorizer(schedule.m, schedule.n, schedule, TARGET)


def test_which_plans_warm_cublas_up():
    from dataclasses import replace

    from qrgen.schedule.files import find

    from kernel_cases import lanes_schedule

    lanes = lanes_schedule(176, 176, 32, 8)
    assert lanes.panel_update == "cublas" and _factorizer(lanes).uses_cublas  # the panels' own products
    assert not _factorizer(replace(lanes, panel_update="fused")).uses_cublas  # generated kernels, no aggregates
    one, _ = find(Problem(32, 32, 20), TARGET)
    assert len(one.panels) == 1 and not _factorizer(one).uses_cublas  # one panel, nothing right of it
    aggregated, _ = find(Problem(1024, 1024, 60), TARGET)
    assert aggregated.aggregate and aggregated.panel_update != "cublas"
    gram = aggregated.precision.gram
    assert not _factorizer(replace(aggregated, precision=Precision(gram, "tf32x3", "tf32x3"))).uses_cublas
    assert _factorizer(replace(aggregated, precision=Precision(gram, "fp32", "fp32"))).uses_cublas
    assert _factorizer(replace(aggregated, precision=Precision(gram, "tf32", "tf32"))).uses_cublas
