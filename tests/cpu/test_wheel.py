"""A wheel install, not editable, from a folder outside the checkout: the wheel carries the templates and the shipped
schedules, `qrgen build` finds them, writes to ./generated (nothing into site-packages), and the module imports."""
import os
import subprocess
import sys
from pathlib import Path

from kernel_cases import cupy_installed

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, cwd, env=None):
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def test_wheel_installs_and_builds_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT), cwd=tmp_path)
    (wheel,) = wheels.glob("qrgen-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--system-site-packages", str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    where = _run(str(python), "-c", "import qrgen, qrgen.paths as p; print(qrgen.__file__); print(p.template_dir()); "
                 "print(p.schedule_dir())", cwd=work).split()
    site = Path(where[0]).parent
    assert site.is_relative_to(venv) and Path(where[1]) == site / "data" / "templates"
    assert (Path(where[2]) / "sm_90" / "1024x1024_b60.json").is_file()
    before = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)
    compile_ = [] if cupy_installed() else ["--no-compile"]  # compiling needs the [cuda] extra
    env = {**os.environ, "QRGEN_CACHE_DIR": os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path / "cache"))}
    logs = {arch: _run(str(python), "-m", "qrgen", "build", "--shape", "1024x1024", "--batch", "60", "--arch", arch,
                       *compile_, cwd=work, env=env) for arch in ("sm_90", "sm_80")}
    assert "schedules/sm_90/1024x1024_b60.json" in logs["sm_90"]  # the shipped tuned file, not the default
    assert "default (heuristic)" in logs["sm_80"]  # no tuned file for sm_80
    if compile_ == []:
        assert all("bytes spilled" in log for log in logs.values())
    for name in ("qr_1024x1024_b60", "qr_1024x1024_b60_sm_80"):
        assert (work / "generated" / f"{name}.py").is_file() and any((work / "generated" / name).glob("*.cu"))
    after = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)
    assert after == before  # nothing written into site-packages
    shown = _run(str(python), "-c", "import generated.qr_1024x1024_b60 as m, generated.qr_1024x1024_b60_sm_80 as m80;"
                 " print(m.schedule.describe()); print(m80.ARCH, m80.schedule.describe())", cwd=work)
    assert "sm_80" in shown and "cluster" not in shown.splitlines()[1]
    assert "aggregates of 128 columns" in shown
    # Metal: a module of .metal sources, and the CPU translation layer's headers shipped with the templates
    log = _run(str(python), "-m", "qrgen", "build", "--shape", "64x64", "--batch", "8", "--arch", "apple9", cwd=work,
               env=env)
    assert "checked" in log and any((work / "generated" / "qr_64x64_b8_apple9").glob("*.metal"))
    ran = _run(str(python), "-c", "from qrgen.run import metal_engine, msl_devices; from qrgen.numerics.stress import "
               "stress; from qrgen.numerics.check import check; a = stress('random', 32, 32, 2); "
               "print(check(a, *metal_engine.geqrf(a, msl_devices.CpuDevice())).ok)", cwd=work, env=env)
    assert ran.strip().endswith("True")


_COMPILE_IN_VENV = """
import sys
from qrgen.compile import nvrtc
from qrgen.problem import Problem
from qrgen.render.sources import render_all
from qrgen.schedule.files import find
from qrgen.targets import Target
assert nvrtc.version()[0] == 12, nvrtc.version()
for arch in ("sm_80", "sm_90"):
    target = Target("cuda", arch)
    schedule, _ = find(Problem(64, 64, 3), target)
    binaries = nvrtc.compile_many([(r.name, r.source) for r in render_all(schedule, target)], target)
    assert binaries and all(b.cubin.startswith(b"\\x7fELF") and b.spill_bytes == 0 for b in binaries)
try:
    from qrgen.run import cublas
    cublas._library()
    print("cublas loaded")
except RuntimeError as exc:
    print("cublas:", exc)
print("compiled", nvrtc.version())
"""


def test_cuda12_extra_resolves_installs_and_compiles(tmp_path):
    """[cuda12] resolves on the package index to versions inside its ranges; its CuPy and NVRTC, installed alone
    into a fresh environment, load and compile qrgen's kernels for sm_80 and sm_90; cuBLAS, left out here (it only
    matters on a GPU), is named with the extra when missing. (The [cuda13] extra is the one CI itself installs.)"""
    import json
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cuda12"]
    venv = tmp_path / "venv12"
    _run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    report = tmp_path / "report.json"
    _run(*pip, "--dry-run", "--report", str(report), *extra, cwd=tmp_path)
    resolved = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert resolved["cupy-cuda12x"].startswith("14.") and resolved["nvidia-cuda-nvrtc-cu12"].startswith("12.")
    assert resolved["nvidia-cublas-cu12"].startswith("12.")
    _run(*pip, *[r for r in extra if "cublas" not in r], "jinja2>=3.1", cwd=tmp_path)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", _COMPILE_IN_VENV], cwd=tmp_path, capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                                         "QRGEN_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "compiled (12," in out.stdout
    assert "cublas loaded" in out.stdout or "pip install 'qrgen[cuda12]'" in out.stdout
