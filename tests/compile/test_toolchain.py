"""The CUDA toolchain qrgen finds: NVRTC loads wherever CuPy is installed (else these tests fail, not skip), --arch
is checked against the installed NVRTC before anything is written, a GPU newer than qrgen knows gets PTX for the
newest architecture both know, and what is missing is named with the extra that brings it."""
import pytest

from qrgen import cli
from qrgen.compile import nvrtc
from qrgen.run.launch import target_for_capability
from qrgen.targets import Target
from qrgen.targets.cuda import ARCHS

from kernel_cases import needs_nvrtc

NVRTC_13 = ("sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120",
            "sm_121")


@needs_nvrtc
def test_nvrtc_loads_where_cupy_is_installed():
    """With CuPy installed, an NVRTC that cannot load is a failure: the compile tests would otherwise all skip and
    CI would pass compiling nothing (cupy-cuda13x 13.6 with NVRTC 13 did exactly that)."""
    assert nvrtc.version() >= (12, 0)
    known = set(nvrtc.supported_archs())
    assert {"sm_80", "sm_90"} <= known


@needs_nvrtc
def test_every_listed_arch_the_nvrtc_knows_is_checked(monkeypatch, tmp_path):
    for arch in ARCHS:
        if arch.rstrip("a") in nvrtc.supported_archs():
            nvrtc.check_arch(Target("cuda", arch))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90"))
    with pytest.raises(ValueError, match=r"does not compile for sm_120.*pip install 'qrgen\[cuda"):
        nvrtc.check_arch(Target("cuda", "sm_120"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["build", "--shape", "64x64", "--arch", "sm_120"]) == 2
    assert not (tmp_path / "generated").exists()  # nothing written


def test_device_targets():
    assert target_for_capability(90, NVRTC_13) == Target("cuda", "sm_90")
    assert target_for_capability(80, NVRTC_13) == Target("cuda", "sm_80")
    # newer than qrgen knows: PTX of the newest architecture below it that qrgen and NVRTC both know
    assert target_for_capability(110, NVRTC_13) == Target("cuda", "sm_103", ptx=True)
    assert target_for_capability(88, NVRTC_13) == Target("cuda", "sm_87", ptx=True)
    assert target_for_capability(130, NVRTC_13) == Target("cuda", "sm_121", ptx=True)
    with pytest.raises(RuntimeError, match="does not compile for.*pip install"):  # known to qrgen, not to NVRTC
        target_for_capability(120, ("sm_80", "sm_90"))
    with pytest.raises(RuntimeError, match="sm_80 and newer"):
        target_for_capability(75, NVRTC_13)


@needs_nvrtc
def test_ptx_target_compiles_to_ptx(tmp_path, monkeypatch):
    """The PTX a newer GPU's driver compiles: NUL-terminated text for the virtual architecture, cached apart from
    the cubin of the same source."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }'
    (ptx,) = nvrtc.compile_many([("k", source)], Target("cuda", "sm_90", ptx=True))
    (cubin,) = nvrtc.compile_many([("k", source)], Target("cuda", "sm_90"))
    assert ptx.cubin.endswith(b"\0") and b".target sm_90" in ptx.cubin and b".entry k" in ptx.cubin
    assert cubin.cubin.startswith(b"\x7fELF")
    assert nvrtc.cache_key(source, "sm_90", ptx=True) != nvrtc.cache_key(source, "sm_90")


def test_missing_toolchain_names_the_extra(monkeypatch):
    from importlib import metadata

    def version(name):
        if name == "cupy-cuda12x":
            return "14.2.0"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    assert nvrtc.install_hint() == "pip install 'qrgen[cuda12]'"
    monkeypatch.setattr(metadata, "version", lambda name: (_ for _ in ()).throw(metadata.PackageNotFoundError(name)))
    assert "qrgen[cuda]" in nvrtc.install_hint() and "qrgen[cuda12]" in nvrtc.install_hint()


def test_extras_per_cuda_major():
    """[cuda12] and [cuda13] each bring CuPy, NVRTC and cuBLAS of one CUDA major; [cuda] is the newest."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["cuda"] == extras["cuda13"]
    for major, names in ((13, ("cupy-cuda13x", "nvidia-cuda-nvrtc", "nvidia-cublas")),
                         (12, ("cupy-cuda12x", "nvidia-cuda-nvrtc-cu12", "nvidia-cublas-cu12"))):
        pinned = {req.split(">")[0].split("<")[0]: req for req in extras[f"cuda{major}"]}
        assert set(pinned) == set(names), pinned
        assert all("<" in req for req in pinned.values())  # an upper bound: a next major cannot slip in
    assert "cupy-cuda13x>=14" in " ".join(extras["cuda13"])  # 13.x cannot load NVRTC 13


def test_without_cupy_every_face_names_the_extra():
    """Without CuPy (or its NVRTC), the GPU functions and the compiler say which extra to install."""
    import subprocess
    import sys

    script = """
import sys
sys.modules["cupy"] = None
sys.modules["cupy_backends.cuda.libs.nvrtc"] = None
import numpy as np, qrgen
from qrgen.compile import nvrtc
for call in (lambda: qrgen.geqrf(np.zeros((2, 4, 4), np.float32)), nvrtc.version):
    try:
        call()
    except RuntimeError as exc:
        print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, out.stdout + out.stderr
    assert all("pip install 'qrgen[cuda" in line for line in lines)


@needs_nvrtc
def test_warmup_compiles_ahead_once(tmp_path, monkeypatch):
    """qrgen warmup / qrgen.warmup: every kernel geqrf and qr need for a list of problems, compiled at once into the
    cache; a second warm-up (a service's next start) compiles nothing; a bad problem is refused before anything
    is compiled."""
    import qrgen

    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError):
        qrgen.warmup([(3, 64, 64), (0, 10, 10)], target=Target("cuda", "sm_90"))
    assert not list(tmp_path.rglob("*.bin"))
    first = qrgen.warmup([(3, 64, 64), (5, 40, 24)], target=Target("cuda", "sm_90"))
    assert first["kernels"] == first["compiled"] > 0 and len(list(tmp_path.rglob("*.bin"))) == first["kernels"]
    again = qrgen.warmup([(3, 64, 64), (5, 40, 24)], target=Target("cuda", "sm_90"))
    assert again["kernels"] == first["kernels"] and again["compiled"] == 0
    assert cli.main(["warmup", "3x64x64", "--arch", "sm_80", "--no-qr"]) == 0
    assert list((tmp_path / "sm_80").glob("*.bin"))
