"""Other NVIDIA architectures than the H200's: the default schedules the heuristic gives sm_80 (no clusters) render
and compile with NVRTC for sm_80, without spills."""
import pytest

from qrgen.compile.nvrtc import compile_many
from qrgen.problem import Problem
from qrgen.render.sources import render_all
from qrgen.schedule.files import find
from qrgen.targets import Target

from kernel_cases import needs_nvrtc


@needs_nvrtc
@pytest.mark.parametrize("batch,m,n", [(20, 32, 32), (40, 176, 176), (1, 40000, 256)])
def test_sm80_default_schedules_compile_without_spills(batch, m, n, tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    target = Target("cuda", "sm_80")
    schedule, origin = find(Problem(m, n, batch), target)
    assert origin.startswith("default")  # no tuned file for sm_80
    assert not any(p.cluster for p in schedule.panels)
    binaries = compile_many([(r.name, r.source) for r in render_all(schedule, target)], target)
    assert binaries and all(b.spill_bytes == 0 for b in binaries), [(b.name, b.spill_bytes) for b in binaries]
