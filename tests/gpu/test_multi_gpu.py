"""GPU layer, two GPUs or more (skipped with fewer): calls on a second device, with another one current, and under
torch.cuda.device and a torch stream of that device, give results on the input's device that pass the gates, leave
the current device as it was, and share nothing between devices (one shape factored on both)."""
import numpy as np
import pytest

from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed

pytestmark = pytest.mark.gpu


def device_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no GPU
        return 0


needs_two = pytest.mark.skipif(device_count() < 2, reason="needs two CUDA GPUs")


@needs_two
@pytest.mark.parametrize("m,n", [(176, 176), (1024, 1024), (4096, 32)])
def test_cupy_arrays_on_the_second_device(m, n):
    import cupy

    import qrgen

    host, _ = mixed(m, n, len(FAMILIES), seed=11)
    with cupy.cuda.Device(1):
        a1 = cupy.asarray(host)
    a0 = cupy.asarray(host)
    assert cupy.cuda.runtime.getDevice() == 0
    h1, tau1 = qrgen.geqrf(a1)
    h0, tau0 = qrgen.geqrf(a0)
    assert cupy.cuda.runtime.getDevice() == 0  # left as it was
    assert h1.device.id == 1 and tau1.device.id == 1 and h0.device.id == 0
    assert check(host, h1, tau1).ok and check(host, h0, tau0).ok
    assert np.array_equal(cupy.asnumpy(h1), cupy.asnumpy(h0))  # the same kernels on two devices of one kind


@needs_two
def test_torch_device_and_stream_of_the_second_device():
    torch = pytest.importorskip("torch")

    import qrgen

    host, _ = mixed(352, 352, len(FAMILIES), seed=12)
    a = torch.from_numpy(host).to("cuda:1")
    stream = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(stream):
        h, tau = qrgen.geqrf(a)
        q, r = qrgen.qr(a)
    stream.synchronize()
    assert h.device == a.device and q.device == a.device
    assert torch.cuda.current_device() == 0
    assert check(host, h.cpu().numpy(), tau.cpu().numpy()).ok
    eye = torch.eye(352, device=a.device)
    assert float((q.mT @ q - eye).abs().amax()) < 1e-3 and bool(torch.isfinite(r).all())
    h0, tau0 = qrgen.geqrf(a.to("cuda:0"))  # the same shape on the first device
    assert torch.equal(h0.cpu(), h.cpu())
