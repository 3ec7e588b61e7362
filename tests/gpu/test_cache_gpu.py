"""GPU layer: a kernel cache entry that verifies but that the driver refuses to load is compiled again once, with
a warning, and replaced; the call goes on and passes the gates."""
import warnings

import pytest

from qrgen.compile.cache import CacheWarning, write_entry
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed
from qrgen.problem import Problem
from qrgen.run.factorizer import Factorizer
from qrgen.run.launch import device_target
from qrgen.schedule.heuristic import default_schedule

pytestmark = pytest.mark.gpu


def test_an_entry_the_driver_refuses_is_rebuilt(tmp_path, monkeypatch):
    import cupy

    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    here = device_target(cupy.cuda.Device().id)
    schedule = default_schedule(Problem(64, 64, 3), here)
    Factorizer(64, 64, schedule, here).build()
    entries = sorted(tmp_path.rglob("*.bin"))
    assert entries
    for entry in entries:  # an ELF header and junk, written with its own digest: it verifies, the driver refuses it
        write_entry(entry, b"\x7fELF" + bytes(60) + b"junk" * 50, "")
    a, _ = mixed(64, 64, len(FAMILIES), seed=3)
    with pytest.warns(CacheWarning, match="refused"):
        h, tau = Factorizer(64, 64, schedule, here)(cupy.asarray(a))
    assert check(a, h, tau).ok
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # replaced: the next process loads them without a word
        h, tau = Factorizer(64, 64, schedule, here)(cupy.asarray(a))
    assert check(a, h, tau).ok


def test_after_warmup_a_first_call_compiles_nothing(tmp_path, monkeypatch):
    import cupy

    import qrgen
    from qrgen.compile import nvrtc

    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    qrgen.warmup([(7, 96, 80)])

    def refuse(*args, **kwargs):
        raise AssertionError("compiled after a warm-up")

    monkeypatch.setattr(nvrtc, "nvrtc_compile", refuse)
    a, _ = mixed(96, 80, 7, seed=4)
    h, tau = qrgen.geqrf(cupy.asarray(a))
    q, r = qrgen.qr(cupy.asarray(a))
    assert check(a, h, tau).ok
