"""GPU layer: the fast lane (qrgen.run.fastpath) of one-launch shapes: the second call on a stream skips the
general path and gives its results bit for bit."""
import numpy as np
import pytest

import qrgen
from qrgen import api
from qrgen.numerics.check import check

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_fast_lane_one_launch_calls(kind, monkeypatch):
    """A one-launch shape's second call on a stream takes the fast lane (no DLPack, no stream objects): results
    equal the general path's bit for bit, of the input's kind, with leading dimensions and a contiguous input one
    float off 16-byte alignment; a new stream goes through the general path first; qr's fused kernel likewise."""
    import cupy

    if kind == "torch":
        torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    host = rng.standard_normal((2, 10, 32, 32), dtype=np.float32)
    flat = cupy.asarray(np.concatenate([[7.0], host.ravel()]).astype(np.float32))
    arrays = {"aligned": flat[1:].copy().reshape(host.shape), "misaligned": flat[1:].reshape(host.shape)}
    if kind == "torch":
        arrays = {k: torch.from_dlpack(v) for k, v in arrays.items()}
    general = {}
    for name, x in arrays.items():
        general[name] = (qrgen.geqrf(x), qrgen.qr(x))  # the first calls: the general path
    general_path = api.as_device_array  # the general path's first step, for qrgen.geqrf and qrgen.qr alike
    taken = []
    monkeypatch.setattr(api, "as_device_array", lambda a: taken.append(1) or general_path(a))
    for name, x in arrays.items():
        taken.clear()
        (h, tau), (q, r) = qrgen.geqrf(x), qrgen.qr(x)
        assert not taken, name  # the kernel's scalar loads take a misaligned input as it is
        for got, want in zip((h, tau, q, r), (*general[name][0], *general[name][1])):
            assert type(got) is type(want) and tuple(got.shape) == tuple(want.shape)
            got, want = (cupy.asarray(v) for v in (got, want))
            assert bool((got == want).all()), name
    h, tau = (cupy.asarray(v) for v in qrgen.geqrf(arrays["aligned"]))
    assert check(host.reshape(-1, 32, 32), h.reshape(-1, 32, 32), tau.reshape(-1, 32)).ok
    if kind == "cupy":
        stream = cupy.cuda.Stream()
        with stream:
            taken.clear()
            qrgen.geqrf(arrays["aligned"])
            assert taken  # a new stream: the general path makes its workspace first
            taken.clear()
            h2, _ = qrgen.geqrf(arrays["aligned"])
            assert not taken
        stream.synchronize()
        assert bool((h2 == h).all())
