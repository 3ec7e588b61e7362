"""Compile layer (NVRTC, no GPU): `qrgen build` compiles every kernel of the module it writes and reports each
one's registers, spills and stack (the GPU layer imports and runs such a module: tests/gpu/test_faces.py)."""
from kernel_cases import needs_nvrtc
from qrgen.cli import main


@needs_nvrtc
def test_cli_build_compiles_and_reports_every_kernel(tmp_path, capsys):
    assert main(["build", "--shape", "96x64", "--batch", "3", "--arch", "sm_90", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    kernels = sorted(p.stem for p in (tmp_path / "qr_96x64_b3").glob("*.cu"))
    assert kernels and (tmp_path / "qr_96x64_b3.py").exists()
    assert f"compiling {len(kernels)} kernel(s) with NVRTC for sm_90" in out
    for name in kernels:
        assert f"  {name}: " in out and "registers" in out.split(f"  {name}: ", 1)[1].splitlines()[0], name
