"""CPU layer: the compiled-kernel cache's key (qrgen.compile.nvrtc.cache_key) and the render index
(qrgen.compile.index: a warm process finds its kernels' cache entries without rendering), without NVRTC: a stand-in
compiler writes the cache."""
import dataclasses
import hashlib
import subprocess
import sys
import warnings

import pytest

from qrgen.compile import cache, index, nvrtc
from qrgen.compile.cache import CacheWarning
from qrgen.compile.nvrtc import cache_key
from qrgen.run import factorizer as factorizer_module
from qrgen.run.factorizer import Factorizer
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.targets import Target

from kernel_cases import COLS_SCHEDULES

TARGET = Target("cuda", "sm_90")
SCHEDULE = COLS_SCHEDULES[1]  # 100 x 100, two cols kernels


def test_cache_key_changes_with_every_input():
    base = dict(source="x", arch="sm_90", opts=("-a",), compiler=(13, 0), version_="1")
    key = cache_key(**base)
    for field, other in [("source", "y"), ("arch", "sm_100"), ("opts", ("-b",)), ("compiler", (13, 1)),
                         ("version_", "2")]:
        assert cache_key(**{**base, field: other}) != key, field
    assert cache_key(**base) == key


def test_render_index_key_changes_with_every_input():
    other_schedule = Schedule(100, 100, (Panel(48, "cols", 192, 1, 8), Panel(52, "cols", 224, 1, 8)),
                              precision=Precision(gram="tf32"))
    base = dict(schedule=SCHEDULE, target=TARGET, opts=("-a",), compiler=(13, 0), version="1", code="c")
    context = index.context_key(**base)
    for field, other in [("schedule", other_schedule), ("schedule", None), ("target", Target("cuda", "sm_80")),
                         ("target", Target("cuda", "sm_90", ptx=True)), ("opts", ("-b",)), ("compiler", (13, 1)),
                         ("version", "2"), ("code", "d")]:
        assert index.context_key(**{**base, field: other}) != context, field
    assert index.context_key(**base) == context
    spec = Factorizer(100, 100, SCHEDULE, TARGET).kernels[0]
    key = index.index_key(spec, context)
    assert index.index_key(spec, index.context_key(**{**base, "code": "d"})) != key
    for field in ("width", "threads", "slots", "vec", "shared_bytes"):  # every field of the spec, a few tried
        assert index.index_key(dataclasses.replace(spec, **{field: getattr(spec, field) + 1}), context) != key, field
    assert index.index_key(dataclasses.replace(spec, name=spec.name + "x"), context) != key
    assert index.index_key(dataclasses.replace(spec, trail=not spec.trail), context) != key
    assert index.index_key(spec, context) == key


def test_code_digest_covers_every_template_and_python_file(tmp_path, monkeypatch):
    templates, package = tmp_path / "templates", tmp_path / "qrgen"
    (templates / "cuda").mkdir(parents=True)
    package.mkdir()
    (templates / "cuda" / "qr.cu.j2").write_text("a")
    (package / "family.py").write_text("x = 1")
    monkeypatch.setattr(index, "template_dir", lambda: templates)
    monkeypatch.setattr(index, "_PACKAGE", package)

    def digest():
        index.code_digest.cache_clear()
        return index.code_digest()

    seen = {digest()}
    for change in (lambda: (templates / "cuda" / "qr.cu.j2").write_text("b"),  # a template edited
                   lambda: (templates / "cuda" / "panel.cuh").write_text("c"),  # a header added
                   lambda: (package / "family.py").write_text("x = 2"),  # the code that renders
                   lambda: (package / "new.py").write_text("")):
        change()
        seen.add(digest())
    assert len(seen) == 5
    (package / "notes.txt").write_text("not code")
    assert digest() in seen
    index.code_digest.cache_clear()


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """An empty cache and a stand-in NVRTC (version 13.0, every arch, a binary derived from the source); returns
    the names it compiled and the count of renders by Factorizers."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("QRGEN_FIRST_CALL", "wait")
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "check_arch", lambda target: None)
    compiled, renders = [], []

    def compile_(source, name, arch, ptx=False, quick=False):
        compiled.append(name)
        return b"cubin" + hashlib.sha256(source.encode()).digest(), "ptxas info    : Used 40 registers"

    render_all = factorizer_module.render_all

    def counted(*args, **kwargs):
        renders.append(args)
        return render_all(*args, **kwargs)

    monkeypatch.setattr(nvrtc, "nvrtc_compile", compile_)
    monkeypatch.setattr(factorizer_module, "render_all", counted)
    return compiled, renders


def fresh(batch=None) -> Factorizer:
    """A Factorizer as a new process makes one, its binaries prepared."""
    fac = Factorizer(100, 100, SCHEDULE, TARGET)
    fac.prepare(batch)
    return fac


def test_a_warm_factorizer_renders_nothing(stand_in):
    compiled, renders = stand_in
    first = fresh()
    assert len(renders) == 1 and sorted(compiled) == sorted(k.name for k in first.kernels)
    renders.clear()
    compiled.clear()
    for batch in (None, 20):  # one tier, and a first call's path with the cache warm
        again = fresh(batch)
        assert not renders and not compiled
        assert [b.cubin for b in again.binaries] == [b.cubin for b in first.binaries]
        assert all(b.cached and not b.quick for b in again.binaries)
        assert [b.name for b in again.binaries] == [k.name for k in again.kernels]
    # a rebuild (the driver refused a binary) renders the source it needs then
    rebuilt = again._rebuild(again.kernels[0].name)
    assert len(renders) == 1 and rebuilt.cubin == first.binaries[0].cubin and not rebuilt.cached


def _entries(tmp_cache):
    return sorted((tmp_cache / "sm_90").glob("*.bin"))


def test_a_stale_index_entry_falls_back_to_rendering(stand_in, tmp_path):
    compiled, renders = stand_in
    first = fresh()
    entries = _entries(tmp_path / "cache")
    specs = first.kernels

    def lookups():
        return index.lookup(specs, SCHEDULE, TARGET)

    assert None not in lookups()
    # the cache entry it names is gone: rendered and compiled again, the index written again
    entries[0].unlink()
    assert sum(b is None for b in lookups()) == 1
    renders.clear()
    compiled.clear()
    fac = fresh()
    assert len(renders) == 1 and len(compiled) == 1
    assert [b.cubin for b in fac.binaries] == [b.cubin for b in first.binaries]
    assert None not in lookups()
    # the cache entry is cut short: the look-up misses quietly, the render path warns once and replaces it
    data = entries[1].read_bytes()
    entries[1].write_bytes(data[:len(data) // 2])
    renders.clear()
    compiled.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(b is None for b in lookups()) == 1
        assert not caught
        fac = fresh()
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert len(renders) == 1 and len(compiled) == 1
    assert cache.read_entry(entries[1]) is not None
    # an index entry that is garbage, or names another kernel's entry, or an entry that was never written: misses
    paths = [index.index_path(index.index_key(s, index.context_key(SCHEDULE, TARGET, nvrtc.options("sm_90"), nvrtc.version())), "sm_90") for s in specs]
    paths[0].write_text("{not json")
    other = paths[1].read_text()
    paths[1].write_text(paths[1].read_text().replace('"cache_key": "', '"cache_key": "0'))
    assert lookups()[:2] == [None, None]
    paths[1].write_text(other.replace(specs[1].name, specs[0].name))
    assert lookups()[1] is None
    renders.clear()
    fac = fresh()
    assert len(renders) == 1 and None not in lookups()
    assert [b.cubin for b in fac.binaries] == [b.cubin for b in first.binaries]


def test_changed_code_misses_the_index(stand_in, monkeypatch):
    compiled, renders = stand_in
    fresh()
    renders.clear()
    monkeypatch.setattr(index, "code_digest", lambda: "another version of the templates and code")
    fresh()
    assert len(renders) == 1
    assert not compiled[len(Factorizer(100, 100, SCHEDULE, TARGET).kernels):]  # same sources: cache hits


def test_an_index_that_cannot_be_written_is_no_error(stand_in, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    specs = Factorizer(100, 100, SCHEDULE, TARGET).kernels
    index.record([(spec, "source") for spec in specs], SCHEDULE, TARGET)
    assert index.lookup(specs, SCHEDULE, TARGET) == [None] * len(specs)


def test_importing_qrgen_does_not_import_jinja():
    code = "import sys, qrgen, qrgen.run.factorizer; assert 'jinja2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
