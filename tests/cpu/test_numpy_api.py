"""The NumPy entry points behave as NumPy's do, or refuse clearly: empty dimensions, NumPy's and SciPy's modes,
float32 in float32 out, complex refused, rank-deficient lstsq refused, results as named tuples that still unpack,
ormqr's `left=` as torch takes it."""
import numpy as np
import pytest

from qrgen.numerics import numpy_api
from qrgen.numerics.stress import stress


@pytest.mark.parametrize("shape", [(0, 3, 3), (2, 0, 3), (2, 3, 0), (4, 0), (0, 5), (0, 0)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_empty_dimensions_give_numpys_shapes(shape, mode):
    a = np.zeros(shape)
    ours, theirs = numpy_api.qr(a, mode), np.linalg.qr(a, mode)
    for x, y in zip((ours,) if mode == "r" else ours, (theirs,) if mode == "r" else theirs):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y)


def test_modes_and_scipys_names():
    a = stress("random", 7, 4, 2, seed=1).astype(np.float64)
    for mode, alias in (("complete", "full"), ("reduced", "economic")):
        for x, y in zip(numpy_api.qr(a, mode), numpy_api.qr(a, alias)):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="mode must be one of"):
        numpy_api.qr(a, "thin")


def test_float32_in_float32_out_float64_and_integers_float64():
    a = stress("random", 9, 5, 3, seed=2)
    assert a.dtype == np.float32
    q, r = numpy_api.qr(a)
    assert q.dtype == r.dtype == np.float32
    assert numpy_api.geqrf(a).h.dtype == np.float32
    assert numpy_api.qr(a.astype(np.float64)).R.dtype == np.float64
    assert numpy_api.qr(np.arange(12).reshape(4, 3)).Q.dtype == np.float64
    np.testing.assert_allclose(q @ r, a, atol=1e-5)


def test_complex_input_is_refused():
    with pytest.raises(TypeError, match="complex"):
        numpy_api.qr(np.ones((3, 3), dtype=np.complex64))
    with pytest.raises(TypeError, match="complex"):
        numpy_api.lstsq(np.ones((3, 2)), np.ones(3, dtype=complex))


def test_results_are_named_tuples_that_unpack():
    a = stress("random", 6, 4, 1, seed=3).astype(np.float64)
    result = numpy_api.qr(a)
    q, r = result
    assert result.Q is q and result.R is r
    h, tau = numpy_api.geqrf(a)
    assert numpy_api.geqrf(a).tau.shape == tau.shape == (1, 4)
    x, residual = numpy_api.lstsq(a, np.ones((1, 6)))
    assert numpy_api.lstsq(a, np.ones((1, 6))).solution.shape == x.shape == (1, 4)


def test_lstsq_refuses_a_rank_deficient_matrix_and_matches_numpy_otherwise():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 8, 4))
    a[1, :, 3] = a[1, :, 0] + a[1, :, 1]  # matrix 1 has rank 3
    b = rng.standard_normal((2, 8))
    with pytest.raises(ValueError, match="matrix 1 of the batch is rank-deficient"):
        numpy_api.lstsq(a, b)
    x, residual = numpy_api.lstsq(a[:1], b[:1])
    expect, res, *_ = np.linalg.lstsq(a[0], b[0], rcond=None)
    np.testing.assert_allclose(x[0], expect, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(residual[0], res[0], rtol=1e-10)


def test_ormqr_takes_torchs_left():
    a = stress("random", 6, 4, 2, seed=5).astype(np.float64)
    h, tau = numpy_api.geqrf(a)
    c = np.random.default_rng(6).standard_normal((2, 3, 6))
    np.testing.assert_array_equal(numpy_api.ormqr(h, tau, c, left=False), numpy_api.ormqr(h, tau, c, "R"))
    cl = c.transpose(0, 2, 1).copy()
    np.testing.assert_array_equal(numpy_api.ormqr(h, tau, cl, "R", left=True), numpy_api.ormqr(h, tau, cl, "L"))
