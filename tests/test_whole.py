"""No-GPU layer: the "whole" variant (the factorization in one kernel per matrix, the matrix in shared memory):
its schedule rules, its plan, the reference and the launch sequence's emulation of it, and NVRTC on its kernels."""
import json
import os

import numpy as np
import pytest

from qrgen import codegen, compile as qcompile, reference, simulate
from qrgen.check import check
from qrgen.schedule import MAX_SMEM, Panel, Precision, Schedule, whole_shared_bytes
from qrgen.testing import mixed

from test_codegen_compile import needs_nvrtc

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
    with pytest.raises(ValueError, match="Panel.slice applies to variants 'cols' and 'whole'"):
        Panel(32, "rows", 64, slice=8)


def test_schedule_rules():
    with pytest.raises(ValueError, match="only panel"):
        Schedule(64, 64, (Panel(32, "whole", 64, slice=8), Panel(32, "rows", 64)))
    with pytest.raises(ValueError, match="fp32 precisions, no aggregates"):
        Schedule(64, 64, (Panel(64, "whole", 64, slice=8),), precision=Precision(update="tf32"))
    with pytest.raises(ValueError, match="shared memory"):  # 300 x 300 floats do not fit an SM
        _whole(300, 300, 256, 16)
    assert whole_shared_bytes(176, 176, 256, 16) <= MAX_SMEM


def test_plan_is_one_launch_that_updates_everything():
    schedule = _whole(100, 130, 128, 16)
    kernels, launches = codegen.plan(schedule)
    (kernel,), (launch,) = kernels, launches
    assert kernel.variant == "whole" and kernel.slice == 16 and kernel.shared_bytes == whole_shared_bytes(100, 130,
                                                                                                        128, 16)
    assert launch.nc == 0 and not launch.trail and launch.inner == 16 and launch.barriers == 0
    # inner panels of 16 (the last one 4 wide), each updating every column right of it to n = 130
    subs = codegen.inner_panels(launch, 130)
    assert [s[:2] for s in subs] == [(c, 16) for c in range(0, 96, 16)] + [(96, 4)]
    assert all(c + w + nc == 130 for c, w, nc in subs)
    with pytest.raises(ValueError, match="no keep plan"):
        codegen.plan(schedule, keep=True)


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
    h, tau, log = simulate.geqrf(a, schedule)
    assert log == [("panel", 0, 0)]
    h_ref, tau_ref = reference.geqrf(a, schedule, np.float32)
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(tau, tau_ref)
    result = check(a, h, tau)
    assert result.ok, f"{m}x{n} {labels}: {result}"


@needs_nvrtc
@pytest.mark.parametrize("m,n,threads,slice_,loop", [(64, 64, 64, 8, False), (48, 48, 32, 4, False),
                                                     (64, 32, 32, 4, False), (130, 100, 128, 16, True),
                                                     (100, 130, 128, 4, False), (176, 176, 256, 32, True)])
def test_whole_kernels_compile_without_spills(m, n, threads, slice_, loop, tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    schedule = _whole(m, n, threads, slice_, loop)
    (rendered,) = codegen.render_all(schedule, "sm_90")
    assert f"__launch_bounds__({threads}, {codegen.whole_min_blocks(codegen.plan(schedule)[0][0])})" in rendered.source
    (binary,) = qcompile.compile_many([(rendered.name, rendered.source)], "sm_90")
    assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name
