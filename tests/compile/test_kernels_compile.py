"""Compile layer (NVRTC, no GPU): the kernel cache, NVRTC to sm_90 cubin, and every kernel family's kernels
(the committed schedules', the defaults', the test schedules') compiled without spills. Set QRGEN_TEST_CACHE_DIR
to reuse compiled kernels between runs."""
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernel_cases import COLS_SCHEDULES, LANES_SCHEDULES, TSQR_COLS_SCHEDULES, needs_nvrtc
from qrgen.api import keeps_q
from qrgen.compile.nvrtc import compile_many, compile_source
from qrgen.paths import schedule_dir
from qrgen.plan import apply3, fused, rows, whole
from qrgen.plan.cols import cols_threads
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.render.sources import render, render_all
from qrgen.schedule.files import load
from qrgen.schedule.heuristic import default_schedule
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.schedule.panels import cluster_panel, lanes_panel
from qrgen.targets import Target
from qrgen.tune.space import default_params, schedule_from_params

ROOT = Path(__file__).resolve().parents[2]
SM90 = Target("cuda", "sm_90")

pytestmark = needs_nvrtc


def _test_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))


def _no_spills(items):
    for binary in compile_many(items, SM90):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


TINY = 'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.mark.parametrize("damage", ["garbage", "half", "flipped byte", "format 1"])
def test_compile_cache_and_corruption(tmp_path, monkeypatch, damage):
    """An entry that does not verify (garbage, cut to half its length with its header intact, one byte of the
    binary changed, an older format) is compiled again with a CacheWarning and replaced; never fatal."""
    from qrgen.compile.cache import MAGIC, CacheWarning

    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    first = compile_source("tiny", TINY, "sm_90")
    assert not first.cached and first.cubin.startswith(b"\x7fELF") and first.registers > 0
    second = compile_source("tiny", TINY, "sm_90")
    assert second.cached and second.cubin == first.cubin
    (entry,) = list((tmp_path / "sm_90").glob("tiny-*.bin"))
    data = entry.read_bytes()
    assert data.startswith(MAGIC)
    entry.write_bytes({"garbage": b"garbage", "half": data[:len(data) // 2],
                       "flipped byte": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:],
                       "format 1": b"QRGENCUBIN1\n" + data[len(MAGIC):]}[damage])
    with pytest.warns(CacheWarning, match="damaged"):
        third = compile_source("tiny", TINY, "sm_90")
    assert not third.cached and third.cubin == first.cubin
    assert compile_source("tiny", TINY, "sm_90").cached


def test_compile_error_names_the_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="NVRTC failed to compile broken"):
        compile_source("broken", "this is not CUDA", "sm_90")


def _committed_kernels():
    """Every kernel of the committed schedules' plans, and of their keep plans where qrgen.qr uses one at the
    file's batch (qrgen.api.keeps_q)."""
    items = {}
    for path in sorted((schedule_dir() / "sm_90").glob("*.json")):
        schedule, _ = load(path)
        batch = int(path.stem.rsplit("_b", 1)[1])
        launches = plan(schedule, SM90).launches
        keep = keeps_q(schedule, len(launches), batch * schedule.m * min(schedule.m, schedule.n))
        kept = []
        if keep:
            try:
                kept = render_all(schedule, SM90, keep=True)
            except ValueError:  # no keep plan fits (a cols panel over all columns): qr forms Q from h and tau
                pass
        for r in render_all(schedule, SM90) + kept:
            items[(path.stem, r.name)] = r.source
    return items


def test_every_committed_kernel_compiles_without_spills(tmp_path, monkeypatch):
    """Every kernel the committed schedules use, compiled for sm_90: no spills, no local-memory stack."""
    _test_cache(tmp_path, monkeypatch)
    items = _committed_kernels()
    assert items
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        binaries = dict(zip(items, pool.map(lambda kv: compile_source(kv[0][1], kv[1], "sm_90"), items.items())))
    bad = {k: (b.spill_bytes, b.stack_bytes) for k, b in binaries.items() if b.spill_bytes or b.stack_bytes}
    assert not bad, f"kernels with spills or stack (bytes): {bad}"
    assert all(0 < b.registers <= 255 for b in binaries.values())


def test_rows_shared_bytes_is_the_rows_panels_shared_memory(tmp_path, monkeypatch):
    """plan.rows.shared_bytes_of (the rows family's resource model, and the whole kernel's occupancy model) is the
    size of panel_rows's Shared for one block, checked by the compiler for several warps and widths."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    schedule = Schedule(256, 16, (Panel(16, "rows", 128),))
    (kernel,) = [r for r in render_all(schedule, SM90) if r.name.startswith("qr_rows")]
    checks = "".join(
        f"static_assert(sizeof(RowsPanel<256, 16, 16, 2, {w}, {32 * warps}, 1, 4, 0, true, false, false>::Shared)"
        f" == {rows.shared_bytes_of(warps, w)}, \"rows.shared_bytes_of({warps}, {w})\");\n"
        for warps, w in ((1, 8), (2, 8), (4, 16), (8, 32), (32, 32)))
    compile_source(kernel.name + "_shared_check", kernel.source + checks, "sm_90", use_cache=False)


@pytest.mark.parametrize("schedule", COLS_SCHEDULES + LANES_SCHEDULES + TSQR_COLS_SCHEDULES,
                         ids=lambda s: f"{s.panels[0].variant}{s.panels[0].slice or ''}-{s.m}x{s.n}")
def test_cols_and_lanes_kernels_compile_without_spills(schedule, tmp_path, monkeypatch):
    _test_cache(tmp_path, monkeypatch)
    _no_spills([(r.name, r.source) for r in render_all(schedule, SM90)])


def test_cols_panels_compiled_for_several_blocks_an_sm_do_not_spill(tmp_path, monkeypatch):
    """The cols kernels of default schedules past the SMs' count that cols.resident_blocks compiles for more than one
    block an SM (under a register cap of 128 down to 64): T formed or not, 1 to 10 row slots, 32 to 64 columns;
    and narrow panels of fewer than four warps a block, whose warps share the schedulers' register files unevenly."""
    from qrgen.plan.cols import resident_blocks

    _test_cache(tmp_path, monkeypatch)
    schedules = [default_schedule(Problem(m, n, 200), SM90)
                 for m, n in ((384, 384), (416, 416), (512, 256), (512, 384), (416, 312), (384, 448))]
    schedules += [Schedule(416, 8, (Panel(8, "cols", 32, 1, 8),)), Schedule(512, 24, (Panel(24, "cols", 192, 1, 4),)),
                  Schedule(128, 48, (Panel(24, "cols", 96, 1, 8),) * 2, Precision("fp32", "tf32x3", "tf32x3"), 24)]
    items = {}
    for schedule in schedules:
        for spec in plan(schedule, SM90).kernels:
            if spec.variant == "cols" and resident_blocks(spec) > 1:
                items[f"{spec.name}_{schedule.m}x{schedule.n}"] = render(spec, schedule, SM90).source
    assert len(items) >= 17 and any(name.endswith("_vtt_128x48") for name in items)
    _no_spills(list(items.items()))


def test_aggregated_schedule_kernels_compile(tmp_path, monkeypatch):
    """(Its plan: tests/cpu/test_plan.py, test_aggregated_schedule_plan.)"""
    _test_cache(tmp_path, monkeypatch)
    schedule = Schedule(256, 256, tuple(Panel(32, "rows", 64) for _ in range(8)), aggregate=128)
    _no_spills([(r.name, r.source) for r in render_all(schedule, SM90)])


def test_tf32x3_kernels_compile_without_spills(tmp_path, monkeypatch):
    """Every tf32x3 kernel (project, project64, update, merge, gram, and the projections that apply T: project_t,
    project64_t) compiles for sm_90 without spills. (Which schedules bring which: tests/cpu/test_plan.py,
    test_tf32x3_products_plan_and_render.)"""
    _test_cache(tmp_path, monkeypatch)
    panels = tuple(Panel(32, "rows", 64) for _ in range(8))
    items = {}
    for aggregate in (128, 64):
        # rows panels (G and T by the merge: project beside them) and cols panels that form T (the _t projections)
        for schedule in (Schedule(256, 256, panels, Precision("fp32", "tf32x3", "tf32x3"), aggregate=aggregate),
                         Schedule(256, 256, (Panel(aggregate, "cols", 4 * aggregate, 1, 8),) * (256 // aggregate),
                                  Precision("fp32", "tf32x3", "tf32x3"), aggregate=aggregate)):
            items.update((r.name, r.source) for r in render_all(schedule, SM90) if "tf32x3" in r.name)
    assert sorted(items) == ["qr_tf32x3_gram", "qr_tf32x3_merge", "qr_tf32x3_project", "qr_tf32x3_project64",
                             "qr_tf32x3_project64_t", "qr_tf32x3_project_t", "qr_tf32x3_update"]
    _no_spills(list(items.items()))


def test_apply3_kernels_compile_without_spills(tmp_path, monkeypatch):
    """The fused aggregate products (aggregate_update "fused": one apply3 kernel per aggregate width) compile for
    sm_90 without spills at every width they take. (Their plan and result: tests/cpu/test_numpy_engine.py,
    test_fused_aggregate_products.)"""
    _test_cache(tmp_path, monkeypatch)
    items = {}
    for aggregate in apply3.WIDTHS:
        schedule = Schedule(512, 512, tuple(Panel(32, "rows", 256) for _ in range(16)),
                            Precision("fp32", "tf32x3", "tf32x3"), aggregate=aggregate, aggregate_update="fused")
        items.update((r.name, r.source) for r in render_all(schedule, SM90) if "apply3" in r.name)
    assert sorted(items) == sorted(apply3.name(w) for w in apply3.WIDTHS)
    _no_spills(list(items.items()))


def test_wgmma_probe_compiles_for_sm_90a():
    """tools/wgmma_probe.py's kernels (wgmma, which only sm_90a has) compile with the installed NVRTC."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "tools" / "wgmma_probe.py"), "--compile-only"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("Used") == 3


def test_cluster_panel_kernels_compile_without_spills(tmp_path, monkeypatch):
    _test_cache(tmp_path, monkeypatch)
    panels, col = [], 0
    while col < 96:
        panels.append(cluster_panel(8192 - col, 32, 8) if col < 64 else cluster_panel(8192 - col, 16, 4))
        col += panels[-1].width
    schedule = Schedule(8192, 96, tuple(panels))
    _no_spills([(r.name, r.source) for r in render_all(schedule, SM90)])


def test_default_cluster_panels_compile_without_spills(tmp_path, monkeypatch):
    """The default's lanes panels on clusters for batches (schedule.heuristic.default_cluster): the widest and
    narrowest blocks of each, at 520, 1024 and 4096 rows, compile for sm_90 without spills."""
    _test_cache(tmp_path, monkeypatch)
    items = []
    for m, n, batch, blocks in [(520, 1024, 4, 2), (1024, 1024, 8, 4), (4096, 512, 4, 16)]:
        schedule = default_schedule(Problem(m, n, batch))
        assert all(p.variant == "lanes" and p.blocks == blocks for p in schedule.panels)
        lanes = [r for r in render_all(schedule, SM90) if r.name.startswith("qr_lanes")]
        items += [(r.name, r.source) for r in (lanes[0], lanes[-1])]
    _no_spills(items)


def test_default_for_many_matrices_compiles_without_spills(tmp_path, monkeypatch):
    """The defaults for 200 matrices of 450 to 700 columns, rows and columns no multiple of 16: cols panels of 64
    columns each their own aggregate (default_cols_aggregates, past 132 matrices), a wide matrix's over its first m
    columns; every kernel compiles for sm_90 without spills."""
    _test_cache(tmp_path, monkeypatch)
    wide = default_schedule(Problem(450, 700, 200))
    assert wide.aggregate == 64 and {p.variant for p in wide.panels} == {"cols"}
    assert sum(p.width for p in wide.panels) == 450
    many = schedule_from_params(Problem(450, 700, 200), default_params(Problem(450, 700, 200), clustered=False))
    assert many.aggregate == 64 and {p.width for p in many.panels[:-1]} == {16}  # default_many's, where no cols
    tall = default_schedule(Problem(500, 450, 200))
    assert tall.aggregate == 64 and {p.variant for p in tall.panels} == {"cols"}
    items = {(r.name, r.source) for schedule in (wide, many, tall) for r in render_all(schedule, SM90)}
    assert any(name == "qr_tf32x3_project64" for name, _ in items)
    _no_spills(sorted(items))


def test_default_cols_panels_compile_without_spills(tmp_path, monkeypatch):
    """The defaults' cols panels where the producers' early norm and their code without tests (panel_cols's FULL)
    meet the register cap: one panel over 160 or 176 columns on one block (100 x 160², 100 x 176²), and panels of
    128 and 64 columns each its own aggregate (default_cols_aggregates) at 8 rows a lane on one block (100 x 256²),
    on clusters of two (7 x 300²) and at 16 rows a lane (640 x 512²)."""
    _test_cache(tmp_path, monkeypatch)
    items = set()
    for m, n, batch in [(160, 160, 100), (176, 176, 100), (256, 256, 100), (300, 300, 7), (512, 512, 640)]:
        schedule = default_schedule(Problem(m, n, batch))
        assert {p.variant for p in schedule.panels} == {"cols"}
        items |= {(r.name, r.source) for r in render_all(schedule, SM90) if r.name.startswith("qr_cols")}
    _no_spills(sorted(items))


def test_default_tall_cols_panels_compile_without_spills(tmp_path, monkeypatch):
    """The default's tall cols panels (default_cols_tall: clusters of two, the widest panel each panel's rows fit,
    slot reuse and streaming consumers where they must) at 1024², 1000², 768², 600² and 1024 x 512 compile for sm_90
    without spills: the register model's headroom at 512 threads is what keeps ptxas from spilling there."""
    _test_cache(tmp_path, monkeypatch)
    items = set()
    for m, n in [(1024, 1024), (1000, 1000), (768, 768), (600, 600), (1024, 512)]:
        schedule = default_schedule(Problem(m, n, 60))
        assert {p.variant for p in schedule.panels} == {"cols"}
        items |= {(r.name, r.source) for r in render_all(schedule, SM90) if r.name.startswith("qr_cols")}
    names = {name for name, _ in items}
    assert any(name.endswith("_r") for name in names) and any("_st" in name for name in names)
    _no_spills(sorted(items))


def test_fused_q_kernel_compiles_without_spills(tmp_path, monkeypatch):
    _test_cache(tmp_path, monkeypatch)
    for m, n in [(100, 20), (250, 32), (400, 32)]:
        schedule = Schedule(m, n, (lanes_panel(m, n),))
        items = [(r.name, r.source) for r in render_all(schedule, SM90) if r.name.endswith("_q")]
        assert len(items) == 1
        (binary,) = compile_many(items, SM90)
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


def test_fused_panel_products_compile_without_spills(tmp_path, monkeypatch):
    """The fused kernel for every padding of W's rows (4, 8, 16, 32) and odd widths: 0 spills, shared memory (all of
    it dynamic) within two blocks per SM, registers within two blocks of 256 threads per SM."""
    _test_cache(tmp_path, monkeypatch)
    kernels = [fused.kernel(w) for w in (1, 4, 5, 8, 13, 16, 20, 32)]
    kernels += [fused.kernel(w, cl) for w in (5, 32) for cl in fused.CLUSTER_SIZES[1:]]
    items = [(r.name, r.source) for r in (render(k, None, SM90) for k in kernels)]
    spec = {k.name: k for k in kernels}
    for binary in compile_many(items, SM90):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name
        static = re.search(r"(\d+) bytes smem", binary.log)
        smem = int(static.group(1)) if static else 0
        shared = spec[binary.name].shared_bytes
        assert binary.registers <= 128 and smem == 0 and 2 * shared <= 227 * 1024, (binary.name, binary.registers)


def _whole(m, n, threads, slice_, loop=False):
    return Schedule(m, n, (Panel(min(m, n), "whole", threads, slice=slice_, loop=loop),))


@pytest.mark.parametrize("m,n,threads,slice_,loop", [(64, 64, 64, 8, False), (48, 48, 32, 4, False),
                                                     (64, 32, 32, 4, False), (130, 100, 128, 16, True),
                                                     (100, 130, 128, 4, False), (176, 176, 256, 32, True)])
def test_whole_kernels_compile_without_spills(m, n, threads, slice_, loop, tmp_path, monkeypatch):
    """(The whole family's rules, plan and emulation: tests/cpu/test_whole.py.)"""
    _test_cache(tmp_path, monkeypatch)
    schedule = _whole(m, n, threads, slice_, loop)
    (rendered,) = render_all(schedule, SM90)
    min_blocks = whole.min_blocks(plan(schedule, SM90).kernels[0], SM90.limits)
    assert f"__launch_bounds__({threads}, {min_blocks})" in rendered.source
    (binary,) = compile_many([(rendered.name, rendered.source)], SM90)
    assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


def _tool(name):
    """A development tool's module (tools/)."""
    import importlib.util

    path = ROOT / "tools" / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rows,slots,blocks", [(176, 8, 1), (2048, 16, 8)])
def test_lanes_phases_tool_instruments_the_current_template(rows, slots, blocks):
    # the lanes_phases tool patches the rendered lanes kernel at its phase boundaries: every anchor must still be
    # there (it raises otherwise) and the instrumented kernel must compile.
    script = _tool("lanes_phases.py")
    schedule, panel, kernel = script.panel_kernel(rows, slots, blocks, SM90)
    assert panel.blocks == blocks
    source = script.instrument(render(kernel, schedule, SM90).source, 32, 4 * blocks)
    assert source.count("= clock64();") == 10  # start, dots, three marks on each exchange path, update, loop end
    (binary,) = compile_many([(kernel.name + "_phases", source)], SM90, use_cache=False)
    assert binary.spill_bytes == 0
    with pytest.raises(ValueError, match="template changed"):
        script.instrument("no kernel here", 32, 1)


def test_cols_trace_tool_patches_the_current_template():
    # the cols_trace tool replaces parts of the cols kernel by text and stores a clock per column: every anchor must
    # still be there (it raises otherwise); each variant compiles without spills at 160 rows on 20 warps of one block
    # and at 176 on a cluster of two (traced too).
    script = _tool("cols_trace.py")
    items = []
    for n, slice_, blocks in ((160, 8, 1), (176, 4, 2)):
        rendered, shared = script.kernel(n, slice_, SM90, blocks)
        assert shared > 48 * 1024
        for variant in ("branches", "butterfly", "branches+butterfly", "split", "latepush", "split+latepush"):
            source = script.variant_source(rendered.source, variant)
            assert source != rendered.source
            items += [(f"{rendered.name}_{len(items)}", source),
                      (f"{rendered.name}_{len(items) + 1}", script.instrument(source))]
    assert items[1][1].count("(unsigned)clock()") == 2  # published, and consumed
    for binary in compile_many(items, SM90, use_cache=False):
        assert binary.spill_bytes == 0, binary.name
    with pytest.raises(ValueError, match="template changed"):
        script.variant_source("no kernel here", "butterfly")
    with pytest.raises(ValueError, match="variant parts"):
        script.variant_source(rendered.source, "fastest")


def test_cols_panels_the_planner_admits_compile_without_spills():
    # plan/cols.REG_OVERHEAD is the fewest registers ptxas fits beside the columns under the cap: panels it admits
    # at the edge of the cap, alone and ahead of a trailing update, compile without spilling.
    items = []
    for m, n, width, slice_, blocks in ((192, 192, 192, 8, 1), (176, 176, 176, 8, 1), (176, 176, 128, 4, 1),
                                        (352, 352, 96, 4, 1), (352, 352, 64, 2, 1), (512, 512, 64, 8, 1),
                                        (192, 192, 192, 4, 2), (352, 352, 96, 8, 2)):
        panel = Panel(width, "cols", cols_threads(width, slice_, blocks), blocks, slice_, cluster=blocks > 1)
        rest = tuple(lanes_panel(m - c, min(32, n - c)) for c in range(width, n, 32))
        schedule = Schedule(m, n, (panel,) + rest)
        plan(schedule, SM90)
        (kernel,) = [r for r in render_all(schedule, SM90) if r.name.startswith("qr_cols")]
        items.append((f"{kernel.name}_{m}", kernel.source.replace(kernel.name, f"{kernel.name}_{m}")))
    for binary in compile_many(items, SM90, use_cache=False):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary
