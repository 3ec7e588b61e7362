"""GPU layer: qrgen.dask on CuPy chunks: batch chunks and the TSQR tree against the gates, many tasks at once on
one GPU (dask's threads: each on its own stream) giving what one at a time gives, and dask-cuda's cluster of one
worker (where dask_cuda is installed)."""
import numpy as np
import pytest

from gates import q_gates
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed, stress

pytestmark = pytest.mark.gpu
da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")


def _cupy_chunks(host, chunks):
    import cupy

    return da.from_array(host, chunks=chunks).map_blocks(cupy.asarray)


def test_batch_chunks_on_the_gpu_pass_the_gates():
    import cupy

    import qrgen.dask as qd

    host, _ = mixed(176, 176, 64, seed=21)
    x = _cupy_chunks(host, (16, 176, 176))
    h, tau = dask.compute(*qd.geqrf(x))
    assert isinstance(h, cupy.ndarray) and isinstance(tau, cupy.ndarray)
    assert check(host, h, tau).ok
    q, r = dask.compute(*qd.qr(x))
    factor, orth = q_gates(host, cupy.asnumpy(q), cupy.asnumpy(r))
    assert factor.max() <= 20 and orth.max() <= 100


@pytest.mark.parametrize("m,n,rows", [(200_000, 64, 25_000), (30_000, 256, 4_000)])
def test_tsqr_tree_on_the_gpu_passes_the_gates(m, n, rows):
    import cupy

    import qrgen.dask as qd

    for family in ("random", "rankdef", "colscaled", "collinear", "zero"):
        host = stress(family, m, n, 1, seed=m)[0]
        x = _cupy_chunks(host, (rows, n))
        q, r = dask.compute(*qd.qr(x, split_every=4))
        factor, orth = q_gates(host, cupy.asnumpy(q), cupy.asnumpy(r))
        assert factor.max() <= 20 and orth.max() <= 100, (family, factor.max(), orth.max())
        h, tau = dask.compute(*qd.geqrf(x, split_every=4))
        result = check(host[None], h[None], tau[None])
        assert result.ok, (family, result.factor.max(), result.orthogonality.max())


def test_lstsq_tree_on_the_gpu_matches_float64():
    import cupy

    import qrgen.dask as qd

    rng = np.random.default_rng(22)
    a = rng.standard_normal((100_000, 48)).astype(np.float32)
    b = rng.standard_normal(100_000).astype(np.float32)
    x, res = dask.compute(*qd.lstsq(_cupy_chunks(a, (10_000, 48)), _cupy_chunks(b, (10_000,))))
    want, want_res = np.linalg.lstsq(a.astype(np.float64), b.astype(np.float64), rcond=None)[:2]
    assert np.allclose(cupy.asnumpy(x), want, atol=1e-5)
    assert np.allclose(float(res), want_res[0], rtol=1e-4)


def test_many_tasks_at_once_on_one_gpu_give_what_one_at_a_time_gives():
    import cupy

    import qrgen.dask as qd

    host, _ = mixed(512, 512, 96, seed=23)
    x = _cupy_chunks(host, (8, 512, 512))
    h, tau = qd.geqrf(x)
    one = dask.compute(h, tau, scheduler="synchronous")
    many = dask.compute(h, tau, scheduler="threads", num_workers=8)
    assert all(bool((cupy.asarray(g) == w).all()) for g, w in zip(many, one))
    assert check(host, *many).ok


def test_a_dask_cuda_cluster_of_one_worker():
    pytest.importorskip("dask_cuda")
    import cupy
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import qrgen.dask as qd

    host, _ = mixed(352, 352, 2 * len(FAMILIES), seed=24)
    with LocalCUDACluster(n_workers=1, dashboard_address=None) as cluster, Client(cluster) as client:
        x = client.persist(_cupy_chunks(host, (len(FAMILIES), 352, 352)))
        h, tau = client.compute(list(qd.geqrf(x)), sync=True)
    assert isinstance(h, cupy.ndarray)
    assert check(host, h, tau).ok
