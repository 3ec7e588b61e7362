"""GPU layer: a wheel install (not editable), used from a folder outside the checkout, factors on the GPU through
qrgen.geqrf and through the modules `qrgen build` wrote for this GPU and for sm_80 (which renders and compiles its
schedule again for this GPU), and passes the gates."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import cupy, numpy as np, qrgen
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed
assert "site-packages" in qrgen.__file__, qrgen.__file__
a, _ = mixed(176, 176, len(FAMILIES), seed=1)
h, tau = qrgen.geqrf(cupy.asarray(a))
assert check(a, h, tau).ok
q, r = qrgen.qr(cupy.asarray(a))
import generated.qr_1024x1024_b60 as m
b, _ = mixed(1024, 1024, 4, seed=2)
h, tau = m.geqrf(cupy.asarray(b))
assert check(b, h, tau).ok
import generated.qr_1024x1024_b60_sm_80 as m80  # built for sm_80: rendered and compiled again for this GPU
h, tau = m80.geqrf(cupy.asarray(b))
assert check(b, h, tau).ok
print("factored", q.shape, h.shape)
"""


def _run(*args, cwd):
    # this process's packages (CuPy, NVRTC, NumPy: wherever they are installed) without the checkout, which a GPU
    # machine may put on PYTHONPATH: the wheel's qrgen must be the one imported
    path = [p for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != ROOT and "site-packages" in p
            or p in os.environ.get("PYTHONPATH", "").split(os.pathsep) and p and Path(p).resolve() != ROOT]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def test_wheel_install_factors_on_the_gpu(tmp_path):
    """QRGEN_TEST_WHEEL: a wheel built elsewhere (a GPU machine without the package index cannot build one)."""
    wheel = os.environ.get("QRGEN_TEST_WHEEL")
    if not wheel:
        wheels = tmp_path / "wheels"
        _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT), cwd=tmp_path)
        (wheel,) = wheels.glob("qrgen-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--system-site-packages", str(venv), cwd=tmp_path)
    python = str(venv / "bin" / "python")
    _run(python, "-m", "pip", "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    _run(python, "-m", "qrgen", "build", "--shape", "1024x1024", "--batch", "60", cwd=work)
    _run(python, "-m", "qrgen", "build", "--shape", "1024x1024", "--batch", "60", "--arch", "sm_80", "--no-compile",
         cwd=work)
    assert "factored" in _run(python, "-c", SCRIPT, cwd=work)
