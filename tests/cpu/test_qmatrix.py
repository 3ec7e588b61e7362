"""CPU layer: Q, Q^T C, qr's modes and least squares by qrgen.numerics.qmatrix on NumPy arrays (the GPU runs the
same code on CuPy arrays), against NumPy and the issue's float64 checks (gates.q_gates)."""
import numpy as np
import pytest

from gates import q_gates
from qrgen.numerics import numpy_api, qmatrix, reference
from qrgen.numerics.stress import FAMILIES, stress

SHAPES = [(50, 30), (30, 50), (64, 64), (5, 1), (1, 5), (100, 100)]


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("mode", ["reduced", "complete", "r", "raw"])
def test_qr_modes_match_numpy_shapes(m, n, mode):
    a = np.random.default_rng(m * n).standard_normal((2, m, n))
    ours, theirs = numpy_api.qr(a, mode), np.linalg.qr(a, mode)
    if mode == "r":
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(np.abs(ours), np.abs(theirs), atol=1e-10)
        return
    assert [x.shape for x in ours] == [x.shape for x in theirs]
    if mode in ("reduced", "complete"):
        q, r = ours
        np.testing.assert_allclose(q @ r, a, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("m,n", [(96, 96), (120, 40), (300, 260)])
def test_reduced_q_in_float32_passes_the_gates(family, m, n):
    a = stress(family, m, n, 2, seed=7)
    q, r = numpy_api.qr(a, "reduced", dtype=np.float32)
    assert q.dtype == np.float32
    factor, orth = q_gates(a, q, r)
    assert (factor <= 20).all() and (orth <= 100).all(), (factor, orth)


@pytest.mark.parametrize("side", ["L", "R"])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("m,n", [(50, 30), (30, 50)])
def test_ormqr_equals_explicit_q(side, transpose, m, n):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, m, n))
    h, tau = reference.geqrf(a)
    q = numpy_api.householder_product(h, tau, complete=True)
    op = np.swapaxes(q, -1, -2) if transpose else q
    c = rng.standard_normal((2, m, 3) if side == "L" else (2, 3, m))
    expect = op @ c if side == "L" else c @ op
    np.testing.assert_allclose(numpy_api.ormqr(h, tau, c, side, transpose), expect, atol=1e-12)
    with pytest.raises(ValueError, match="side"):
        qmatrix.apply_q(h, tau, c, "X")


def test_lstsq_matches_numpy():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 80, 20)), rng.standard_normal((3, 80, 2))
    x, res = numpy_api.lstsq(a, b)
    for i in range(3):
        xn, rn, _, _ = np.linalg.lstsq(a[i], b[i], rcond=None)
        np.testing.assert_allclose(x[i], xn, atol=1e-12)
        np.testing.assert_allclose(res[i], rn, rtol=1e-10)
    xv, resv = numpy_api.lstsq(a, b[..., 0])
    assert xv.shape == (3, 20) and resv.shape == (3,)
    with pytest.raises(ValueError, match="m >= n"):
        qmatrix.lstsq(*reference.geqrf(rng.standard_normal((1, 5, 8))), np.zeros((1, 5, 1)))


def test_solve_upper_blocks():
    rng = np.random.default_rng(3)
    r = np.triu(rng.standard_normal((2, 75, 75))) + 10 * np.eye(75)
    y = rng.standard_normal((2, 75, 4))
    np.testing.assert_allclose(r @ qmatrix.solve_upper(r, y, block=16), y, atol=1e-10)


@pytest.mark.parametrize("m,n", [(150, 130), (130, 150)])
@pytest.mark.parametrize("complete", [False, True])
def test_q_is_the_same_for_every_block_width(m, n, complete):
    """Blocks need not be the factorization's panels; the trailing-only update of Q (sorgqr's) changes nothing."""
    rng = np.random.default_rng(4)
    h, tau = reference.geqrf(rng.standard_normal((2, m, n)))
    qs = [qmatrix.householder_product(h, tau, complete, block) for block in (1, 8, 37, 128, 256)]
    for q in qs[1:]:
        np.testing.assert_allclose(q, qs[0], atol=1e-12)
    full = qmatrix.apply_q(h, tau, np.broadcast_to(np.eye(m)[:, :qs[0].shape[-1]], qs[0].shape), "L", False, 8)
    np.testing.assert_allclose(full, qs[0], atol=1e-12)
    assert [b for b in qmatrix.blocks(m, n, 64)] == [(c, min(64, min(m, n) - c)) for c in range(0, min(m, n), 64)]
    with pytest.raises(ValueError, match="block"):
        qmatrix.blocks(m, n, 300)
    with pytest.raises(ValueError, match="block"):
        qmatrix.householder_product(h, tau, complete, 0)


def test_q_block_widens_from_4096():
    assert qmatrix.q_block(2048, 2048) == qmatrix.q_block(8192, 512) == qmatrix.BLOCK == 128
    assert qmatrix.q_block(4096, 4096) == qmatrix.q_block(8192, 4096) == 256


@pytest.mark.parametrize("m,n", [(150, 130), (130, 150), (90, 90)])
def test_both_gram_paths_give_the_same_wy_forms(m, n, monkeypatch):
    """wy_forms's two ways, all blocks at once (small batches: V of every block over all m rows, one Gram product, one
    T launch) and block by block (large ones): the same V and T in either order, hence the same Q and Q^T C."""
    rng = np.random.default_rng(5)
    h, tau = reference.geqrf(rng.standard_normal((3, m, n)))
    c = rng.standard_normal((3, m, 4))
    results = []
    for below in (10**9, 0):
        monkeypatch.setattr(qmatrix, "GRAM_BATCHED_BELOW", below)
        forms = list(qmatrix.wy_forms(np, h, tau, 64))
        assert [c0 for c0, _, _ in forms] == [c0 for c0, _ in qmatrix.blocks(m, n, 64)]
        assert [c0 for c0, _, _ in qmatrix.wy_forms(np, h, tau, 64, reverse=True)] == [c0 for c0, _, _ in forms][::-1]
        results.append((forms, qmatrix.householder_product(h, tau, False, 64),
                        qmatrix.apply_q(h, tau, c, "L", True, 64)))
    (forms, *outs), (forms_b, *outs_b) = results
    for x, y in zip(outs, outs_b):
        np.testing.assert_allclose(x, y, atol=1e-12)
    for (c0, v, t), (_, vb, tb), (_, w) in zip(forms, forms_b, qmatrix.blocks(m, n, 64)):
        assert v.shape == vb.shape == (3, m - c0, w) and t.shape == tb.shape == (3, w, w)
        np.testing.assert_array_equal(v, vb)  # unit lower trapezoid from h's reflectors, either way
        np.testing.assert_allclose(t, tb, atol=1e-12)
        np.testing.assert_array_equal(v[:, w:], h[:, c0 + w:, c0:c0 + w])
        np.testing.assert_array_equal(np.triu(v[:, :w], 1), 0)
        np.testing.assert_array_equal(np.diagonal(v, axis1=1, axis2=2), 1)


@pytest.mark.parametrize("a", [129, 176, 256])
def test_t_by_halves_is_slarfts_t(a):
    """The T kernel's halves past 128 reflectors (templates/cuda/tmat.cuh.j2): T = [[T1, T12], [0, T2]] with T1, T2
    the halves' own T (from G's diagonal blocks) and T12 = -T1 G12 T2 is slarft's T of all a reflectors."""
    h, tau = reference.geqrf(stress("random", a + 40, a, 2, seed=a).astype(np.float64))
    v = np.tril(h, -1)
    v[:, np.arange(a), np.arange(a)] = 1
    g = np.swapaxes(v, 1, 2) @ v
    t = reference.tmatrix(g, tau)
    t1 = reference.tmatrix(g[:, :128, :128], tau[:, :128])
    t2 = reference.tmatrix(g[:, 128:, 128:], tau[:, 128:])
    np.testing.assert_allclose(t[:, :128, :128], t1, rtol=0, atol=1e-13)
    np.testing.assert_allclose(t[:, 128:, 128:], t2, rtol=0, atol=1e-13)
    np.testing.assert_allclose(t[:, :128, 128:], -t1 @ g[:, :128, 128:] @ t2, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(t[:, 128:, :128], 0)


@pytest.mark.parametrize("m,n", [(32, 32), (100, 20), (40, 1), (257, 32)])
def test_fused_q_formula_equals_householder_product(m, n):
    """The fused Q kernel's algebra (templates/cuda/panel_lanes.cuh.j2, FORMQ): with V unit lower triangular
    (m x n), T from G = V^T V and tau, and V1 V's top n rows, Q = I - (V T) V1^T, each lane c summing
    (V T)[r][k] V[c][k] over k <= c; it must equal the blocked householder_product."""
    a = stress("random", m, n, 3, seed=n).astype(np.float64)
    h, tau = reference.geqrf(a)
    v = np.tril(h, -1)
    v[:, np.arange(n), np.arange(n)] = 1
    t = reference.tmatrix(np.swapaxes(v, 1, 2) @ v, tau)
    z = v @ t
    q = np.eye(m, n)[None] - z @ np.swapaxes(v[:, :n, :], 1, 2)
    np.testing.assert_allclose(q, qmatrix.householder_product(h, tau), atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_q_products_in_tf32x3_keep_fp32s_accuracy(family, monkeypatch):
    """householder_product's two products per block in tf32x3 (NumPy: reference.product's rounding, as the tf32x3
    kernels split their inputs): Q passes the gates and stays within 0.5 of fp32's Q on both, in blocks of 128
    and 256; the Gram matrices and T stay fp32."""
    a = stress(family, 300, 300, 2, seed=4)
    h, tau = reference.geqrf(a, dtype=np.float32)
    asked = []
    product = reference.product
    monkeypatch.setattr(reference, "product", lambda x, y, p: asked.append(p) or product(x, y, p))
    for block in (128, 256):
        q32 = qmatrix.householder_product(h, tau, block=block)
        assert not asked  # fp32: NumPy's own products
        q3 = qmatrix.householder_product(h, tau, block=block, precision="tf32x3")
        assert asked and set(asked) == {"tf32x3"}
        asked.clear()
        r = np.triu(h[:, :300])
        f32, o32 = q_gates(a, q32, r)
        f3, o3 = q_gates(a, q3, r)
        assert (f3 <= 20).all() and (o3 <= 100).all(), (f3, o3)
        assert np.abs(o3 - o32).max() <= 0.5 and np.abs(f3 - f32).max() <= 0.5, (o3, o32, f3, f32)
    with pytest.raises(ValueError, match="precision must be one of"):
        qmatrix.householder_product(h, tau, precision="tf32")
