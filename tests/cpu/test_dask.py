"""CPU layer: qrgen.dask on NumPy chunks (qrgen.numerics.numpy_api at every task): batch chunks factored where
they lie, the TSQR tree over row chunks (Q, R, geqrf's rebuilt reflectors, lstsq without Q) on every stress family
against the gates and NumPy, dask's local schedulers and distributed, and the refusals."""
import numpy as np
import pytest

from gates import q_gates
from qrgen.numerics import numpy_api
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed, stress

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
qd = pytest.importorskip("qrgen.dask")


def test_batch_chunks_are_factored_where_they_lie():
    a, _ = mixed(48, 40, 20, seed=1)
    x = da.from_array(a, chunks=(5, 48, 40))
    h, tau = qd.geqrf(x)
    assert h.chunks == x.chunks and tau.chunks == ((5,) * 4, (40,))
    hc, tc = dask.compute(h, tau)
    want = numpy_api.geqrf(a)
    assert np.array_equal(hc, want.h) and np.array_equal(tc, want.tau)  # the same per-matrix algorithm
    assert check(a, hc, tc).ok
    # one task per chunk, reading that chunk alone: no chunk's data goes to another's task
    graph = dict(h.__dask_graph__())
    factor_keys = [k for k in graph if isinstance(k, tuple) and k[0].startswith("geqrf")]
    assert len(factor_keys) == 4


@pytest.mark.parametrize("mode", ["reduced", "complete", "r", "raw"])
def test_batch_qr_modes_match_numpy_api(mode):
    a = np.random.default_rng(2).standard_normal((3, 4, 30, 20)).astype(np.float32)
    x = da.from_array(a, chunks=(1, 2, 30, 20))
    got = dask.compute(qd.qr(x, mode))[0]
    want = numpy_api.qr(a, mode)
    for g, w in zip(got if mode != "r" else [got], want if mode != "r" else [want]):
        assert g.shape == w.shape and np.array_equal(g, w)


@pytest.mark.parametrize("m,n,rows,split", [(2000, 16, 250, 3), (1200, 32, 100, 16), (700, 8, 64, 2)])
def test_tsqr_tree_passes_the_gates_on_every_family(m, n, rows, split):
    for family in FAMILIES:
        a = stress(family, m, n, 2, seed=m + n)
        x = da.from_array(a, chunks=(1, rows, n))
        q, r = qd.qr(x, split_every=split)
        assert q.chunks == x.chunks and r.chunks == ((1, 1), (n,), (n,))
        h, tau = qd.geqrf(x, split_every=split)
        assert h.chunks == x.chunks
        qc, rc, hc, tc = dask.compute(q, r, h, tau)
        factor, orth = q_gates(a, qc, rc)
        assert factor.max() <= 20 and orth.max() <= 100, (family, factor.max(), orth.max())
        assert np.array_equal(np.triu(rc), rc)
        result = check(a, hc, tc)  # the reflectors rebuilt from the tree's Q: geqrf's contract, the gates
        assert result.ok, (family, result.factor.max(), result.orthogonality.max())
        # R from the R-only tree is the one the Q tree gives
        assert np.allclose(dask.compute(qd.qr(x, "r", split_every=split))[0], rc, atol=1e-5 * np.abs(rc).max())


def test_tsqr_of_float64_chunks_is_float64_and_matches_numpy():
    a = np.random.default_rng(3).standard_normal((900, 12))
    x = da.from_array(a, chunks=(150, 12))
    q, r = dask.compute(*qd.qr(x))
    assert q.dtype == np.float64 and r.dtype == np.float64
    qn, rn = np.linalg.qr(a)
    sign = np.sign(np.diagonal(r)) * np.sign(np.diagonal(rn))
    assert np.allclose(q * sign, qn, atol=1e-12) and np.allclose(r * sign[:, None], rn, atol=1e-12)
    h, tau = dask.compute(*qd.geqrf(x))
    assert np.allclose(numpy_api.householder_product(h, tau), qn * np.sign(np.diagonal(rn)) * np.sign(np.diagonal(h)),
                       atol=1e-12)


@pytest.mark.parametrize("vector", [True, False])
def test_lstsq_by_the_tree_and_by_chunks_matches_numpy(vector):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 1500, 10)).astype(np.float32)
    b = rng.standard_normal((3, 1500) if vector else (3, 1500, 2)).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = [np.linalg.lstsq(a64[i], b64[i], rcond=None) for i in range(3)]
    for chunks in [(1, 100, 10), (2, 1500, 10)]:  # the tree, then whole matrices per chunk
        x = da.from_array(a, chunks=chunks)
        bb = da.from_array(b, chunks=chunks[:-1] if vector else chunks[:-1] + (2,))
        sol, res = dask.compute(*qd.lstsq(x, bb))
        assert sol.shape == (3, 10) if vector else (3, 10, 2)
        for i in range(3):
            assert np.allclose(sol[i], want[i][0], atol=2e-5)
            assert np.allclose(res[i], want[i][1], rtol=1e-4)


def test_householder_product_and_ormqr_on_batch_chunks():
    a = np.random.default_rng(5).standard_normal((6, 40, 24)).astype(np.float32)
    x = da.from_array(a, chunks=(2, 40, 24))
    h, tau = qd.geqrf(x)
    want = numpy_api.geqrf(a)
    for complete in (False, True):
        got = qd.householder_product(h, tau, complete).compute()
        assert np.array_equal(got, numpy_api.householder_product(want.h, want.tau, complete))
    c = np.random.default_rng(6).standard_normal((6, 40, 3)).astype(np.float32)
    got = qd.ormqr(h, tau, da.from_array(c, chunks=(3, 20, 3)), "L", True).compute()
    assert np.allclose(got, numpy_api.ormqr(want.h, want.tau, c, "L", True), atol=1e-5)


def test_a_single_matrix_and_the_schedulers():
    from distributed import Client, LocalCluster

    a = np.random.default_rng(7).standard_normal((3000, 20)).astype(np.float32)
    x = da.from_array(a, chunks=(500, 20))
    q, r = qd.qr(x)
    assert q.shape == (3000, 20) and r.shape == (20, 20)
    want = dask.compute(q, r, scheduler="synchronous")
    for scheduler in ("threads", "processes"):
        got = dask.compute(q, r, scheduler=scheduler)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        got = client.compute([q, r], sync=True)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    factor, orth = q_gates(a, want[0], want[1])
    assert factor.max() <= 20 and orth.max() <= 100


def test_refusals_name_what_is_wrong():
    a = da.zeros((4, 100, 10), chunks=(2, 50, 5), dtype=np.float32)
    with pytest.raises(TypeError, match="takes dask arrays"):
        qd.geqrf(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="columns are in 2 chunks"):
        qd.geqrf(a)
    with pytest.raises(ValueError, match="at least n = 10 rows"):
        qd.qr(a.rechunk({2: -1, 1: (95, 5)}))
    with pytest.raises(ValueError, match="no mode 'complete'"):
        qd.qr(a.rechunk({2: -1}), "complete")
    with pytest.raises(ValueError, match="mode must be one of"):
        qd.qr(a.rechunk({2: -1}), "full-ish")
    with pytest.raises(ValueError, match="split_every"):
        qd.qr(a.rechunk({2: -1}), split_every=1)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        qd.geqrf(da.zeros(5))
    with pytest.raises(TypeError, match="real numeric"):
        qd.geqrf(da.zeros((4, 4), dtype=np.complex64))
    with pytest.raises(ValueError, match="b must have shape"):
        qd.lstsq(a.rechunk({2: -1}), da.zeros((4, 99)))
    with pytest.raises(ValueError, match="m >= n"):
        qd.lstsq(da.zeros((5, 8)), da.zeros(5))
    h, tau = qd.geqrf(a.rechunk({2: -1}))
    with pytest.raises(ValueError, match="whole in chunks"):
        qd.householder_product(h, tau)
    with pytest.raises(ValueError, match="tau must have shape"):
        qd.householder_product(h.rechunk({1: -1}), tau[..., :3])
