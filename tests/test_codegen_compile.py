"""No-GPU layer: rendering, the cache key, NVRTC to sm_90 cubin, and the committed schedules' kernels."""
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2
import pytest

from qrgen import codegen, compile as qcompile
from qrgen.problem import Problem
from qrgen.schedule import Panel, Precision, Schedule, default_schedule, load, rows_shared_bytes

ROOT = Path(__file__).resolve().parent.parent


def _nvrtc():
    try:
        qcompile.nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc(), reason="NVRTC is not installed (pip install -e .[cuda])")


def test_environment_is_strict():
    env = codegen.environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing }}").render()


def test_plan_shares_kernels_and_orders_launches():
    s = Schedule(100, 100, (Panel(32, "rows", 64), Panel(32, "rows", 64), Panel(32, "warp", 32), Panel(4, "warp", 32)))
    kernels, launches = codegen.plan(s)
    assert [L.c0 for L in launches] == [0, 32, 64, 96]
    assert [L.rows for L in launches] == [100, 68, 36, 4]
    assert [L.trail for L in launches] == [True, True, True, False]
    assert len({k.name for k in kernels}) == len(kernels) == 3
    assert launches[0].kernel == launches[1].kernel  # 100 and 68 rows over 64 threads: two rows each


def test_render_is_deterministic_and_constants_are_in_the_source():
    s = default_schedule(Problem(176, 176, 40))
    first = codegen.render_all(s)
    assert [r.source for r in first] == [r.source for r in codegen.render_all(s)]
    src = first[0].source
    assert "Do not edit" in src and "panel_lanes<176, 176, 176, 8, 32, 704, true, 1, false, false>" in src
    rows = codegen.render_all(default_schedule(Problem(176, 176, 640)))[0].source  # past two blocks per SM: rows
    assert "panel_rows<176, 176, 176," in rows


def test_vector_width_follows_alignment():
    """The panel kernels' loads (the fused products choose 16 or 4 bytes at run time)."""
    kernels, _ = codegen.plan(default_schedule(Problem(33, 33, 640)))
    assert {k.vec for k in kernels if k.variant != "fused"} == {1}
    kernels, _ = codegen.plan(default_schedule(Problem(64, 64, 640)))
    assert {k.vec for k in kernels if k.variant not in ("fused", "lanes")} == {4}  # (the last 32 rows: one-warp lanes)
    kernels, _ = codegen.plan(default_schedule(Problem(64, 64, 4)))
    panels = [k for k in kernels if k.variant != "fused"]
    assert {k.variant for k in panels} == {"lanes"} and {k.vec for k in panels} == {1}  # one float per lane


def test_cache_key_changes_with_every_input():
    base = dict(source="x", arch="sm_90", opts=("-a",), nvrtc=(13, 0), version="1")
    key = qcompile.cache_key(**base)
    for field, other in [("source", "y"), ("arch", "sm_100"), ("opts", ("-b",)), ("nvrtc", (13, 1)),
                         ("version", "2")]:
        assert qcompile.cache_key(**{**base, field: other}) != key, field
    assert qcompile.cache_key(**base) == key


TINY = 'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@needs_nvrtc
def test_compile_cache_and_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    first = qcompile.compile_source("tiny", TINY, "sm_90")
    assert not first.cached and first.cubin.startswith(b"\x7fELF") and first.registers > 0
    second = qcompile.compile_source("tiny", TINY, "sm_90")
    assert second.cached and second.cubin == first.cubin
    (entry,) = list((tmp_path / "sm_90").glob("tiny-*.cubin"))
    entry.write_bytes(b"garbage")
    third = qcompile.compile_source("tiny", TINY, "sm_90")
    assert not third.cached and third.cubin == first.cubin
    assert qcompile.compile_source("tiny", TINY, "sm_90").cached


@needs_nvrtc
def test_compile_error_names_the_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="NVRTC failed to compile broken"):
        qcompile.compile_source("broken", "this is not CUDA", "sm_90")


def _committed_kernels():
    """Every kernel of the committed schedules' plans, and of their keep plans where qrgen.qr uses one at the
    file's batch (linalg.keeps_q)."""
    from qrgen.linalg import keeps_q

    items = {}
    for path in sorted((ROOT / "schedules" / "sm_90").glob("*.json")):
        schedule, _ = load(path)
        batch = int(path.stem.rsplit("_b", 1)[1])
        _, launches = codegen.plan(schedule)
        keep = keeps_q(schedule, len(launches), batch * schedule.m * min(schedule.m, schedule.n))
        for r in codegen.render_all(schedule, "sm_90") + (codegen.render_all(schedule, "sm_90", keep=True)
                                                           if keep else []):
            items[(path.stem, r.name)] = r.source
    return items


@needs_nvrtc
def test_every_committed_kernel_compiles_without_spills(tmp_path, monkeypatch):
    """Every kernel the committed schedules use, compiled for sm_90: no spills, no local-memory stack."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    items = _committed_kernels()
    assert items
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        binaries = dict(zip(items, pool.map(lambda kv: qcompile.compile_source(kv[0][1], kv[1], "sm_90"),
                                            items.items())))
    bad = {k: (b.spill_bytes, b.stack_bytes) for k, b in binaries.items() if b.spill_bytes or b.stack_bytes}
    assert not bad, f"kernels with spills or stack (bytes): {bad}"
    assert all(0 < b.registers <= 255 for b in binaries.values())


@needs_nvrtc
def test_rows_shared_bytes_is_the_rows_panels_shared_memory(tmp_path, monkeypatch):
    """schedule.rows_shared_bytes (the budget checks' and the whole kernel's occupancy model) is the size of
    panel_rows.cuh.j2's Shared for one block, checked by the compiler for several warps and widths."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", str(tmp_path))
    schedule = Schedule(256, 16, (Panel(16, "rows", 128),))
    (kernel,) = [r for r in codegen.render_all(schedule, "sm_90") if r.name.startswith("qr_rows")]
    checks = "".join(
        f"static_assert(sizeof(RowsPanel<256, 16, 16, 2, {w}, {32 * warps}, 1, 4, 0, true, false, false>::Shared)"
        f" == {rows_shared_bytes(warps, w)}, \"rows_shared_bytes({warps}, {w})\");\n"
        for warps, w in ((1, 8), (2, 8), (4, 16), (8, 32), (32, 32)))
    qcompile.compile_source(kernel.name + "_shared_check", kernel.source + checks, "sm_90", use_cache=False)


COLS_SCHEDULES = [
    Schedule(176, 176, (Panel(96, "cols", 768, 1, 4), Panel(80, "cols", 640, 1, 4))),
    Schedule(100, 100, (Panel(48, "cols", 192, 1, 8), Panel(52, "cols", 224, 1, 8))),
    Schedule(352, 352, tuple(Panel(64, "cols", 512, 1, 4) for _ in range(5)) + (Panel(32, "cols", 256, 1, 4),)),
    Schedule(300, 70, (Panel(64, "cols", 512, 1, 4), Panel(6, "cols", 96, 1, 2))),
]


def test_cols_plan_shared_memory_and_names():
    kernels, launches = codegen.plan(COLS_SCHEDULES[0])
    assert [k.variant for k in kernels] == ["cols", "cols"]
    assert launches[0].shared_bytes == codegen.cols_shared_bytes(96, 6, True) > 48 * 1024
    assert launches[1].shared_bytes == codegen.cols_shared_bytes(80, 3, False)
    assert kernels[0].name == "qr_cols_w96_c4_s6_v4_trail"


def test_cols_shared_memory_budget_is_checked():
    with pytest.raises(ValueError, match="shared memory"):
        Schedule(288, 288, (Panel(128, "cols", 512, 1, 8), Panel(128, "cols", 512, 1, 8), Panel(32, "warp", 32)))


def _lanes_schedule(m, n, width, slots, aggregate=0, blocks=1):
    """Lanes panels (about `slots` rows per warp) of `width` columns, not straddling aggregates; blocks > 1: on
    clusters of that many blocks."""
    from qrgen.schedule import lanes_panel

    k, panels, col = min(m, n), [], 0
    while col < k:
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        panel = lanes_panel(m - col, min(width, end - col), slots, blocks)
        panels.append(panel)
        col += panel.width
    return Schedule(m, n, tuple(panels), aggregate=aggregate)


LANES_SCHEDULES = [
    _lanes_schedule(32, 32, 32, 32),
    _lanes_schedule(176, 176, 32, 32),
    _lanes_schedule(100, 70, 16, 16),
    _lanes_schedule(300, 200, 32, 48, aggregate=64),
    _lanes_schedule(33, 257, 8, 8),
    _lanes_schedule(257, 33, 32, 24),
    _lanes_schedule(4096, 64, 32, 32, blocks=8),
    _lanes_schedule(1000, 300, 32, 8, aggregate=128, blocks=4),
    _lanes_schedule(10, 100, 32, 8, blocks=2),  # a wide matrix: one warp in each of two blocks
    _lanes_schedule(48, 80, 16, 48),  # one warp and one block: columns unrolled, each panel with columns right of it
    _lanes_schedule(2048, 96, 32, 16, aggregate=64, blocks=16),  # a non-portable cluster of 16 blocks
]


@needs_nvrtc
@pytest.mark.parametrize("schedule", COLS_SCHEDULES + LANES_SCHEDULES,
                         ids=lambda s: f"{s.panels[0].variant}-{s.m}x{s.n}")
def test_cols_and_lanes_kernels_compile_without_spills(schedule, tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    items = [(r.name, r.source) for r in codegen.render_all(schedule, "sm_90")]
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


@needs_nvrtc
def test_aggregated_schedule_kernels_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    schedule = Schedule(256, 256, tuple(Panel(32, "rows", 64) for _ in range(8)), aggregate=128)
    kernels, launches = codegen.plan(schedule)
    tmat = next(k for k in kernels if k.name == codegen.TMAT_KERNEL)
    assert tmat.threads == codegen.TMAT_THREADS == 1024
    assert kernels[-1].name == "qr_gemm3_gram"  # an fp32 G of few matrices in parts (runtime.gram_splits)
    assert [L.nc for L in launches[:4]] == [96, 64, 32, 0] and all(L.trail for L in launches[:4])
    assert [L.v_row for L in launches[:4]] == [0, 32, 64, 96] and {L.v_ld for L in launches[:4]} == {256}
    items = [(r.name, r.source) for r in codegen.render_all(schedule, "sm_90")]
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


@needs_nvrtc
def test_tf32x3_products_plan_and_compile(tmp_path, monkeypatch):
    """A schedule whose products are tf32x3 brings the gemm3 kernels (only the stages that ask); an fp32 Gram matrix
    of aggregates brings the gram kernel whatever the products (G in tf32x3 where an update in tf32x3 takes the
    merge, or in parts for few matrices: runtime.gram_splits), and they compile for sm_90 without spills."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    panels = tuple(Panel(32, "rows", 64) for _ in range(8))
    names = {}
    for project, update in (("fp32", "fp32"), ("tf32x3", "fp32"), ("tf32x3", "tf32x3")):
        schedule = Schedule(256, 256, panels, Precision("fp32", project, update), aggregate=128)
        names[update] = [k.name for k in codegen.plan(schedule)[0] if k.variant == "gemm3"]
        if project == "fp32":
            assert names[update] == ["qr_gemm3_gram"]
        if update == "fp32" and project == "tf32x3":
            assert names[update] == ["qr_gemm3_project", "qr_gemm3_gram"]
    assert names["tf32x3"] == ["qr_gemm3_project", "qr_gemm3_update", "qr_gemm3_gram"]
    # one aggregate over every column: nothing right of it to project, so no projection kernel; its merge (for qr)
    one = Schedule(256, 256, panels, Precision("fp32", "tf32x3", "tf32x3"), aggregate=256)
    assert [k.name for k in codegen.plan(one)[0] if k.variant == "gemm3"] == ["qr_gemm3_update", "qr_gemm3_gram"]
    # aggregates of 64: their projections on the 64-row tiles (codegen.project_kind), the 128-row kernel not built
    by64 = Schedule(256, 256, panels, Precision("fp32", "tf32x3", "tf32x3"), aggregate=64)
    assert [k.name for k in codegen.plan(by64)[0] if k.variant == "gemm3"] == [
        "qr_gemm3_project64", "qr_gemm3_update", "qr_gemm3_gram"]
    items = [(r.name, r.source) for s in (schedule, by64) for r in codegen.render_all(s, "sm_90") if "gemm3" in r.name]
    items = list(dict(items).items())
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in items[0][1]
    assert "#define BM 64" in dict(items)["qr_gemm3_project64"] and "#define BM 128" in dict(items)["qr_gemm3_project"]
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


def test_lanes_panels_and_gram_precision():
    schedule = LANES_SCHEDULES[1]
    assert [p.variant for p in schedule.panels] == ["lanes"] * 6
    assert [p.threads for p in schedule.panels][:2] == [192, 160]
    kernels, _ = codegen.plan(schedule)
    assert kernels[0].name == "qr_lanes_w32_t192_s30_trail" and kernels[-1].name == "qr_lanes_w16_t32_s16"
    tf32 = Schedule(32, 32, (Panel(16, "lanes", 32), Panel(16, "rows", 32)),
                    precision=__import__("qrgen").schedule.Precision(gram="tf32"))
    assert (tf32.panel_gram(0), tf32.panel_gram(1)) == ("fp32", "tf32")
    with pytest.raises(ValueError, match="multiple of 32"):
        Panel(32, "lanes", 48)
    with pytest.raises(ValueError, match="registers"):
        Schedule(2000, 32, (Panel(32, "lanes", 1024),))


def test_lanes_panels_on_clusters():
    """Lanes panels whose rows a cluster of blocks shares: validated, named apart, slots counted over the blocks,
    the cluster launch attribute and the exchange through the blocks' shared memory in the source."""
    schedule = LANES_SCHEDULES[6]
    panel = schedule.panels[0]
    assert (panel.variant, panel.threads, panel.blocks, panel.cluster) == ("lanes", 512, 8, True)
    kernels, launches = codegen.plan(schedule)
    assert kernels[0].name == "qr_lanes_w32_t512_c8_s32_trail" and kernels[0].slots == 32
    assert all(L.cluster and L.blocks == 8 for L in launches)
    source = codegen.render(schedule, kernels[0]).source
    assert "__cluster_dims__(8, 1, 1)" in source and "push_peer_at(peer[q], &sm, &sm.xr[buf][g][lane], sum" in source
    assert "panel_lanes<4096, 64, 64, 32, 32, 512, true, 8, true, false>" in source
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    with pytest.raises(ValueError, match="blocks=1, or 2 to 16 blocks with cluster=True; got blocks=8"):
        Panel(32, "lanes", 512, 8)
    with pytest.raises(ValueError, match="Panel.cluster"):
        Panel(32, "lanes", 512, 17, cluster=True)


@needs_nvrtc
def test_cluster_panel_kernels_compile_without_spills(tmp_path, monkeypatch):
    from qrgen.schedule import cluster_panel

    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    panels, col = [], 0
    while col < 96:
        panels.append(cluster_panel(8192 - col, 32, 8) if col < 64 else cluster_panel(8192 - col, 16, 4))
        col += panels[-1].width
    schedule = Schedule(8192, 96, tuple(panels))
    items = [(r.name, r.source) for r in codegen.render_all(schedule, "sm_90")]
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


@needs_nvrtc
def test_default_cluster_panels_compile_without_spills(tmp_path, monkeypatch):
    """The default's lanes panels on clusters for batches (schedule.default_cluster): the widest and narrowest
    blocks of each, at 512, 1024 and 4096 rows, compile for sm_90 without spills."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    items = []
    for m, n, batch, blocks in [(512, 512, 4, 2), (1024, 1024, 8, 4), (4096, 512, 4, 16)]:
        schedule = default_schedule(Problem(m, n, batch))
        assert all(p.variant == "lanes" and p.blocks == blocks for p in schedule.panels)
        lanes = [r for r in codegen.render_all(schedule, "sm_90") if r.name.startswith("qr_lanes")]
        items += [(r.name, r.source) for r in (lanes[0], lanes[-1])]
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


@needs_nvrtc
def test_default_for_many_matrices_compiles_without_spills(tmp_path, monkeypatch):
    """The default for 64 or more matrices of 384 to 512 rows (schedule.default_many) at a shape whose rows and
    columns are no multiple of 16, and wide: every kernel compiles for sm_90 without spills."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    schedule = default_schedule(Problem(500, 450, 64))
    assert schedule.aggregate == 64 and {p.width for p in schedule.panels[:-1]} == {16}
    items = [(r.name, r.source) for r in codegen.render_all(schedule, "sm_90")]
    assert any(name == "qr_gemm3_project64" for name, _ in items)
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


@pytest.mark.parametrize("m,n,batch,fused", [(32, 32, 20, True), (100, 20, 3, True), (40, 1, 2, True),
                                             (32, 32, 20000, True), (64, 64, 3, False), (10, 100, 3, False),
                                             (4096, 32, 1, False)])
def test_fused_q_kernel_only_for_one_lanes_panel_on_one_block(m, n, batch, fused):
    """qr's one-launch Q and R: a lanes kernel with FORMQ where the schedule is one lanes panel on one block with no
    columns right of it (m >= n, n <= 32); nothing extra for other schedules (warp panels, several panels, a wide
    matrix's trailing columns, clusters)."""
    schedule = default_schedule(Problem(m, n, batch))
    kernels, launches = codegen.plan(schedule)
    q = [k for k in kernels if k.formq]
    assert bool(q) == fused
    if fused:
        (k,) = q
        assert k.name == launches[0].kernel + "_q" and k.variant == "lanes" and k.width == n
        source = codegen.render(schedule, k).source
        assert "true>(\n      src, h, tau, vt, zt" in source  # FORMQ, the last template argument


@needs_nvrtc
def test_fused_q_kernel_compiles_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    from qrgen.schedule import lanes_panel

    for m, n in [(100, 20), (250, 32), (400, 32)]:
        schedule = Schedule(m, n, (lanes_panel(m, n),))
        items = [(r.name, r.source) for r in codegen.render_all(schedule, "sm_90") if r.name.endswith("_q")]
        assert len(items) == 1
        (binary,) = qcompile.compile_many(items, "sm_90")
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name


@needs_nvrtc
def test_fused_panel_products_compile_without_spills(tmp_path, monkeypatch):
    """The fused kernel for every padding of W's rows (4, 8, 16, 32) and odd widths: 0 spills, shared memory (all of
    it dynamic) within two blocks per SM, registers within two blocks of 256 threads per SM."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ.get("QRGEN_TEST_CACHE_DIR", str(tmp_path)))
    kernels = [codegen.fused_kernel(w) for w in (1, 4, 5, 8, 13, 16, 20, 32)]
    kernels += [codegen.fused_kernel(w, cl) for w in (5, 32) for cl in codegen.FUSED_CLUSTERS[1:]]
    items = [(r.name, r.source) for r in (codegen.render_fused(k) for k in kernels)]
    assert all("cp.async.cg.shared.global" in src and "cp.async.ca.shared.global" in src for _, src in items)
    assert all(("__cluster_dims__" in src) == ("_c" in name) for name, src in items)
    spec = {k.name: k for k in kernels}
    for binary in qcompile.compile_many(items, "sm_90"):
        assert binary.spill_bytes == 0 and binary.stack_bytes == 0, binary.name
        static = re.search(r"(\d+) bytes smem", binary.log)
        smem = int(static.group(1)) if static else 0
        shared = spec[binary.name].shared_bytes
        assert binary.registers <= 128 and smem == 0 and 2 * shared <= 227 * 1024, (binary.name, binary.registers)


def test_tmat_shared_memory_fits_one_block():
    """The T kernel stages G (a half's diagonal block, then G12), T1, T2 and X in shared memory: within an sm_90
    block's 227 KB for every aggregate size (every width a schedule or qrgen.qmatrix can give it), growing with it;
    at TMAT_BLOCKED_MAX G, T and X of 128 rows less one block for X, as before the halves."""
    from qrgen.schedule import MAX_AGGREGATE, MAX_SMEM

    assert MAX_AGGREGATE == codegen.TMAT_MAX == 2 * codegen.TMAT_BLOCKED_MAX
    sizes = [codegen.tmat_shared_bytes(a) for a in range(1, codegen.TMAT_MAX + 1)]
    assert max(sizes) == sizes[-1] == codegen.tmat_kernel().shared_bytes <= MAX_SMEM
    assert all(x <= y for x, y in zip(sizes, sizes[1:]))
    assert codegen.tmat_shared_bytes(codegen.TMAT_BLOCKED_MAX) == 4 * (128 * (132 + 132) + 96 * 36)
    with pytest.raises(ValueError, match="1 to 256"):
        codegen.tmat_shared_bytes(codegen.TMAT_MAX + 1)


def _signature(source: str, name: str) -> tuple:
    """The ctypes of kernel `name`'s parameters as its rendered source declares them."""
    import ctypes
    import re

    match = re.search(r'extern "C" __global__ void[^(]*(?:\([^)]*\)[^(]*)*?\b' + name + r"\(([^)]*)\)", source)
    assert match, name
    kinds = []
    for param in match.group(1).split(","):
        words = param.replace("*", " * ").split()
        kinds.append(ctypes.c_uint64 if "*" in words else ctypes.c_int64 if words.count("long") == 2
                     else ctypes.c_uint32 if "unsigned" in words else ctypes.c_int32 if "int" in words
                     else ctypes.c_float if "float" in words else None)
    return tuple(kinds)


def test_packed_launch_arguments_match_the_kernels_signatures():
    """The runtime packs each kernel's arguments by a tuple of ctypes (runtime._PANEL_PARAMS and the like) that the
    driver copies by size: every tuple has the count, order and widths of the parameters its kernels declare (a
    mismatch would read the wrong bytes on the GPU, with no error)."""
    from qrgen import runtime
    from qrgen.schedule import Precision

    expected = {"rows": runtime._PANEL_PARAMS, "lanes": runtime._PANEL_PARAMS, "warp": runtime._PANEL_PARAMS,
                "cols": runtime._PANEL_PARAMS, "tsqr": runtime._TSQR_PARAMS, "tmat": runtime._TMAT_PARAMS,
                "gemm3": runtime._GEMM3_PARAMS, "scale": runtime._SCALE_PARAMS, "fused": runtime._FUSED_PARAMS,
                "project": runtime._SPLIT_PROJECT_PARAMS, "update": runtime._SPLIT_UPDATE_PARAMS}
    schedules = [
        Schedule(256, 256, tuple(Panel(32, "rows", 64) for _ in range(8)), Precision("fp32", "tf32x3", "tf32x3"),
                 aggregate=128, panel_update="fused"),
        Schedule(256, 256, tuple(Panel(16, "lanes", 128) for _ in range(16)), Precision("fp16", "fp32", "fp16"),
                 aggregate=64, panel_update="split"),
        Schedule(4096, 32, (Panel(16, "tsqr", 256, tile=512), Panel(16, "tsqr", 256, tile=512))),
        Schedule(128, 128, tuple(Panel(32, "warp", 32) for _ in range(4))),
        Schedule(64, 64, (Panel(64, "cols", 256, slice=8),)),
    ]
    seen = set()
    for schedule in schedules:
        kernels = {k.name: k for k in codegen.plan(schedule)[0]}
        for rendered in codegen.render_all(schedule, "sm_90"):
            variant = kernels[rendered.name].variant
            assert _signature(rendered.source, rendered.name) == expected[variant], rendered.name
            seen.add(variant)
    assert seen == set(expected)


@needs_nvrtc
@pytest.mark.parametrize("rows,slots,blocks", [(176, 8, 1), (2048, 16, 8)])
def test_lanes_phases_script_instruments_the_current_template(rows, slots, blocks):
    # scripts/lanes_phases.py patches the rendered lanes kernel at its phase boundaries: every anchor must still be
    # there (it raises otherwise) and the instrumented kernel must compile.
    import importlib.util

    spec = importlib.util.spec_from_file_location("lanes_phases", ROOT / "scripts" / "lanes_phases.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    schedule, panel, kernel = script.panel_kernel(rows, slots, blocks)
    assert panel.blocks == blocks
    source = script.instrument(codegen.render(schedule, kernel, "sm_90").source, 32, 4 * blocks)
    assert source.count("= clock64();") == 10  # start, dots, three marks on each exchange path, update, loop end
    (binary,) = qcompile.compile_many([(kernel.name + "_phases", source)], "sm_90", use_cache=False)
    assert binary.spill_bytes == 0
    with pytest.raises(ValueError, match="template changed"):
        script.instrument("no kernel here", 32, 1)
