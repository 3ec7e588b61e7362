import numpy as np
import pytest

from qrgen.numerics.stress import FAMILIES, mixed, stress

SHAPES = [(1, 1), (1, 5), (5, 1), (16, 16), (50, 7), (7, 50)]


def test_families_order():
    assert FAMILIES == ("random", "colscaled", "rankdef", "nearrankdef", "normspread",
                        "upper", "banded", "rowscaled", "collinear", "zero")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("m,n", SHAPES)
def test_shape_dtype_finite(family, m, n):
    with np.errstate(all="raise"):
        a = stress(family, m, n, batch=3, seed=1)
    assert a.shape == (3, m, n)
    assert a.dtype == np.float32
    assert a.flags.c_contiguous
    assert np.all(np.isfinite(a))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "zero"])
def test_batch_members_differ(family):
    a = stress(family, 8, 6, batch=4, seed=2)
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.array_equal(a[i], a[j])


def test_rankdef_rank():
    a = stress("rankdef", 16, 16, batch=4, seed=3)
    for x in a:
        assert np.linalg.matrix_rank(x.astype(np.float64)) == 16 - 16 // 4
    # at least one zero column whenever n >= 2
    assert np.all(stress("rankdef", 5, 2)[0, :, 1] == 0)
    assert np.any(stress("rankdef", 5, 2)[0, :, 0] != 0)


def test_zero():
    assert not np.any(stress("zero", 9, 4, batch=2))


def test_upper():
    for m, n in [(16, 16), (50, 7), (7, 50)]:
        a = stress("upper", m, n, batch=2)
        assert np.array_equal(a, np.triu(a))
        assert np.all(np.diagonal(a, axis1=1, axis2=2) != 0)


def test_banded():
    for m, n in [(16, 16), (50, 7), (7, 50)]:
        a = stress("banded", m, n, batch=2)
        i, j = np.indices((m, n))
        assert not np.any(a[:, np.abs(i - j) > 2])
        assert np.all(a[:, np.abs(i - j) <= 2] != 0)


def test_scalings():
    cols = np.linalg.norm(stress("colscaled", 400, 5, seed=4)[0], axis=0)
    assert 1e3 < cols[0] / cols[-1] < 1e5
    rows = np.linalg.norm(stress("rowscaled", 5, 400, seed=4)[0], axis=1)
    assert 1e3 < rows[0] / rows[-1] < 1e5
    norms = np.linalg.norm(stress("normspread", 400, 11, seed=4)[0].astype(np.float64), axis=0)
    assert norms[4] / np.sqrt(400) < 1e-6 and norms[9] / np.sqrt(400) < 1e-6
    assert 1e6 < norms[10] / norms[0] < 1e8


def test_near_rank_deficient_and_collinear():
    a = stress("nearrankdef", 20, 8, seed=5)[0].astype(np.float64)
    assert np.allclose(a[:, :4], a[:, 4:], atol=1e-3)
    s = np.linalg.svd(a, compute_uv=False)
    assert s[3] / s[4] > 1e3
    c = stress("collinear", 20, 8, seed=5)[0].astype(np.float64)
    s = np.linalg.svd(c, compute_uv=False)
    assert s[0] / s[1] > 1e2


def test_seeds():
    for family in FAMILIES:
        assert np.array_equal(stress(family, 6, 5, 2, seed=7), stress(family, 6, 5, 2, seed=7))
        if family != "zero":
            assert not np.array_equal(stress(family, 6, 5, 2, seed=7), stress(family, 6, 5, 2, seed=8))
    a1, l1 = mixed(6, 5, 20, seed=7)
    a2, l2 = mixed(6, 5, 20, seed=7)
    assert l1 == l2 and np.array_equal(a1, a2)
    a3, _ = mixed(6, 5, 20, seed=8)
    assert not np.array_equal(a1, a3)


@pytest.mark.parametrize("batch", [len(FAMILIES), 37])
def test_mixed(batch):
    a, labels = mixed(12, 9, batch, seed=9)
    assert a.shape == (batch, 12, 9) and a.dtype == np.float32 and a.flags.c_contiguous
    assert len(labels) == batch
    assert set(labels) == set(FAMILIES)
    i, j = np.indices((12, 9))
    for x, name in zip(a, labels):
        assert np.all(np.isfinite(x))
        if name == "zero":
            assert not np.any(x)
        else:
            assert np.any(x)
        if name == "upper":
            assert np.array_equal(x, np.triu(x))
        if name == "banded":
            assert not np.any(x[np.abs(i - j) > 2])
        if name == "rankdef":
            assert not np.any(x[:, 9 - 9 // 4:])


def test_mixed_small_batch():
    a, labels = mixed(3, 3, 2, seed=0)
    assert a.shape == (2, 3, 3) and len(labels) == 2
    assert all(name in FAMILIES for name in labels)


def test_positions_shuffled():
    orders = {tuple(mixed(2, 2, len(FAMILIES), seed=s)[1]) for s in range(5)}
    assert len(orders) > 1


def test_bad_family():
    with pytest.raises(ValueError, match="nosuch") as e:
        stress("nosuch", 4, 4)
    assert "random" in str(e.value) and "zero" in str(e.value)


@pytest.mark.parametrize("name,kwargs", [
    ("m", dict(m=0, n=4)), ("n", dict(m=4, n=0)), ("batch", dict(m=4, n=4, batch=0)),
    ("m", dict(m=-1, n=4)), ("n", dict(m=4, n=2.0)), ("batch", dict(m=4, n=4, batch=True)),
])
def test_bad_sizes(name, kwargs):
    with pytest.raises(ValueError, match=rf"^{name} "):
        stress("random", **kwargs)


@pytest.mark.parametrize("name,args", [
    ("m", (0, 4, 10)), ("n", (4, 0, 10)), ("batch", (4, 4, 0)), ("batch", (4, 4, 2.5)),
])
def test_mixed_bad_sizes(name, args):
    with pytest.raises(ValueError, match=rf"^{name} "):
        mixed(*args)
