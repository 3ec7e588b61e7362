"""GPU layer: qr (every mode), lstsq, householder_product and ormqr on the GPU: Q from h and tau (blocked,
tf32x3 products by default), from the fused Q kernel (one launch) and from the factorization's kept panels or
aggregates (keep plans), against the gates on every stress family."""
import numpy as np
import pytest

import qrgen
from gates import q_gates
from gpu_cases import EPS32, aggregated_schedule, geqrf_checked
from qrgen import api
from qrgen.numerics import qmatrix
from qrgen.numerics.stress import FAMILIES, mixed, stress
from qrgen.plan import tf32x3
from qrgen.run import cuda_engine, device_ops
from qrgen.run.factorizer import Factorizer
from qrgen.run.launch import device_target
from qrgen.run.registry import factorizer_for
from qrgen.targets import Target

pytestmark = pytest.mark.gpu

SM90 = Target("cuda", "sm_90")


@pytest.mark.parametrize("batch,m,n", [(20000, 32, 32), (20, 32, 32), (40, 176, 176), (40, 352, 352), (6, 300, 120),
                                       (1000, 48, 48), (2000, 64, 32),  # a wide lanes kernel, a whole one
                                       pytest.param(640, 512, 512, marks=pytest.mark.slow),
                                       pytest.param(60, 1024, 1024, marks=pytest.mark.slow),
                                       pytest.param(8, 2048, 2048, marks=pytest.mark.slow),
                                       pytest.param(2, 4096, 4096, marks=pytest.mark.slow)])
def test_qr_reduced_and_lstsq_every_family(batch, m, n):
    """The Q issue's acceptance: qr (reduced) and lstsq on the seven reference batches and 20,000 x 32²; also two
    shapes whose default is one kernel a matrix, a wide lanes panel and a whole kernel (no keep plan: Q from h and
    tau)."""
    import cupy

    checked = min(batch, 64 if m * n <= 1 << 18 else 2)  # the float64 gates run on the host
    for family in FAMILIES:
        a = stress(family, m, n, checked, seed=m)
        q, r = qrgen.qr(cupy.asarray(a))
        factor, orth = q_gates(a, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (family, factor.max(), orth.max())
    big = cupy.random.standard_normal((batch, m, n), dtype=cupy.float32)
    q, r = qrgen.qr(big, mode="reduced")
    assert q.shape == (batch, m, min(m, n)) and r.shape == (batch, min(m, n), n)
    if m >= n:
        a = stress("random", m, n, 4, seed=1)
        b = np.random.default_rng(0).standard_normal((4, m)).astype(np.float32)
        # precision=None: the schedule's (tf32 aggregate products from 2048 columns: backward ratio ~1-2 measured);
        # "fp32": every product in fp32 (ratio ~0.005 measured at 2048² and 4096², like torch's 0.003).
        for precision, limit in ((None, 20), ("fp32", 0.1)):
            x, res = qrgen.lstsq(cupy.asarray(a), cupy.asarray(b), precision=precision)
            x, res = x.get().astype(np.float64), res.get()
            for i in range(4):
                a64, b64 = a[i].astype(np.float64), b[i].astype(np.float64)
                # Backward error on the factor gate's scale: the normal equations' residual against the sizes of
                # a, x and b in units of eps32 (x from a + E with ||E||_1 = f n eps32 ||a||_1 gives about f here).
                r = b64 - a64 @ x[i]
                norm_a = np.linalg.norm(a64)
                ratio = np.linalg.norm(a64.T @ r) / (norm_a * (norm_a * np.linalg.norm(x[i]) + np.linalg.norm(b64))
                                                      * EPS32)
                assert ratio <= limit, (precision, ratio)
                if m > n:  # the residual of a square system is zero
                    assert np.isclose(res[i], r @ r, rtol=1e-2), (res[i], r @ r)
                if m * n <= 1 << 18:  # the forward error where random matrices are well conditioned (at 2048² it is
                    # cond(a) x backward error for any float32 solver: benchmarks/journal/, 2026-11-30)
                    xn = np.linalg.lstsq(a64, b64, rcond=None)[0]
                    assert np.abs(x[i] - xn).max() <= 1e-3 * max(1.0, np.abs(xn).max())


@pytest.mark.parametrize("batch,m,n", [(20, 32, 32), (3, 100, 20), (2, 40, 1), (5, 257, 32)])
def test_qr_fused_q_kernel_every_family(batch, m, n):
    """Shapes whose schedule is one lanes panel with nothing right of it: qr (reduced) is one launch writing Q and R;
    every stress family passes the Q gates, R matches geqrf's, and a non-contiguous input gives the same result."""
    import cupy

    assert factorizer_for(m, n, batch, device_target(0)).fused_q is not None
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=m + n)
        q, r = qrgen.qr(cupy.asarray(a))
        assert q.shape == (batch, m, n) and r.shape == (batch, n, n)
        factor, orth = q_gates(a, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (family, factor.max(), orth.max())
        h, _ = qrgen.geqrf(cupy.asarray(a))
        np.testing.assert_allclose(r.get(), np.triu(h.get()[:, :n, :]), rtol=1e-5, atol=1e-6 * max(1.0, abs(a).max()))
    a = stress("random", m, n, batch, seed=3)
    wide = cupy.zeros((batch, m, 2 * n), dtype=cupy.float32)
    wide[:, :, ::2] = cupy.asarray(a)
    q1, r1 = qrgen.qr(cupy.asarray(a))
    q2, r2 = qrgen.qr(wide[:, :, ::2])
    assert cupy.array_equal(q1, q2) and cupy.array_equal(r1, r2)
    torch = pytest.importorskip("torch")
    qt, rt = qrgen.qr(torch.as_tensor(a, device="cuda"))  # torch in, torch out, the same numbers
    assert isinstance(qt, torch.Tensor) and cupy.array_equal(cupy.from_dlpack(qt), q1)
    assert cupy.array_equal(cupy.from_dlpack(rt), r1)
    if batch > 1:  # a NaN in one matrix leaves the others as they were
        bad = a.copy()
        bad[0, m // 2, n // 2] = np.nan
        q3, r3 = qrgen.qr(cupy.asarray(bad))
        assert cupy.array_equal(q3[1:], q1[1:]) and cupy.array_equal(r3[1:], r1[1:])


def test_ormqr_and_householder_product_torch():
    torch = pytest.importorskip("torch")
    a = torch.randn(3, 50, 30, device="cuda")
    h, tau = qrgen.geqrf(a)
    q = qrgen.householder_product(h, tau, complete=True)
    assert isinstance(q, torch.Tensor) and q.shape == (3, 50, 50)
    ref = torch.linalg.householder_product(h.double(), tau.double())
    assert torch.allclose(q[..., :30].double(), ref, atol=1e-4)
    c = torch.randn(3, 50, 4, device="cuda")
    out = qrgen.ormqr(h, tau, c, side="L", transpose=True)
    assert torch.allclose(out.double(), q.double().transpose(-1, -2) @ c.double(), atol=1e-4)
    # torch.ormqr's own keywords: left=False is C op(Q)
    d = torch.randn(3, 4, 50, device="cuda")
    ref = torch.ormqr(h, tau, d, left=False, transpose=False)
    assert torch.allclose(qrgen.ormqr(h, tau, d, left=False).double(), ref.double(), atol=1e-4)
    assert torch.allclose(qrgen.ormqr(h, tau, c, left=True, transpose=True), out)


@pytest.mark.parametrize("batch,m,n,kept", [(6, 300, 120, True), (3, 90, 130, True), (40, 176, 176, False)])
def test_qr_complete_and_reduced_from_kept_panels(batch, m, n, kept):
    """qr's Q from the factorization's own panels (keep plans, run.sequence.drive_q): both modes on every family,
    and the same Q as qrgen.numerics.qmatrix's blocked product of the same h and tau. The 176² file's one cols panel
    over every column has no keep plan (its T and (VT)^T would not fit its shared memory): Q from h and tau."""
    import cupy

    assert (factorizer_for(m, n, batch, SM90).keep_variant() is not None) == kept
    for family in FAMILIES:
        a = stress(family, m, n, batch, seed=n)
        for mode in ("reduced", "complete"):
            q, r = qrgen.qr(cupy.asarray(a), mode=mode)
            assert q.shape == (batch, m, m if mode == "complete" else min(m, n))
            factor, orth = q_gates(a, q.get(), r.get())
            assert (factor <= 20).all() and (orth <= 100).all(), (family, mode, factor.max(), orth.max())
    a = cupy.asarray(stress("random", m, n, batch, seed=3))
    h, tau = qrgen.geqrf(a)
    q, _ = qrgen.qr(a)
    assert float(cupy.abs(q - qmatrix.householder_product(h, tau)).max()) <= 1e-4


def _qr_modes_pass_every_family(fac, batch, seed):
    """qr through `fac` (its keep plan) in both modes passes the Q gates on `batch` matrices of every family."""
    import cupy

    for family in FAMILIES:
        a = stress(family, fac.m, fac.n, batch, seed=seed)
        for mode in ("reduced", "complete"):
            q, r = qrgen.qr(cupy.asarray(a), mode=mode, factorizer=fac)
            factor, orth = q_gates(a, q.get(), r.get())
            assert (factor <= 20).all() and (orth <= 100).all(), (family, mode, factor.max(), orth.max())


def test_qr_of_a_reach_schedule():
    """qr through the keep plan of a schedule with reach (each aggregate's merge and products on the side lane,
    merged for Q all the same): both modes pass the gates on every family, and Q is qrgen.numerics.qmatrix's of the
    same h and tau."""
    import cupy

    m, n = 600, 520
    fac = Factorizer(m, n, aggregated_schedule(m, n, 32, 128, "fused", 32, reach=True), SM90)
    assert fac.keep_variant() is not None and any(g.c1 > g.a1 for g in fac.keep_variant().aggregates)
    _qr_modes_pass_every_family(fac, 2, seed=12)
    a = cupy.asarray(stress("random", m, n, 3, seed=3))
    h, tau = fac(a)
    q, _ = qrgen.qr(a, factorizer=fac)
    assert float(cupy.abs(q - qmatrix.householder_product(h, tau)).max()) <= 1e-4


def test_qr_q_products_of_kept_aggregates_in_tf32x3(monkeypatch):
    """qr's Q through a keep plan with aggregates of 128 on a schedule whose own products are fp32 (its tf32x3
    project and update kernels the keep plan's alone): the tf32x3 kernels take every Q product
    (plan.tf32x3.q_precision), every family passes the gates in both modes, and Q is qrgen.numerics.qmatrix's of
    the same h and tau to fp32 accuracy."""
    import cupy

    launched = []  # per tf32x3 product: whether a tf32x3 kernel took it
    tf32x3_gemm = cuda_engine.CudaEngine.tf32x3_gemm
    monkeypatch.setattr(cuda_engine.CudaEngine, "tf32x3_gemm",
                        lambda self, *args: launched.append(tf32x3_gemm(self, *args)) or launched[-1])
    m = n = 512
    fac = Factorizer(m, n, aggregated_schedule(m, n, 32, 128, "fused", 2), SM90)
    own = {k.name for k in fac.kernels if k.variant == "tf32x3"}
    assert own <= {tf32x3.name("gram")}  # at most the gram kernel, for an fp32 G (plan.tf32x3.kinds)
    assert {tf32x3.name("project"), tf32x3.name("update")} <= {k.name for k in fac.keep_variant().kernels}
    _qr_modes_pass_every_family(fac, 3, seed=11)
    # every Q product aligned and at least 64 in each dimension: none falls back to cuBLAS
    assert launched and all(launched)
    a = cupy.asarray(stress("random", m, n, 4, seed=3))
    h, tau = fac(a)
    q, _ = qrgen.qr(a, factorizer=fac)
    assert float(cupy.abs(q - qmatrix.householder_product(h, tau)).max()) <= 1e-4


def test_tsqr_default_and_qr_on_tsqr_schedules():
    """The heuristic's tsqr panels for a tall matrix without a schedule file, and qrgen.qr (its Q from the kept
    panels) and lstsq on the committed tsqr schedule of 100000 x 32."""
    import cupy

    assert {p.variant for p in factorizer_for(40000, 64, 2, SM90).schedule.panels} == {"tsqr"}
    assert {p.variant for p in factorizer_for(100000, 32, 1, SM90).schedule.panels} == {"tsqr"}
    for family in FAMILIES:
        a = stress(family, 40000, 64, 2, seed=4)
        assert geqrf_checked(a).ok, family
        a = stress(family, 100000, 32, 1, seed=5)
        q, r = qrgen.qr(cupy.asarray(a))
        factor, orth = q_gates(a, q.get(), r.get())
        assert (factor <= 20).all() and (orth <= 100).all(), (family, factor.max(), orth.max())
    a = stress("random", 100000, 32, 1, seed=6)
    b = np.random.default_rng(1).standard_normal((1, 100000)).astype(np.float32)
    x, _ = qrgen.lstsq(cupy.asarray(a), cupy.asarray(b))
    xn = np.linalg.lstsq(a[0].astype(np.float64), b[0].astype(np.float64), rcond=None)[0]
    assert np.abs(x.get()[0] - xn).max() <= 1e-3 * max(1.0, np.abs(xn).max())


def test_householder_product_in_tf32x3(monkeypatch):
    """qmatrix.householder_product(precision="tf32x3"): the tf32x3 kernels take its wide products (blocks of 128
    and 256), Q passes the gates on every family and stays within fp32's Q's accuracy."""
    import cupy

    taken = []  # per tf32x3 product the Q functions ask the GPU for: whether a tf32x3 kernel took it
    tf32x3_matmul = device_ops.CupyOps.tf32x3
    monkeypatch.setattr(device_ops.CupyOps, "tf32x3",
                        staticmethod(lambda *args: taken.append(tf32x3_matmul(*args)) or taken[-1]))
    a, labels = mixed(512, 512, len(FAMILIES), seed=21)
    h, tau = qrgen.geqrf(cupy.asarray(a))
    r = np.triu(h.get())
    for block in (128, 256):
        q32 = qmatrix.householder_product(h, tau, block=block)
        q3 = qmatrix.householder_product(h, tau, block=block, precision="tf32x3")
        assert any(taken)
        taken.clear()
        f3, o3 = q_gates(a, q3.get(), r)
        f32, o32 = q_gates(a, q32.get(), r)
        assert (f3 <= 20).all() and (o3 <= 100).all(), (labels, f3, o3)
        # The tensor cores' fp32 sums do not round to nearest: measured on the H200 at 512^2, orthogonality 1.3 to
        # 1.8 against fp32's 0.3 to 0.5 (4.1 at 4096^2), a tenth of the gate at most.
        assert o3.max() <= 10 and float(cupy.abs(q3 - q32).max()) <= 1e-4, (o3, o32, cupy.abs(q3 - q32).max())


def test_q_precision_of_qr_and_householder_product(monkeypatch):
    """qr's Q (where no keep plan forms it) and qrgen.householder_product take the tf32x3 kernels by default and
    none with precision="fp32"."""
    import cupy

    taken = []
    tf32x3_matmul = device_ops.CupyOps.tf32x3
    monkeypatch.setattr(device_ops.CupyOps, "tf32x3",
                        staticmethod(lambda *args: taken.append(tf32x3_matmul(*args)) or taken[-1]))
    monkeypatch.setattr(api, "keeps_q", lambda *args: False)
    monkeypatch.setenv("QRGEN_REPLAY", "0")
    a = cupy.asarray(np.random.default_rng(3).standard_normal((2, 384, 384), dtype=np.float32))
    h, tau = qrgen.geqrf(a)
    for precision in (None, "fp32"):
        for call in (lambda: qrgen.qr(a, precision=precision)[0],
                     lambda: qrgen.householder_product(h, tau, precision=precision)):
            q = call()
            assert any(taken) == (precision is None)
            taken.clear()
            assert float(cupy.abs(q.transpose(0, 2, 1) @ q - cupy.eye(384)).max()) <= 1e-4
