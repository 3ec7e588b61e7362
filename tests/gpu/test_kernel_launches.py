"""GPU layer: single kernels launched on their own against float64: the fused panel products (packed by
plan.fused.SIGNATURE), the tf32x3 products of the Q functions, the T kernel, and the cuBLAS wrapper's layouts."""
import numpy as np
import pytest

from gpu_cases import EPS32
from qrgen.compile.nvrtc import compile_source
from qrgen.numerics import reference
from qrgen.numerics.stress import stress
from qrgen.plan import fused, tf32x3
from qrgen.render.sources import render
from qrgen.run.launch import PackedArgs, tf32x3_matmul, tmatrix_gpu
from qrgen.targets import Target

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("width,rows,nc,ldc,aligned,cluster", [
    (32, 1024, 96, 1024, True, 1), (32, 1024, 96, 1024, False, 1), (32, 37, 70, 104, True, 1),
    (32, 37, 70, 101, False, 1), (16, 700, 33, 64, True, 1), (5, 300, 1, 7, False, 1), (1, 129, 40, 48, True, 1),
    (8, 2000, 250, 257, False, 1), (20, 130, 250, 260, True, 1), (32, 1024, 96, 1024, True, 2),
    (32, 1000, 40, 101, False, 4), (5, 2000, 250, 260, True, 8), (16, 9, 33, 64, True, 8)])
def test_fused_panel_products(width, rows, nc, ldc, aligned, cluster):
    """The fused kernel against float64: C -= V (Z^T C) on nc columns of C (rows x ldc per matrix, from column 4
    with every leading dimension a multiple of 4: its 16-byte path; else from column 3), the columns around them
    untouched; with a cluster, the rows split over its blocks (9 rows over 8: some blocks have none)."""
    import cupy

    target = Target("cuda", "sm_90")
    kernel = fused.kernel(width, cluster)
    rendered = render(kernel, None, target)  # (the fused family's source takes nothing from a schedule)
    binary = compile_source(rendered.name, rendered.source, target.arch)
    module = cupy.cuda.function.Module()
    module.load(binary.cubin)
    func = module.get_function(rendered.name)
    batch, rng = 5, np.random.default_rng(rows)
    zld, vld, col = (-(-rows // 4) * 4 + 4, -(-rows // 4) * 4, 4) if aligned else (rows + 3, rows + 1, 3)
    zt = rng.standard_normal((batch, width, zld)).astype(np.float32)  # leading dimensions past the rows
    vt = rng.standard_normal((batch, width, vld)).astype(np.float32)
    c = rng.standard_normal((batch, rows, ldc)).astype(np.float32)
    zg, vg, cg = cupy.asarray(zt), cupy.asarray(vt), cupy.asarray(c)
    values = (zg.data.ptr, zld, width * zld, vg.data.ptr, vld, width * vld, cg.data.ptr + 4 * col, ldc, rows * ldc,
              rows, nc)
    args = PackedArgs(fused.SIGNATURE, values)
    if kernel.shared_bytes > 48 * 1024:
        cupy.cuda.driver.funcSetAttribute(func.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          kernel.shared_bytes)
    cupy.cuda.driver.launchKernel(func.ptr, -(-nc // 32), batch, cluster, fused.THREADS, 1, 1,
                                  kernel.shared_bytes, cupy.cuda.get_current_stream().ptr, args.address, 0)
    out = cupy.asnumpy(cg).astype(np.float64)
    z64, v64, c64 = zt[:, :, :rows].astype(np.float64), vt[:, :, :rows].astype(np.float64), c.astype(np.float64)
    part = c64[:, :, col:col + nc]
    want = part - np.matmul(v64.transpose(0, 2, 1), np.matmul(z64, part))
    scale = np.matmul(np.abs(v64).transpose(0, 2, 1), np.matmul(np.abs(z64), np.abs(part))) + np.abs(part)
    assert np.all(np.abs(out[:, :, col:col + nc] - want) <= 2 * (rows + width) * EPS32 * scale)
    assert np.array_equal(out[:, :, :col], c64[:, :, :col])
    assert np.array_equal(out[:, :, col + nc:], c64[:, :, col + nc:])


def test_tf32x3_matmul_layouts_and_refusals():
    """run.launch.tf32x3_matmul (the Q functions' tf32x3 products) against float64: A K-contiguous ("project") and
    M-contiguous (a transposed view: "update"), C a view into a larger array updated in place (alpha -1, beta 1);
    thin or misaligned products are refused with nothing written."""
    import cupy

    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.standard_normal((3, 192, 136), dtype=np.float32))
    at = cupy.asarray(rng.standard_normal((3, 136, 192), dtype=np.float32)).transpose(0, 2, 1)
    b = cupy.asarray(rng.standard_normal((3, 136, 200), dtype=np.float32))
    c = cupy.full((3, 192, 200), np.nan, dtype=cupy.float32)
    assert tf32x3_matmul(a, b, c, 1.0, 0.0)
    ref = cupy.matmul(a.astype(cupy.float64), b.astype(cupy.float64))
    assert float(cupy.abs(c - ref).max()) <= 1e-5 * float(cupy.abs(ref).max())
    big = cupy.ones((3, 300, 260), dtype=cupy.float32)
    view = big[:, 4:196, 8:208]
    assert tf32x3_matmul(at, b, view, -1.0, 1.0)
    ref = 1.0 - cupy.matmul(at.astype(cupy.float64), b.astype(cupy.float64))
    assert float(cupy.abs(view - ref).max()) <= 1e-5 * float(cupy.abs(ref).max())
    outside = cupy.ones_like(big, dtype=cupy.bool_)
    outside[:, 4:196, 8:208] = False
    assert bool((big[outside] == 1.0).all())
    before = big.copy()
    thin = tf32x3.MIN - 4  # a depth under the kernels' least (a multiple of 4: refused for that alone)
    assert not tf32x3_matmul(a[:, :, :thin], b[:, :thin, :], view, 1.0, 0.0)
    assert not tf32x3_matmul(a, b, big[:, 1:193, 1:201], 1.0, 0.0)  # C not 16-byte aligned
    assert not tf32x3_matmul(a, b.transpose(0, 2, 1).copy().transpose(0, 2, 1), view, 1.0, 0.0)  # B column-major
    assert bool((big == before).all())


@pytest.mark.parametrize("w", [1, 31, 32, 100, 128, 129, 176, 255, 256])
def test_t_kernel_against_the_reference(w):
    """The T kernel (run.launch.tmatrix_gpu): by blocks up to 128 reflectors, by halves past it, against slarft's T
    in float64 from the same G and tau; every entry written (the lower left block of the halves too)."""
    import cupy

    h, tau = reference.geqrf(stress("random", w + 40, w, 3, seed=w).astype(np.float64))
    v = np.tril(h, -1)
    v[:, np.arange(w), np.arange(w)] = 1
    g = np.swapaxes(v, 1, 2) @ v
    want = reference.tmatrix(g, tau)
    got = tmatrix_gpu(cupy.asarray(g, dtype=cupy.float32), cupy.asarray(tau, dtype=cupy.float32)).get()
    # NumPy's float32 recurrence is off by about 1 eps32 of T's largest entry here (w up to 256)
    assert np.abs(got - want).max() <= 100 * EPS32 * np.abs(want).max(), np.abs(got - want).max()
    assert np.array_equal(np.tril(got, -1), np.zeros_like(got))


def test_cublas_matmul_layouts():
    import cupy

    from qrgen.run.cublas import matmul

    rng = cupy.random.default_rng(0)
    a = rng.standard_normal((3, 40, 24), dtype=cupy.float32)
    b = rng.standard_normal((3, 24, 17), dtype=cupy.float32)
    for x, y in [(a, b), (a.transpose(0, 2, 1).copy().transpose(0, 2, 1), b), (a, b.transpose(0, 2, 1).copy()
                 .transpose(0, 2, 1)), (a[:, 5:30, 2:20], b[:, 2:20, :]), (a[:1], b)]:
        assert cupy.allclose(matmul(x, y), cupy.matmul(x, y), atol=1e-4)
        big = rng.standard_normal((x.shape[0] if x.shape[0] > 1 else 3, x.shape[1] + 3, y.shape[2] + 5),
                                  dtype=cupy.float32)
        before = big.copy()
        view = big[:, 2:2 + x.shape[1], 1:1 + y.shape[2]]  # in place into a view of a larger array
        assert matmul(x, y, subtract_from=view) is view
        expect = before.copy()
        expect[:, 2:2 + x.shape[1], 1:1 + y.shape[2]] -= cupy.matmul(x, y)
        assert cupy.allclose(big, expect, atol=1e-4)
        assert matmul(x, y, out=view) is view  # written into the view (beta 0), the rest of big untouched
        expect[:, 2:2 + x.shape[1], 1:1 + y.shape[2]] = cupy.matmul(x, y)
        assert cupy.allclose(big, expect, atol=1e-4)
        assert cupy.allclose(matmul(x, y, precision="tf32"), cupy.matmul(x, y), atol=1e-1)  # tf32 inputs allowed
    with pytest.raises(ValueError, match="not both"):
        matmul(a, b, subtract_from=view, out=view)
