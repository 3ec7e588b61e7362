"""CPU layer: the committed generated modules, `qrgen build` (without compiling), and the CLI's errors."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import qrgen.compile.nvrtc
import qrgen.generated
from qrgen.bench import REFERENCE_CASES
from qrgen.build import generate, render_module
from qrgen.cli import main
from qrgen.problem import Problem
from qrgen.targets import Target

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("batch,m,n", REFERENCE_CASES)
def test_committed_modules_regenerate_exactly(batch, m, n):
    name, text, sources, _, origin = render_module(Problem(m, n, batch), Target())
    tuned = f"schedules/sm_90/{m}x{n}_b{batch}.json"
    assert origin == (tuned if (ROOT / tuned).exists() else "default (heuristic)")
    assert (ROOT / "generated" / f"{name}.py").read_text() == text
    committed = {p.stem: p.read_text() for p in (ROOT / "generated" / name).glob("*.cu")}
    assert committed == sources


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "generated").glob("qr_*.py")))
def test_import_compiles_nothing(name, monkeypatch):
    """Every committed module imports (its schedule a Python literal: booleans too) without compiling: importing
    it afresh makes no Factorizer and compiles no kernel (both refused here)."""
    def refused(*args, **kwargs):
        raise AssertionError("importing a generated module must not plan or compile kernels")

    monkeypatch.setattr(qrgen.generated, "Factorizer", refused)
    monkeypatch.setattr(qrgen.compile.nvrtc, "compile_many", refused)
    monkeypatch.setattr(qrgen.compile.nvrtc, "nvrtc_compile", refused)
    monkeypatch.delitem(sys.modules, f"generated.{name}", raising=False)
    mod = importlib.import_module(f"generated.{name}")
    assert f"qr_{mod.M}x{mod.N}_b{mod.BATCH}" == name and mod.ARCH == "sm_90"
    assert sum(p.width for p in mod.schedule.panels) == min(mod.M, mod.N)
    for name in ("geqrf", "qr", "lstsq", "householder_product", "ormqr", "build"):
        assert callable(getattr(mod, name)) and getattr(mod, name).__doc__, name


def test_build_writes_module_and_sources(tmp_path, capsys):
    (tmp_path / "none").mkdir()  # a schedule folder with no files: the default heuristic
    assert main(["build", "--shape", "40x24", "--batch", "3", "--out", str(tmp_path), "--no-compile",
                 "--schedules", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "default (heuristic)" in out and "qr_40x24_b3.py" in out
    assert (tmp_path / "qr_40x24_b3.py").exists() and list((tmp_path / "qr_40x24_b3").glob("*.cu"))
    # Rebuilding with another schedule removes kernels the new one does not use.
    stale = tmp_path / "qr_40x24_b3" / "qr_old.cu"
    stale.write_text("old")
    generate(Problem(40, 24, 3), Target(), tmp_path, tmp_path / "none")
    assert not stale.exists()


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in ("--shape", "--batch", "--arch", "--out", "--schedules", "--no-compile", "--jobs"):
        assert option in text


@pytest.mark.parametrize("argv,message", [
    (["build", "--shape", "10by10"], "MxN"),
    (["build", "--shape", "10x10", "--batch", "0"], "positive integer"),
    (["build", "--shape", "10x10", "--arch", "hopper", "--no-compile"], "architecture 'hopper'"),
    (["bench", "60x1024"], "BATCHxMxN"),
])
def test_cli_errors(argv, message, capsys):
    with pytest.raises(SystemExit) if argv[0] == "bench" or "--arch" not in argv else _no_raise():
        code = main(argv)
        assert code == 2
    assert message in capsys.readouterr().err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "qrgen", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and "qrgen" in result.stdout


def test_tune_command_with_time_limit(tmp_path, capsys):
    """`qrgen tune` over the cost model: one trial under a zero time limit, the schedule written, default reported."""
    assert main(["tune", "--shape", "40x24", "--batch", "2", "--cost-model", "--time-limit", "0",
                 "--schedules", str(tmp_path), "--storage", f"sqlite:///{tmp_path / 's.sqlite3'}"]) == 0
    out = capsys.readouterr().out
    assert "time limit" in out and "default schedule:" in out and (tmp_path / "sm_90" / "40x24_b2.json").exists()
