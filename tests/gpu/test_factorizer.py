"""GPU layer: Factorizers of explicit schedules against the gates on every stress family: each panel variant
(cols, lanes, rows on clusters, column loops, tsqr, whole), aggregates with each panel update, lookahead and
reach, tf32x3 and fp16 products (with the power-of-two scaling), and the committed fp16 schedules."""
import dataclasses

import numpy as np
import pytest

from gpu_cases import aggregated_schedule, geqrf_checked
from kernel_cases import COLS_SCHEDULES, LANES_SCHEDULES
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed, stress
from qrgen.plan import planner
from qrgen.run import cuda_engine
from qrgen.run.factorizer import Factorizer
from qrgen.run.registry import factorizer_for
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.schedule.panels import cluster_panel, default_panel, with_loop
from qrgen.targets import Target

pytestmark = pytest.mark.gpu

SM90 = Target("cuda", "sm_90")


@pytest.mark.parametrize("variant,index", [("cols", i) for i in range(len(COLS_SCHEDULES))]
                         + [("lanes", i) for i in range(len(LANES_SCHEDULES))])
def test_block_variants_every_family(variant, index):
    """The cols panel kernel (warps own column slices, mbarrier per reflector; on one block or clusters of 2 to 8)
    and the lanes panel kernel (lane c owns column c, warps own row ranges; on clusters of 8, 4, 2 and 16 blocks, one
    on one warp with its loop over columns unrolled) through explicit schedules."""
    import cupy

    schedule = (COLS_SCHEDULES if variant == "cols" else LANES_SCHEDULES)[index]
    fac = Factorizer(schedule.m, schedule.n, schedule, SM90)
    for family in FAMILIES:
        a = stress(family, schedule.m, schedule.n, 3, seed=index)
        h, tau = fac(cupy.asarray(a))
        result = check(a, h, tau)
        assert result.ok, f"{family} {schedule.describe()}: {result}"


@pytest.mark.parametrize("panel_update,lookahead,reach", [
    ("cublas", 0, False), ("rowsplit", 0, False), ("rowsplit", 32, False), ("cublas", 1, False),
    ("fused", 0, False), ("fused", 2, False), ("fused", 32, True), ("cublas", 2, True), ("rowsplit", 1, True)])
@pytest.mark.parametrize("m,n,width,aggregate", [(256, 256, 32, 128), (300, 200, 16, 64), (200, 330, 32, 96),
                                                 (1024, 1024, 32, 256), (2000, 300, 8, 128)])
def test_aggregated_schedules_every_family(m, n, width, aggregate, panel_update, lookahead, reach):
    """Panels update their aggregate's columns (with reach, the next aggregate's too); each aggregate's merged WY
    form updates the rest (rank-A); the panels' own products through cuBLAS, the rowsplit kernels or the fused
    kernel; with lookahead, on two streams (with reach, the merges on the side one)."""
    import cupy

    schedule = aggregated_schedule(m, n, width, aggregate, panel_update, lookahead, reach)
    fac = Factorizer(m, n, schedule, SM90)
    for family in FAMILIES:
        a = stress(family, m, n, 3, seed=aggregate)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"


@pytest.mark.parametrize("m,n,blocks,aggregate,batch,slots", [(8192, 64, 8, 0, 1, 4), (2000, 300, 4, 128, 2, 4),
                                                              (1024, 1024, 8, 128, 2, 4), (600, 600, 2, 0, 3, 4),
                                                              (4096, 96, 8, 0, 1, 1), (2048, 2048, 8, 128, 2, 2),
                                                              (4096, 64, 16, 0, 2, 1)])
def test_cluster_panels_every_family(m, n, blocks, aggregate, batch, slots):
    """Rows panels on a thread-block cluster (partial sums through the blocks' shared memory), with up to `slots`
    rows per thread."""
    import cupy

    k = min(m, n)
    panels, col = [], 0
    while col < k:
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        panels.append(cluster_panel(m - col, min(32, end - col), blocks, slots) or default_panel(m - col, end - col))
        col += panels[-1].width
    schedule = Schedule(m, n, tuple(panels), aggregate=aggregate, panel_update="rowsplit" if aggregate else "cublas")
    assert any(p.cluster for p in schedule.panels)
    fac = Factorizer(m, n, schedule, SM90)
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=blocks)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"


@pytest.mark.parametrize("m,n,aggregate,batch,blocks", [(300, 200, 0, 3, 0), (100, 64, 0, 5, 0), (8192, 64, 0, 1, 0),
                                                        (8192, 64, 0, 1, 8), (1024, 1024, 128, 2, 0),
                                                        (2000, 300, 128, 2, 4), (40, 100, 0, 3, 0)])
def test_column_loop_panels_every_family(m, n, aggregate, batch, blocks):
    """Warp and rows panels with the column loop not unrolled (Panel.loop): one block, several blocks with flags,
    a cluster, aggregates, wide matrices."""
    import cupy

    k = min(m, n)
    panels, col = [], 0
    while col < k:
        end = k if not aggregate else min(k, (col // aggregate + 1) * aggregate)
        panel = (cluster_panel(m - col, min(32, end - col), blocks) if blocks else None) or default_panel(m - col,
                                                                                                          end - col)
        panels.append(with_loop(panel, True))
        col += panel.width
    schedule = Schedule(m, n, tuple(panels), aggregate=aggregate, panel_update="rowsplit" if aggregate else "cublas")
    # (panels of at most 32 rows are lanes panels on one warp, whose loop is their own)
    assert all(p.loop for p in schedule.panels if p.variant != "lanes") and schedule.panels[0].loop
    fac = Factorizer(m, n, schedule, SM90)
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=m + n)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"


@pytest.mark.parametrize("m,n,batch,panels,aggregate", [
    (3000, 48, 1, ((16, 64, 256, False),) * 3, 0),
    (5000, 96, 2, ((32, 128, 256, False),) * 3, 64),
    (20000, 40, 1, ((16, 256, 512, True),) * 2 + ((8, 256, 512, True),), 0),
    (700, 100, 3, ((32, 64, 128, True),) * 3 + ((4, 64, 128, False),), 0),
    (256, 300, 2, ((32, 64, 128, False),) * 8, 128),
    (3000, 37, 2, ((16, 128, 256, True),) * 2 + ((5, 64, 128, False),), 0),
], ids=["3000x48", "5000x96-aggregates", "20000x40-loop", "700x100", "256x300-wide", "3000x37-odd-width"])
def test_tsqr_panels_every_family(m, n, batch, panels, aggregate):
    """tsqr panels (a tree of QRs over row tiles, reflectors rebuilt from Q): one to three levels, with and without
    the columns right of them, aggregates, column loops, a tree of one tile, wide matrices."""
    import cupy

    schedule = Schedule(m, n, tuple(Panel(w, "tsqr", t, tile=tile, loop=loop) for w, t, tile, loop in panels),
                        aggregate=aggregate)
    fac = Factorizer(m, n, schedule, SM90)
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=m + n)
        h, tau = fac(cupy.asarray(a))
        assert check(a, h, tau).ok, f"{family} {schedule.describe()}"
    a, _ = mixed(m, n, max(batch, 4), seed=2)
    assert check(a, *fac(cupy.asarray(a))).ok


@pytest.mark.parametrize("m,n,threads,slice_,loop", [(48, 48, 32, 4, False), (64, 64, 64, 8, False),
                                                     (64, 32, 32, 4, False), (130, 100, 128, 16, True),
                                                     (100, 130, 128, 16, False), (33, 33, 64, 8, False),
                                                     (176, 176, 256, 8, True), (96, 96, 128, 8, False)])
def test_whole_kernel_every_family(m, n, threads, slice_, loop):
    """The whole factorization in one kernel per matrix (Panel variant "whole"): square, tall, wide, min(m, n) no
    multiple of the panels' width, shared memory past 48 KiB with the panels' state (96², 128 threads), on every
    stress family; a NaN in one matrix leaves the others as they were."""
    import cupy

    fac = Factorizer(m, n, Schedule(m, n, (Panel(min(m, n), "whole", threads, slice=slice_, loop=loop),)), SM90)
    for family in FAMILIES:
        a = stress(family, m, n, 5, seed=m + n)
        result = geqrf_checked(a, fac)
        assert result.ok, f"{family} {fac.schedule.describe()}: {result}"
    a = stress("random", m, n, 6, seed=1)
    h_clean, _ = fac(cupy.asarray(a))
    a[3, m // 2, n // 3] = np.nan
    h, _ = fac(cupy.asarray(a))
    keep = [0, 1, 2, 4, 5]
    assert np.array_equal(cupy.asnumpy(h)[keep], cupy.asnumpy(h_clean)[keep])
    assert np.isnan(cupy.asnumpy(h)[3]).any()


def _answers(monkeypatch, method):
    """The answers of CudaEngine.<method> (whether its kernel took the product), appended as the calls come."""
    answers, original = [], getattr(cuda_engine.CudaEngine, method)
    monkeypatch.setattr(cuda_engine.CudaEngine, method,
                        lambda self, *args: answers.append(original(self, *args)) or answers[-1])
    return answers


@pytest.mark.parametrize("m,n,aggregate,lookahead", [(512, 512, 128, 2), (300, 200, 64, 0), (257, 255, 64, 2)])
def test_tf32x3_products(m, n, aggregate, lookahead, monkeypatch):
    """The aggregates' products as three tf32 products (the tf32x3 kernels; 257 x 255 is not 16-byte aligned and
    falls back to cuBLAS in fp32, as the panels' thin products always do): every stress family passes the gates,
    close to the fp32 schedule's result."""
    import cupy

    launched = _answers(monkeypatch, "tf32x3_gemm")  # per tf32x3 product: whether a tf32x3 kernel took it
    fp32 = aggregated_schedule(m, n, 32, aggregate, "cublas", lookahead)
    split3 = dataclasses.replace(fp32, precision=Precision("fp32", "tf32x3", "tf32x3"))
    fac, ref = Factorizer(m, n, split3, SM90), Factorizer(m, n, fp32, SM90)
    assert any(k.variant == "tf32x3" for k in fac.kernels)
    a, _ = mixed(m, n, 2 * len(FAMILIES), seed=9)
    h, tau = fac(cupy.asarray(a))
    report = check(a, h, tau)
    assert report.ok, str(report)
    # the aggregates' products where every operand is 16-byte aligned; never a panel's thin ones (cuBLAS)
    assert launched and any(launched) == (m % 4 == 0 and n % 4 == 0) and not all(launched)
    b = cupy.asarray(stress("random", m, n, 4, seed=2))
    assert float(cupy.abs(fac(b)[0] - ref(b)[0]).max()) <= 1e-3 * float(cupy.abs(b).max())


@pytest.mark.parametrize("m,n,project", [(512, 512, "tf32"), (384, 640, "fp32"), (352, 352, "tf32x3")])
def test_t_late(m, n, project, monkeypatch):
    """Aggregates whose projection runs beside G and T on the side stream, then W = T^T (V^T C) (plan t_late: no
    (VT)^T): every stress family passes the gates, eagerly and as a CUDA-graph replay (the two streams captured), and
    R is the (VT)^T path's, up to its rows' signs, to the projection's accuracy."""
    import cupy

    schedule = dataclasses.replace(aggregated_schedule(m, n, 32, 128, "cublas", 0),
                                   precision=Precision("fp32", project, "tf32x3"))
    fac = Factorizer(m, n, schedule, SM90)
    assert fac.plan.t_late and fac.plan.t_late == tuple(i for i, a in enumerate(fac.aggregates) if a.nc > 0)
    a, _ = mixed(m, n, 2 * len(FAMILIES), seed=6)
    report = geqrf_checked(a, fac)
    assert report.ok, str(report)
    x = cupy.asarray(a)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fac(x)  # this stream's workspace, before the capture
        stream.synchronize()
        stream.begin_capture()
        h, tau = fac(x)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    assert check(a, h, tau).ok
    monkeypatch.setattr(planner, "t_late", lambda *args, **kwargs: False)
    ref = Factorizer(m, n, schedule, SM90)
    assert not ref.plan.t_late
    b = cupy.asarray(stress("random", m, n, 4, seed=2))
    # R's rows are unique up to sign: a tf32 rounding may flip a reflector's sign where its pivot is small
    r, r_ref = (cupy.abs(cupy.triu(f(b)[0])) for f in (fac, ref))
    tol = 1e-2 if project == "tf32" else 1e-4
    assert float(cupy.abs(r - r_ref).max()) <= tol * float(cupy.abs(b).max()) * m ** 0.5


@pytest.mark.parametrize("m,n,aggregate,lookahead", [(512, 512, 64, 0), (320, 448, 128, 2), (257, 255, 64, 0)])
def test_fused_aggregate_products(m, n, aggregate, lookahead, monkeypatch):
    """aggregate_update "fused": each aggregate's two tf32x3 products in one apply3 launch (257 x 255 is not 16-byte
    aligned: the launch declines and the GEMMs run); every stress family passes the gates, and the result is the
    two-GEMM schedule's to tf32x3's accuracy."""
    import cupy

    taken = _answers(monkeypatch, "apply")
    gemm = dataclasses.replace(aggregated_schedule(m, n, 32, aggregate, "cublas", lookahead),
                               precision=Precision("fp32", "tf32x3", "tf32x3"))
    fused = dataclasses.replace(gemm, aggregate_update="fused")
    fac, ref = Factorizer(m, n, fused, SM90), Factorizer(m, n, gemm, SM90)
    assert any(k.variant == "apply3" for k in fac.kernels)
    report = geqrf_checked(mixed(m, n, 2 * len(FAMILIES), seed=9)[0], fac)
    assert report.ok, str(report)
    assert taken and all(taken) == (m % 4 == 0 and n % 4 == 0) and any(taken) == all(taken)
    b = cupy.asarray(stress("random", m, n, 4, seed=2))
    assert float(cupy.abs(fac(b)[0] - ref(b)[0]).max()) <= 1e-4 * float(cupy.abs(b).max())


@pytest.mark.parametrize("m,n,batch,aggregate,lookahead", [(1024, 1024, 3, 128, 0), (1024, 1024, 2, 256, 32)])
def test_fp16_products_at_every_scale(m, n, batch, aggregate, lookahead):
    """Schedules with fp16 product inputs scale each matrix by a power of two first (Schedule.scaled): a mixed
    batch at 2^±60 and at 1e±6 passes the gates (fp16 alone: inf past 65504, zero below 6e-8), and R of a 2^p is
    R of a times 2^p, the rest of h and tau as they were. (fp16's rounding alone fails the factor gate below
    about a thousand columns, at any scale: 300 x 200 measured 41.)"""
    import cupy

    schedule = dataclasses.replace(aggregated_schedule(m, n, 32, aggregate, "rowsplit", lookahead),
                                   precision=Precision("fp16", "fp32", "fp16"))
    assert schedule.scaled
    fac = Factorizer(m, n, schedule, SM90)
    a, labels = mixed(m, n, len(FAMILIES), seed=5)
    h0, t0 = fac(cupy.asarray(a))
    assert check(a, h0, t0).ok  # (on the GPU: h is a CuPy array)
    upper = np.zeros((m, n), dtype=bool)
    upper[:min(m, n)] = np.triu(np.ones((min(m, n), n), dtype=bool))
    upper = cupy.asarray(upper)
    for p in (60, -60):
        big = np.ldexp(a, p)
        h, t = fac(cupy.asarray(big))
        assert check(big, h, t).ok, p
        assert float(cupy.abs(h[:, ~upper] - h0[:, ~upper]).max()) <= 1e-6
        assert float(cupy.abs(t - t0).max()) <= 1e-6
        scale = float(cupy.abs(h0).max())
        assert float(cupy.abs(h[:, upper] * 2.0 ** -p - h0[:, upper]).max()) <= 1e-6 * scale
    for factor in (1e6, 1e-6):
        result = geqrf_checked((a * factor).astype(np.float32), fac)
        assert result.ok, (factor, result)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_committed_fp16_schedules_far_from_unit_scale(batch):
    """The committed 4096² schedules take fp16 products: random matrices at 1e4 (W past fp16's 65504 unscaled)
    and at 1e-6 pass the gates."""
    fac = factorizer_for(4096, 4096, batch, SM90)
    assert fac.schedule.scaled
    a = stress("random", 4096, 4096, batch, seed=11)
    for factor in (1e4, 1e-6):
        result = geqrf_checked((a * factor).astype(np.float32), fac)
        assert result.ok, (factor, result)


@pytest.mark.parametrize("panel_update,lookahead,reach,q", [
    ("cublas", 0, False, False), ("fused", 2, False, False), ("cublas", 2, True, False), ("cublas", 0, False, True)])
def test_recorded_calls_match_direct_launches(panel_update, lookahead, reach, q, monkeypatch):
    """A call's operations recorded once per workspace and replayed with each call's addresses (run/recorded.py)
    give, bit for bit, what queueing them one by one gives: calls after the first, on new inputs and outputs at new
    addresses, on one stream and on a lookahead's two (with reach, a mark between them), and a keep plan's Q."""
    import contextlib

    import cupy

    from qrgen.run.recorded import Direct
    from qrgen.run.workspace import Workspace

    recordings = []

    class Counted(cuda_engine.Recorder):
        def finish(self):
            recordings.append(len(self.ops))
            return super().finish()

    monkeypatch.setattr(cuda_engine, "Recorder", Counted)
    schedule = aggregated_schedule(300, 200, 16, 64, panel_update, lookahead, reach)
    fac = Factorizer(300, 200, schedule, SM90, keep=q)
    stream = cupy.cuda.get_current_stream()
    for seed in range(3):
        a = cupy.asarray(mixed(300, 200, 5, seed=seed)[0])
        qs = [cupy.asarray(np.broadcast_to(np.eye(300, 200, dtype=np.float32), (5, 300, 200))) for _ in range(2)]
        h, tau = fac.run(a, stream, q=qs[0] if q else None)
        ws = Workspace(fac, 5, a.device.id)
        h2, tau2 = a.copy(), cupy.empty_like(tau)
        with ws.streams.from_stream(stream) if ws.streams else contextlib.nullcontext():
            cuda_engine.queue_operations(fac, ws, a.device.id, 5, (h2.data.ptr, tau2.data.ptr, 0, qs[1].data.ptr),
                                         (False, (200, qs[1].strides[0]) if q else None), Direct(), ws.streams)
        assert cupy.array_equal(h, h2) and cupy.array_equal(tau, tau2), f"seed {seed}: {schedule.describe()}"
        assert not q or cupy.array_equal(qs[0], qs[1])
    assert len(recordings) == 1 and recordings[0] > 0  # one kind of call, recorded once
