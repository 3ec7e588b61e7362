"""CPU layer: the "whole" variant (the factorization in one kernel per matrix, the matrix in shared memory): its
schedule rules, its plan, the reference and the launch sequence's emulation of it. (NVRTC on its kernels:
tests/compile/test_kernels_compile.py.)"""
import json

import numpy as np
import pytest

from qrgen.numerics import reference
from qrgen.numerics.check import check
from qrgen.numerics.stress import mixed
from qrgen.plan import whole
from qrgen.plan.planner import check as check_target
from qrgen.plan.planner import plan
from qrgen.run import numpy_engine
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.targets import Target

# square, tall, wide, and min(m, n) no multiple of the panels' width
SHAPES = [(64, 64, 32, 8), (48, 48, 64, 4), (130, 100, 128, 16), (100, 130, 128, 16), (33, 33, 64, 8),
          (176, 176, 256, 16)]


def _whole(m, n, threads, slice_, loop=False):
    return Schedule(m, n, (Panel(min(m, n), "whole", threads, slice=slice_, loop=loop),))


def test_panel_rules_name_the_field():
    with pytest.raises(ValueError, match="Panel.slice .* one of"):
        Panel(64, "whole", 64, slice=12)
    with pytest.raises(ValueError, match="Panel.threads"):
        Panel(64, "whole", 48, slice=8)
    with pytest.raises(ValueError, match="blocks=1"):
        Panel(64, "whole", 64, blocks=2, slice=8)
    with pytest.raises(ValueError, match="Panel.slice applies to variants 'cols', 'whole'"):
        Panel(32, "rows", 64, slice=8)


def test_schedule_rules():
    with pytest.raises(ValueError, match="only panel"):
        Schedule(64, 64, (Panel(32, "whole", 64, slice=8), Panel(32, "rows", 64)))
    with pytest.raises(ValueError, match="fp32 precisions, no aggregates"):
        Schedule(64, 64, (Panel(64, "whole", 64, slice=8),), precision=Precision(update="tf32"))
    with pytest.raises(ValueError, match="shared memory"):  # 300 x 300 floats do not fit an SM
        check_target(_whole(300, 300, 256, 16), Target())
    assert whole.matrix_shared_bytes(176, 176, 256, 16) <= Target().limits.shared_bytes


def test_plan_is_one_launch_that_updates_everything():
    schedule = _whole(100, 130, 128, 16)
    p = plan(schedule)
    (kernel,), (launch,) = p.kernels, p.launches
    assert kernel.variant == "whole" and kernel.slice == 16
    assert kernel.shared_bytes == whole.matrix_shared_bytes(100, 130, 128, 16)
    assert launch.nc == 0 and not launch.trail and launch.inner == 16 and launch.barriers == 0
    # inner panels of 16 (the last one 4 wide), each updating every column right of it to n = 130
    subs = whole.inner_panels(launch, 130)
    assert [s[:2] for s in subs] == [(c, 16) for c in range(0, 96, 16)] + [(96, 4)]
    assert all(c + w + nc == 130 for c, w, nc in subs)
    with pytest.raises(ValueError, match="no keep plan"):
        plan(schedule, keep=True)


def test_json_round_trip_keeps_the_slice():
    schedule = _whole(64, 64, 64, 8, loop=True)
    data = json.loads(json.dumps(schedule.to_json()))
    assert data["panels"][0]["slice"] == 8
    assert Schedule.from_json(data) == schedule
    assert "panels of 8 columns" in schedule.describe() and "column loop" in schedule.describe()


@pytest.mark.parametrize("m,n,threads,slice_", SHAPES)
def test_reference_and_launch_sequence_agree_and_pass_the_gates(m, n, threads, slice_):
    """The launch sequence (NumPy engine) runs the kernel's inner panels exactly as the reference does, and the
    float32 result passes the gates on every stress family."""
    a, labels = mixed(m, n, 12, seed=m + n)
    schedule = _whole(m, n, threads, slice_)
    h, tau, log = numpy_engine.geqrf(a, schedule)
    assert log == [("panel", 0, 0)]
    h_ref, tau_ref = reference.geqrf(a, schedule, np.float32)
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(tau, tau_ref)
    result = check(a, h, tau)
    assert result.ok, f"{m}x{n} {labels}: {result}"
