"""CPU layer, Metal: Apple targets and their default schedules; every Metal kernel of the default schedules of the
reference and tall shapes passes the check (launch contract, lint, clang as MSL); the check refuses what the Metal
compiler would; the rendered sources run on the CPU translation layer (threads as fibers) and pass the gates, tsqr
panels on every stress family."""
import numpy as np
import pytest

from qrgen.compile import msl
from qrgen.plan import msl as families
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed, stress
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.render.sources import render, render_all
from qrgen.schedule import apple
from qrgen.schedule.files import find
from qrgen.targets import Target

APPLE = Target.parse("apple9")
REFERENCE = [(20, 32, 32), (40, 176, 176), (40, 352, 352), (640, 512, 512), (60, 1024, 1024), (8, 2048, 2048),
             (2, 4096, 4096)]
TALL = [(1, 4096, 32), (1, 4096, 1024), (1, 8192, 512), (3, 100, 300), (1, 100000, 32), (1, 20000, 100),
        (1, 40000, 256)]


def test_apple_families_parse_and_carry_apples_limits():
    for family in ("apple7", "apple8", "apple9", "apple10"):
        t = Target.parse(family)
        assert (t.backend, t.limits.shared_bytes, t.limits.threads_per_block, t.limits.simd_width) == (
            "metal", 32768, 1024, 32)
    with pytest.raises(ValueError, match="apple9"):
        Target("metal", "apple3")


def test_metal_plans_refuse_what_metal_lacks():
    from qrgen.schedule.model import Panel, Schedule

    with pytest.raises(ValueError, match="one threadgroup"):
        plan(Schedule(64, 64, (Panel(32, "lanes", 64), Panel(32, "lanes", 64))), APPLE)
    with pytest.raises(ValueError, match="fp32"):
        from qrgen.schedule.model import Precision
        plan(Schedule(64, 64, (Panel(32, "rows", 64),) * 2, precision=Precision(update="tf32")), APPLE)
    with pytest.raises(ValueError, match="unrolled"):
        plan(Schedule(4096, 32, (Panel(16, "tsqr", 256, tile=256, loop=True),) * 2), APPLE)
    with pytest.raises(ValueError, match="rows panels \\(slice 0\\)"):
        plan(Schedule(4096, 32, (Panel(16, "tsqr", 256, tile=256, slice=2),) * 2), APPLE)


@pytest.mark.parametrize("batch,m,n", [(1, 100000, 32), (1, 20000, 100), (1, 40000, 256), (2, 4096, 4096)])
def test_tall_matrices_take_tsqr_panels_within_apples_limits(batch, m, n):
    schedule, _ = find(Problem(m, n, batch), APPLE)
    assert schedule.panels[0].variant == "tsqr"
    for keep in (False, True):
        for kernel in plan(schedule, APPLE, keep).kernels:
            if kernel.variant == "tsqr":
                assert 4 * families.panel_tg_floats(kernel, m, n) <= 32768 and kernel.threads <= 1024


@pytest.mark.parametrize("batch,m,n", REFERENCE + TALL)
def test_every_default_metal_kernel_passes_the_check(batch, m, n):
    pytest.importorskip("clang.cindex")
    schedule, _ = find(Problem(m, n, batch), APPLE)
    names = set()
    # qr's keep plan: a whole schedule keeps no reflectors, so qr takes the rows schedule (run/metal_runtime.py)
    for s, keep in ((schedule, False), (apple.panel_schedule(Problem(m, n, batch), APPLE), True)):
        for kernel in plan(s, APPLE, keep).kernels:
            if kernel.name not in names:
                names.add(kernel.name)
                msl.check(render(kernel, s, APPLE).source, kernel.name)
    assert names


def _panel_source():
    schedule, _ = find(Problem(300, 64, 2), APPLE)
    return next(r for r in render_all(schedule, APPLE) if r.name.startswith("qr_rows"))


def test_the_check_refuses_what_the_metal_compiler_would():
    pytest.importorskip("clang.cindex")
    for kernel in families.Q_KERNELS:  # Q, Q^T C and least squares from (h, tau)
        msl.check(render(kernel, None, APPLE).source, kernel.name)
    r = _panel_source()
    msl.check(r.source, r.name)
    cases = {
        "address_space": (r.source.replace("threadgroup float* red = tg;", "device float* red = h;"), "MSL"),
        "double": (r.source.replace("v[0] = fma(a, a, v[0]);", "v[0] = fma(a, a, v[0]) * 1.5;", 1), "double"),
        "tg_variable": (r.source.replace("float x[", "threadgroup float extra[4];\n  float x[", 1), "threadgroup"),
        "unknown": (r.source.replace("block_barrier();", "no_such_barrier();", 1), "MSL"),
        "signature": (r.source.replace("[[buffer(1)]]", "[[buffer(2)]]", 1), "buffer"),
    }
    for what, (source, match) in cases.items():
        with pytest.raises((ValueError, RuntimeError), match=match):
            msl.check(source, r.name)


def test_apples_limits_hold_on_every_dispatch():
    with pytest.raises(ValueError, match="32768"):
        msl.check_launch("k", 256, 8193)
    with pytest.raises(ValueError, match="1024"):
        msl.check_launch("k", 2048, 16)
    msl.check_launch("k", 1024, 8192)


@pytest.mark.parametrize("batch,m,n", [(20, 32, 32), (8, 64, 64), (4, 176, 176), (1, 4096, 32), (3, 100, 300),
                                       (12, 100, 60)])
def test_metal_kernels_on_the_cpu_layer_pass_the_gates(cpu_device, batch, m, n):
    from qrgen.run import metal_engine

    a = stress("random", m, n, batch, seed=m + n)
    h, tau = metal_engine.geqrf(a, cpu_device)
    result = check(a, h, tau)
    assert result.ok, f"{batch}x{m}x{n}: {result}"


def _tsqr_schedule(m, n, width, threads, tile, aggregate=0):
    from qrgen.schedule.model import Panel, Schedule

    k = min(m, n)
    return Schedule(m, n, tuple(Panel(min(width, k - c), "tsqr", threads, tile=tile) for c in range(0, k, width)),
                    aggregate=aggregate)


# tsqr panels: the defaults of tall shapes, and forced ones with small tiles (trees of several levels, a ragged last
# tile, widths that are no multiple of 4, aggregates)
TSQR_CASES = {"4096x32": (4096, 32, None), "8192x64": (8192, 64, None), "20000x32": (20000, 32, None),
              "2048x16_tiles32": (2048, 16, _tsqr_schedule(2048, 16, 16, 32, 32)),
              "1100x40_w8_aggregates": (1100, 40, _tsqr_schedule(1100, 40, 8, 32, 64, aggregate=16)),
              "1003x21_w5": (1003, 21, _tsqr_schedule(1003, 21, 5, 32, 128))}


@pytest.mark.parametrize("case", TSQR_CASES)
def test_tsqr_panels_on_the_cpu_layer_pass_every_family(cpu_device, case):
    from qrgen.run import metal_engine

    m, n, schedule = TSQR_CASES[case]
    schedule = schedule or find(Problem(m, n, 1), APPLE)[0]
    assert schedule.panels[0].variant == "tsqr"
    a, labels = mixed(m, n, len(FAMILIES), seed=m + n)
    h, tau = metal_engine.geqrf(a, cpu_device, schedule)
    result = check(a, h, tau)
    assert result.ok, f"{case} {[l for l, p in zip(labels, result.passed) if not p]}: {result}"


def test_the_gemms_rounding_error_does_not_grow_with_the_depth(cpu_device):
    """A trailing update's depth is the panel's rows (100,000 here): the GEMM sums its products in chunks
    (plan/msl.GEMM_CHUNK; summed in one run, this error is about 180 eps)."""
    spec = families.gemm_kernel("project")
    kernel = cpu_device.load(spec.name, render(spec, None, APPLE).source)
    rng = np.random.default_rng(0)
    depth = 100000
    a, b = rng.random((32, depth), dtype=np.float32), rng.random((depth, 32), dtype=np.float32)
    c = cpu_device.empty(32 * 32)
    cpu_device.dispatch(kernel, (1, 1, 1), families.GEMM_THREADS, (a.reshape(-1), b.reshape(-1), c),
                        (32, 32, depth, depth, 0, 32, 0, 32, 0, 0, 0, 0), families.GEMM_TG_FLOATS)
    want = a.astype(np.float64) @ b
    assert np.abs(c.reshape(32, 32) - want).max() <= 32 * np.finfo(np.float32).eps * np.abs(want).max()


def test_a_mixed_hostile_batch_on_the_cpu_layer_passes_every_family(cpu_device):
    from qrgen.run import metal_engine

    a, labels = mixed(96, 80, 2 * len(FAMILIES), seed=5)
    h, tau = metal_engine.geqrf(a, cpu_device)
    result = check(a, h, tau)
    assert result.ok, f"{[l for l, p in zip(labels, result.passed) if not p]}: {result}"


@pytest.mark.parametrize("m,n,schedule", [(150, 140, None), (1100, 40, _tsqr_schedule(1100, 40, 8, 32, 64, 16))],
                         ids=["default", "tsqr"])
def test_q_and_r_on_the_cpu_layer(cpu_device, m, n, schedule):
    from qrgen.run import metal_engine

    a = stress("nearrankdef", m, n, 2, seed=2)
    q, r = metal_engine.qr(a, cpu_device, schedule)
    assert q.shape == (2, m, n) and r.shape == (2, n, n)
    assert np.abs(q @ r - a).max() <= 1e-4 * np.abs(a).max()
    assert np.abs(np.swapaxes(q, 1, 2) @ q - np.eye(n)).max() <= 1e-4


def test_a_barrier_not_every_thread_reaches_is_an_error_on_the_cpu_layer(cpu_device):
    r = _panel_source()
    broken = r.source.replace("  block_barrier();  // taus complete", "  if (t < 32) block_barrier();", 1)
    assert broken != r.source
    kernel = cpu_device.load(r.name + "_broken", broken.replace(r.name, r.name + "_broken"))
    buffers = [cpu_device.empty(300 * 64 * 2), cpu_device.empty(128), cpu_device.empty(32768),
               cpu_device.empty(32768)]
    buffers[0][...] = 1.0
    threads = int(r.name.split("_t")[1].split("_")[0])
    with pytest.raises(RuntimeError, match="deadlocked"):
        cpu_device.dispatch(kernel, (1, 1, 1), threads, buffers, [0, 300, 300, 9600, 0, 0], 4096)


def test_qrgen_build_for_an_apple_family_writes_a_module_and_its_metal_sources(tmp_path, monkeypatch, cpu_device):
    import importlib
    import sys

    from qrgen.build import build
    from qrgen.run import metal_runtime

    generated, reports = build(Problem(64, 48, 8), APPLE, tmp_path / "gen", log=lambda line: None)
    sources = sorted(p.name for p in generated.kernel_paths)
    assert sources and all(name.endswith(".metal") for name in sources)
    assert all("checked" in r.how for r in reports)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(f"gen.{generated.name}")
    assert module.ARCH == "apple9"
    monkeypatch.setattr(metal_runtime, "metal_device", lambda device=None: cpu_device)  # the layer for the Mac's
    a = stress("rankdef", 64, 48, 5, seed=4)
    h, tau = module.geqrf(a)
    assert check(a, h, tau).ok
    q, r = module.qr(a)
    assert np.abs(q @ r - a).max() <= 1e-4 * np.abs(a).max()
    x, res = module.lstsq(a[:, :, :40] + np.eye(64, 40, dtype=np.float32), a[..., 0])
    assert x.shape == (5, 40) and res.shape == (5,)
    sys.modules.pop(f"gen.{generated.name}", None)


def test_the_metal_runtime_keeps_factorizers_and_returns_the_inputs_kind(cpu_device):
    from qrgen.run import metal_runtime

    a = stress("colscaled", 40, 40, 6, seed=9).reshape(2, 3, 40, 40)
    h, tau = metal_runtime.geqrf(a, cpu_device)
    h2, tau2 = metal_runtime.geqrf(a, cpu_device)
    assert isinstance(h, np.ndarray) and h.shape == a.shape and tau.shape == (2, 3, 40)
    assert np.array_equal(h, h2) and np.array_equal(tau, tau2)
    assert check(a, h, tau).ok
    r = metal_runtime.qr(a, "r", cpu_device)
    assert r.shape == (2, 3, 40, 40)
    with pytest.raises(ValueError, match="mode"):
        metal_runtime.qr(a, "raw", cpu_device)
    with pytest.raises(TypeError, match="float32"):
        metal_runtime.geqrf(a.astype(np.float64), cpu_device)
    assert not metal_runtime.takes(a)  # NumPy arrays go to the Metal runtime only when a device is given


@pytest.mark.parametrize("m,n", [(64, 48), (100, 70), (30, 50)])
def test_q_functions_and_lstsq_on_the_cpu_layer(cpu_device, m, n):
    from qrgen.run import metal_runtime as mr

    a = stress("nearrankdef" if m > n else "random", m, n, 3, seed=m)
    h, tau = mr.geqrf(a, cpu_device)
    k = min(m, n)
    q = mr.householder_product(h, tau, False, cpu_device)
    assert np.abs(q @ np.triu(h[:, :k, :]) - a).max() <= 1e-4 * np.abs(a).max()
    assert np.abs(np.swapaxes(q, 1, 2) @ q - np.eye(k)).max() <= 1e-4
    qc = mr.householder_product(h, tau, True, cpu_device)
    c, cr = stress("random", m, 5, 3, seed=2), stress("random", 5, m, 3, seed=3)
    for transpose in (False, True):
        op = np.swapaxes(qc, 1, 2) if transpose else qc
        assert np.abs(mr.ormqr(h, tau, c, "L", transpose, cpu_device) - op @ c).max() <= 1e-4
        assert np.abs(mr.ormqr(h, tau, cr, "R", transpose, cpu_device) - cr @ op).max() <= 1e-4
    if m >= n:
        a = stress("random", m, n, 3, seed=5)
        b = stress("random", m, 2, 3, seed=4)
        x, res = mr.lstsq(a, b, cpu_device)
        want = np.stack([np.linalg.lstsq(a[i].astype(np.float64), b[i].astype(np.float64), rcond=None)[0]
                         for i in range(3)])
        assert np.abs(x - want).max() <= 1e-3 * np.abs(want).max()
        assert np.allclose(res, ((a.astype(np.float64) @ x - b) ** 2).sum(1), rtol=1e-3, atol=1e-5)
        with pytest.raises(ValueError, match="m >= n"):
            mr.lstsq(np.swapaxes(a, 1, 2).copy(), b[:, :n], cpu_device)
