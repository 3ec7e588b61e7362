"""GPU layer: the faces on the GPU: a committed generated module, `qrgen build` then import, the tuner's GPU
evaluator, and the benchmark's back-to-back timing."""
import numpy as np
import pytest

from gates import q_gates
from qrgen.numerics.check import check
from qrgen.numerics.stress import stress

pytestmark = pytest.mark.gpu


def test_generated_module_any_batch_and_wrong_shape(tmp_path):
    import importlib

    import cupy

    mod = importlib.import_module("generated.qr_176x176_b40")
    a = stress("colscaled", 176, 176, 5, seed=9)
    h, tau = mod.geqrf(cupy.asarray(a))
    assert check(a, h, tau).ok
    with pytest.raises(ValueError, match="176x176"):
        mod.geqrf(cupy.zeros((2, 170, 176), dtype=cupy.float32))
    q, r = mod.qr(cupy.asarray(a))
    factor, orth = q_gates(a, q.get(), r.get())
    assert (factor <= 20).all() and (orth <= 100).all()
    well = stress("random", 176, 176, 3, seed=10)
    x, _ = mod.lstsq(cupy.asarray(well), cupy.asarray(well[..., :1]))  # b = the first column: x = e_1
    assert np.allclose(x.get()[..., 0], np.eye(176)[0], atol=1e-3)
    with pytest.raises(ValueError, match="176x176"):
        mod.qr(cupy.zeros((2, 170, 176), dtype=cupy.float32))


def test_cli_build_then_import(tmp_path):
    import importlib.util
    import subprocess
    import sys

    import cupy

    result = subprocess.run([sys.executable, "-m", "qrgen", "build", "--shape", "96x64", "--batch", "3", "--out",
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "registers" in result.stdout
    spec = importlib.util.spec_from_file_location("qr_96x64_b3", tmp_path / "qr_96x64_b3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = stress("random", 96, 64, 3, seed=4)
    h, tau = mod.geqrf(cupy.asarray(a))
    assert check(a, h, tau).ok


def test_tune_on_the_gpu(tmp_path):
    from qrgen.problem import Problem
    from qrgen.targets import Target
    from qrgen.tune.evaluate import GPUEvaluator
    from qrgen.tune.search import tune_and_save

    problem, target = Problem(64, 64, 8), Target()
    result, path = tune_and_save(problem, target, 3, f"sqlite:///{tmp_path / 's.sqlite3'}", schedule_root=tmp_path,
                                 evaluator=GPUEvaluator(problem, target, reps=3), log=lambda _: None)
    assert path.exists() and result.outcome.accurate and result.outcome.time_us > 0


def test_back_to_back_time_is_the_kernels_own():
    """qrgen.bench.back_to_back_us: calls captured back to back in one graph cost less a call than one replayed
    graph with the L2 flushed before it (graph launch and cold memory left out), and more than nothing."""
    import cupy

    from qrgen.bench import back_to_back_us, graph_time_us
    from qrgen.run.launch import device_target
    from qrgen.run.registry import factorizer_for

    fac = factorizer_for(32, 32, 20, device_target(0))
    a = cupy.asarray(stress("random", 32, 32, 20, seed=1))
    b2b = back_to_back_us(lambda: fac(a), calls=50)
    assert 0.0 < b2b < graph_time_us(fac, [a], 10)
