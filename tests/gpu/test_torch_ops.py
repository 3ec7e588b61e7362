"""GPU layer, PyTorch: qrgen's custom ops (qrgen.torch, torch.ops.qrgen) under torch.compile(fullgraph=True) with no
graph break, under mode="reduce-overhead" and torch.cuda.graph (every capture mode) replayed with fresh data, and
autograd for qr and householder_product against torch's own gradients."""
import math

import numpy as np
import pytest

import qrgen
from qrgen.numerics.stress import FAMILIES, stress

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
import qrgen.torch as qt  # noqa: E402

CAPTURE_CASES = [(20, 32, 32), (40, 176, 176), (60, 1024, 1024), (2, 4096, 4096)]


def _close(x, y, tol=1e-4):
    x, y = x.double(), y.double()
    return float((x - y).norm() / max(y.norm(), 1e-30)) <= tol


def test_every_op_compiles_with_fullgraph():
    def f(a, c, b):
        h, tau = qrgen.geqrf(a)
        q, r = qrgen.qr(a)
        q2 = qt.householder_product(h, tau)
        y = qrgen.ormqr(h, tau, c, transpose=True)
        x, res = qt.lstsq(a, b)
        return h, tau, q, r, q2, y, x, res

    a = torch.randn(6, 48, 32, device="cuda")
    c = torch.randn(6, 48, 3, device="cuda")
    b = torch.randn(6, 48, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    for _ in range(2):
        got, want = compiled(a, c, b), f(a, c, b)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.allclose(g, w, atol=1e-5), (g.shape, (g - w).abs().max())


@pytest.mark.parametrize("batch,m,n", CAPTURE_CASES[:3])
def test_reduce_overhead_replays_fresh_data(batch, m, n):
    compiled = torch.compile(lambda x: qrgen.geqrf(x), mode="reduce-overhead")
    for seed in range(4):
        torch.manual_seed(seed)
        a = torch.randn(batch, m, n, device="cuda")
        h, tau = compiled(a)
        h0, tau0 = qrgen.geqrf(a)
        assert torch.allclose(h, h0, atol=1e-5) and torch.allclose(tau, tau0, atol=1e-5)


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("batch,m,n", CAPTURE_CASES)
def test_torch_cuda_graph_capture_replays_fresh_data(batch, m, n, mode):
    static = torch.randn(batch, m, n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph asks
        for _ in range(2):
            qrgen.geqrf(static)
            qrgen.qr(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=mode):
        h, tau = qrgen.geqrf(static)
        q, r = qrgen.qr(static)
    for seed in range(3):
        torch.manual_seed(100 + seed)
        fresh = torch.randn(batch, m, n, device="cuda")
        static.copy_(fresh)
        graph.replay()
        h0, tau0 = qrgen.geqrf(fresh)
        q0, r0 = qrgen.qr(fresh)
        assert torch.equal(h, h0) and torch.equal(tau, tau0), f"{mode} {batch}x{m}x{n}"
        assert torch.allclose(q, q0, atol=1e-5) and torch.allclose(r, r0, atol=1e-4)


def _well_conditioned(batch, m, n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = min(m, n)
    u, _ = torch.linalg.qr(torch.randn(batch, m, k, device="cuda", generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(batch, n, k, device="cuda", generator=g, dtype=torch.float64))
    s = torch.linspace(1, 2, k, device="cuda", dtype=torch.float64)
    return ((u * s) @ v.mT).float()


@pytest.mark.parametrize("batch,m,n", [(4, 64, 32), (3, 50, 50), (2, 176, 176), (3, 20, 40)])
def test_qr_gradients_match_torch(batch, m, n):
    a = _well_conditioned(batch, m, n, seed=m + n)
    g = torch.Generator(device="cuda").manual_seed(1)
    k = min(m, n)
    wq, wr = torch.randn(batch, m, k, device="cuda", generator=g), torch.randn(batch, k, n, device="cuda", generator=g)
    grads = []
    for fn in (qrgen.qr, torch.linalg.qr):
        x = a.clone().requires_grad_()
        q, r = fn(x)
        ((q * wq).sum() + (r * wr).sum()).backward()
        grads.append(x.grad)
    assert _close(grads[0], grads[1]), float((grads[0] - grads[1]).norm() / grads[1].norm())
    x = a.clone().requires_grad_()  # R alone (no gradient reaches Q) and Q alone
    for which in (1, 0):
        out = qrgen.qr(x)[which]
        (gx,) = torch.autograd.grad(out.sum(), x)
        (gt,) = torch.autograd.grad(torch.linalg.qr(x)[which].sum(), x)
        assert _close(gx, gt)


def test_householder_product_gradients_match_torch():
    a = _well_conditioned(3, 40, 24, seed=5)
    h, tau = qrgen.geqrf(a)
    w = torch.randn(3, 40, 24, device="cuda")
    grads = []
    for fn in (qrgen.householder_product, torch.linalg.householder_product):
        hh, tt = h.clone().requires_grad_(), tau.clone().requires_grad_()
        (fn(hh, tt) * w).sum().backward()
        grads.append((hh.grad, tt.grad))
    assert _close(grads[0][0], grads[1][0]) and _close(grads[0][1], grads[1][1])
    hh = h.clone().requires_grad_()
    qc = qrgen.householder_product(hh, tau, complete=True)
    assert qc.shape == (3, 40, 40)
    qc.sum().backward()
    assert torch.isfinite(hh.grad).all()


def test_gradients_are_finite_where_torchs_are():
    for family in FAMILIES:
        a = torch.as_tensor(stress(family, 48, 32, 4, seed=2), device="cuda")
        x, y = a.clone().requires_grad_(), a.clone().requires_grad_()
        q, r = qrgen.qr(x)
        (q.sum() + r.sum()).backward()
        qt_, rt = torch.linalg.qr(y)
        (qt_.sum() + rt.sum()).backward()
        finite = torch.isfinite(y.grad).flatten(1).all(dim=1)
        assert torch.isfinite(x.grad).flatten(1).all(dim=1)[finite].all(), family


def test_non_differentiable_calls_say_so():
    a = torch.randn(2, 30, 20, device="cuda", requires_grad=True)
    h, tau = qrgen.geqrf(a)
    with pytest.raises(RuntimeError, match="qrgen.geqrf has no derivative"):
        h.sum().backward()
    q, r = qrgen.qr(torch.randn(2, 30, 20, device="cuda", requires_grad=True), mode="complete")
    with pytest.raises(RuntimeError, match="mode='complete'"):
        q.sum().backward()
    with torch.no_grad():  # no grad mode: the direct path, results without a graph
        h, tau = qrgen.geqrf(a)
    assert not h.requires_grad


def test_outputs_come_from_torchs_allocator():
    a = torch.randn(50, 256, 256, device="cuda")
    qrgen.geqrf(a)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    h, tau = qrgen.geqrf(a)
    assert torch.cuda.memory_allocated() - before >= h.numel() * 4  # h is memory torch accounts for
    del h, tau


def test_current_device_and_stream_are_honoured():
    a = torch.randn(8, 100, 60, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        s.wait_stream(torch.cuda.default_stream())
        h, tau = qrgen.geqrf(a)
        q = qrgen.householder_product(h, tau)
    s.synchronize()
    ref = torch.linalg.qr(a.double())[0]
    assert torch.allclose(q.double().abs(), ref.abs(), atol=1e-4)
    assert math.isclose(float(torch.linalg.matrix_norm(q.mT @ q - torch.eye(60, device="cuda")).max()), 0,
                        abs_tol=1e-4)
    assert np.isfinite(h.cpu().numpy()).all()


def test_expanded_and_non_contiguous_inputs_under_no_grad():
    base = torch.randn(1, 40, 30, device="cuda")
    expanded = base.expand(5, 40, 30)  # stride 0 over the batch
    with torch.no_grad():
        h, tau = qrgen.geqrf(expanded)
        h1, tau1 = qrgen.geqrf(base.contiguous())
    assert torch.equal(h, h1.expand(5, 40, 30)) and torch.equal(tau, tau1.expand(5, 30))
    x = torch.randn(4, 30, 40, device="cuda").transpose(-1, -2).requires_grad_()  # non-contiguous, requires grad
    q, r = qrgen.qr(x)
    (q.sum() + r.sum()).backward()
    y = x.detach().clone().requires_grad_()
    qt_, rt = torch.linalg.qr(y)
    (qt_.sum() + rt.sum()).backward()
    assert _close(x.grad, y.grad, tol=1e-3)
