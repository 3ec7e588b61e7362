"""No-GPU layer: the kernel bodies are plain C++ headers, and every template renders under the strict environment."""

import dataclasses

import pytest

from qrgen.bench import markdown_document
from qrgen.build import render_module
from qrgen.paths import template_dir
from qrgen.plan import fused, msl, tf32x3
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.render.environment import environment
from qrgen.render.sources import render, render_all
from qrgen.schedule.apple import panel_schedule
from qrgen.schedule.files import find
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.targets import Target

TEMPLATES = template_dir()
TARGET = Target()
HEADERS = sorted(p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*.cuh"))


def test_headers_exist():
    assert {"cuda/dialect.cuh", "cuda/common.cuh", "cuda/panel_lanes.cuh", "cuda/panel_rows.cuh",
            "cuda/tmat.cuh"} <= set(HEADERS)


@pytest.mark.parametrize("name", HEADERS)
def test_header_is_plain_cpp(name):
    """A header holds no Jinja syntax, so including it passes it through verbatim."""
    text = (TEMPLATES / name).read_text()
    for syntax in ("{{", "{%", "{#"):
        assert syntax not in text, f"{name} contains {syntax!r}"
    assert environment().get_template(name).render() == text


# Schedules whose plans reach every panel variant and every branch of the instantiating templates.
SCHEDULES = [
    Schedule(64, 64, (Panel(32, "lanes", 64), Panel(32, "lanes", 32))),
    Schedule(32, 32, (Panel(32, "lanes", 32),)),  # one-panel, one-warp lanes: the fused Q kernel too
    Schedule(2048, 64, (Panel(32, "lanes", 256, 8, cluster=True), Panel(32, "lanes", 256, 8, cluster=True))),
    Schedule(176, 176, (Panel(96, "cols", 768, 1, 4), Panel(80, "cols", 640, 1, 4))),
    Schedule(100, 40, (Panel(32, "warp"), Panel(8, "warp", loop=True)), Precision(gram="tf32")),
    Schedule(4096, 64, (Panel(32, "rows", 256, 4), Panel(32, "rows", 256, 4, cluster=True))),
    Schedule(50000, 64, (Panel(32, "tsqr", 256, tile=512), Panel(32, "tsqr", 256, tile=512, loop=True))),
    Schedule(64, 64, (Panel(64, "whole", 64, slice=16, loop=True),)),
    Schedule(512, 512, (Panel(32, "rows", 256),) * 16, Precision("fp32", "tf32x3", "tf32x3"), aggregate=128),
    Schedule(512, 512, (Panel(32, "rows", 256),) * 16, Precision("fp16", "fp16", "fp16"), aggregate=128),
    Schedule(1024, 256, (Panel(32, "rows", 256),) * 8, panel_update="rowsplit"),
    Schedule(1024, 256, (Panel(32, "rows", 256),) * 8, panel_update="fused"),
]


def test_every_template_renders_strictly():
    """Every template renders (StrictUndefined: no variable missing) for the kernels of the schedules above, their
    keep plans, the fused kernels' clusters, the opt-in apply3 kernel and the wgmma probe's header; between them they
    use every template under templates/."""
    env = environment()
    used = set()
    loader_get = env.loader.get_source

    def recording(environment, name):
        used.add(name)
        return loader_get(environment, name)

    env.loader.get_source = recording
    try:
        env.cache.clear()  # loaded templates would not go through the loader again
        sources = []
        for schedule in SCHEDULES:
            sources += render_all(schedule, TARGET)
            if schedule.panels[0].variant != "whole":
                sources += render_all(schedule, TARGET, keep=True)
        sources += [render(fused.kernel(20, cluster), None, TARGET) for cluster in (1, 4)]
        sources += [render(tf32x3.kernel(kind), None, TARGET) for kind in tf32x3.CONFIGS]
        opt_in = Schedule(256, 256, tuple(Panel(32, "rows", 256) for _ in range(8)),
                          Precision("fp32", "tf32x3", "tf32x3"), aggregate=64, aggregate_update="fused")
        sources += [r for r in render_all(opt_in, TARGET) if "apply3" in r.name]  # aggregate_update "fused"
        env.get_template("cuda/wgmma.cuh").render()  # tools/wgmma_probe.py's helpers
        render_module(Problem(64, 64, 8), Target())
        apple = Target.parse("apple9")
        for shape in ((64, 64, 8), (300, 300, 2), (2048, 32, 1)):  # Metal: rows, tsqr, GEMMs, T (plain, keep)
            metal = find(Problem(*shape[:2], shape[2]), apple)[0]
            sources += render_all(metal, apple) + render_all(panel_schedule(Problem(*shape[:2], shape[2]), apple),
                                                             apple, keep=True)
        sources += [render(k, None, apple) for k in msl.Q_KERNELS]
        half = Precision("fp32", "fp16", "fp16")  # Metal's half-input GEMMs and their power-of-two scale
        sources += render_all(dataclasses.replace(find(Problem(300, 300, 2), apple)[0], precision=half), apple)
        markdown_document([("title", "| table |")], "qrgen bench --markdown BENCHMARKS.md",
                          dict(date="d", device="dev", driver=0, runtime=0, nvrtc="0", cupy="0", torch="0",
                               version="0"))
    finally:
        del env.loader.get_source
        env.cache.clear()
    for r in sources:
        assert r.source.startswith("// Generated by qrgen") and f"{r.name}(" in r.source, r.name
    variants = {k.variant for s in SCHEDULES for k in plan(s, TARGET).kernels}
    assert variants >= {"lanes", "cols", "warp", "rows", "tsqr", "whole", "tmat", "scale", "tf32x3", "project",
                        "update", "fused"}
    # the translation layers' headers are read as files by qrgen/compile/msl.py, not rendered; the CPU layer's for
    # CUDA kernels (templates/cuda/host/, with the fibers) are rendered in their own environment (test_host_layer.py)
    every = {p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*")
             if p.is_file() and not p.relative_to(TEMPLATES).as_posix().startswith(("metal/layers/", "cuda/host/",
                                                                                     "host/"))}
    assert used == every, f"not rendered: {sorted(every - used)}; unknown: {sorted(used - every)}"


def test_compiled_templates_are_kept_beside_the_kernel_cache_and_a_bad_folder_costs_nothing(tmp_path, monkeypatch):
    def source() -> str:
        environment.cache_clear()  # as a fresh process: a new environment, templates from the folder or compiled
        return render(tf32x3.kernel("update"), None, TARGET).source

    try:
        monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path / "cache"))
        text = source()
        assert list((tmp_path / "cache" / "templates").glob("*.cache"))
        assert source() == text
        blocked = tmp_path / "a-file"
        blocked.write_text("not a folder")
        monkeypatch.setenv("QRGEN_CACHE_DIR", str(blocked))
        assert source() == text
    finally:
        environment.cache_clear()
