"""A wheel install, not editable, from a folder outside the checkout: the wheel carries the templates and the shipped
schedules, `qrgen build` finds them, writes to ./generated (nothing into site-packages), and the module imports."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, cwd):
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
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
    log = _run(str(python), "-m", "qrgen", "build", "--shape", "1024x1024", "--batch", "60", "--arch", "sm_90",
               "--no-compile", cwd=work)
    assert "schedules/sm_90/1024x1024_b60.json" in log  # the shipped tuned file, not the default heuristic
    module = work / "generated" / "qr_1024x1024_b60.py"
    assert module.is_file() and any((work / "generated" / "qr_1024x1024_b60").glob("*.cu"))
    after = sorted(p.relative_to(site) for p in site.rglob("*") if "__pycache__" not in p.parts)
    assert after == before  # nothing written into site-packages
    shown = _run(str(python), "-c", "import generated.qr_1024x1024_b60 as m; print(m.schedule.describe())", cwd=work)
    assert "aggregates of 128 columns" in shown
