"""`qrgen build` compiles every kernel before it writes anything: a kernel that does not compile leaves no module and
no sources, exits 2, and prints the compiler's first errors naming the kernel."""
from qrgen import build as build_module
from qrgen import cli
from qrgen.plan.specs import Rendered

from kernel_cases import needs_nvrtc


@needs_nvrtc
def test_a_kernel_that_does_not_compile_leaves_nothing_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path / "cache"))
    render_all = build_module.render_all

    def broken(schedule, target, keep=False):
        out = render_all(schedule, target, keep)
        return out[:-1] + [Rendered(out[-1].name, out[-1].source + "\nthis is not CUDA;\n")]

    monkeypatch.setattr(build_module, "render_all", broken)
    out = tmp_path / "out"
    code = cli.main(["build", "--shape", "64x64", "--batch", "8", "--arch", "sm_90", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "NVRTC failed to compile" in err and "error" in err and len(err.splitlines()) < 30
    assert not out.exists()
