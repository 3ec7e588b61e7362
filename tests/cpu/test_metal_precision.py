"""CPU layer, Metal: the GEMMs' half and bfloat inputs (float accumulators) and the power-of-two scale of schedules
with half inputs. The layer rounds as MSL does (nearest, ties to even; half's subnormals, overflow to inf), the
rendered kernels pass the check, the planner refuses bfloat where a family lacks it, and on every stress family the
kernels' accuracy at each precision is the NumPy reference's (qrgen/numerics/reference.py) for the same schedule:
at these small shapes reduced inputs fail the gates, which is why Apple's defaults stay fp32
(docs/decisions.md#apple-defaults)."""
import dataclasses

import numpy as np
import pytest

from qrgen.compile import msl
from qrgen.numerics import reference
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, mixed, stress
from qrgen.plan import msl as families
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.render.sources import render
from qrgen.schedule.files import find
from qrgen.schedule.model import Precision
from qrgen.targets import SIMDGROUP_BFLOAT, Target

APPLE = Target.parse("apple9")
REDUCED = [Precision("fp32", "fp16", "fp16"), Precision("fp16", "fp16", "fp16"), Precision("fp32", "bf16", "bf16"),
           Precision("bf16", "bf16", "bf16")]


def _schedule(m, n, precision, batch=1):
    return dataclasses.replace(find(Problem(m, n, batch), APPLE)[0], precision=precision)


def _gemm(device, kind, precision, a, b):
    """C = op(A) op(B) by the Metal GEMM of `kind` ("project": A B) with inputs in `precision`."""
    spec = families.gemm_kernel(kind, precision)
    kernel = device.load(spec.name, render(spec, None, APPLE).source)
    (rows, depth), cols = a.shape, b.shape[1]
    c = device.empty(rows * cols)
    device.dispatch(kernel, (-(-cols // 32), -(-rows // 32), 1), families.GEMM_THREADS, (a.reshape(-1),
                    b.reshape(-1), c), (rows, cols, depth, depth, 0, cols, 0, cols, 0, 0, 0, 0), families.GEMM_TG_FLOATS)
    return c.reshape(rows, cols)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_layers_round_as_msl_does(cpu_device, precision):
    """A product of depth 1 by 1 gives each input as the GEMM staged it: nearest, ties to even, half's subnormals
    and overflow to inf, NaN kept."""
    f32 = np.float32
    x = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 65504, 65519.99, 65520, 1e6,
                  -2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -25, 6e-8, 1e-5, -1e-5, 2.0 ** -14, 0, -0.0, 1e30,
                  -np.inf, np.nan, 1 / 3, -2 / 3, 1e-40, 3.4e38], dtype=f32)
    x = np.concatenate([x, np.random.default_rng(0).standard_normal(32 - len(x), dtype=f32)])[:, None]
    got = _gemm(cpu_device, "project", precision, x, np.ones((1, 1), dtype=f32))[:, 0]
    want = reference.round_to(x[:, 0], precision)
    assert np.array_equal(got, want, equal_nan=True), np.stack([x[:, 0], got, want], 1)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_reduced_gemm_is_the_rounded_inputs_product_accumulated_in_float(cpu_device, precision):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((70, 600), dtype=np.float32), rng.standard_normal((600, 45), dtype=np.float32)
    got = _gemm(cpu_device, "project", precision, a, b)
    want = reference.round_to(a, precision).astype(np.float64) @ reference.round_to(b, precision)
    assert np.abs(got - want).max() <= 64 * np.finfo(np.float32).eps * np.abs(want).max()
    assert np.abs(got - a.astype(np.float64) @ b).max() > 100 * np.finfo(np.float32).eps * np.abs(want).max()


def test_reduced_plans_name_their_inputs_and_scale_for_half_inputs():
    fp16 = plan(_schedule(512, 512, REDUCED[0]), APPLE, keep=True).kernels
    names = {k.name for k in fp16}
    assert {"qr_gemm_nn_a1_b0_fp16", "qr_gemm_tn_am1_b1_fp16", "qr_gemm_nn_a1_b0", "qr_gemm_tn_am1_b1",
            "qr_gemm_nt_a1_b0", "qr_gemm_tn_a1_b0", "qr_scale"} <= names  # fp32 G, (VT)^T and Q's products
    bf16 = {k.name for k in plan(_schedule(512, 512, REDUCED[3]), APPLE).kernels}
    assert "qr_gemm_nt_a1_b0_bf16" in bf16 and "qr_scale" not in bf16  # bfloat has float's range: no scale
    with pytest.raises(ValueError, match="tf32"):
        plan(_schedule(512, 512, Precision("fp32", "tf32", "tf32")), APPLE)


def test_a_family_without_bfloat_matrices_refuses_bf16(monkeypatch):
    target = Target.parse("apple7")
    monkeypatch.setattr(type(target), "features", property(lambda self: frozenset()))
    with pytest.raises(ValueError, match=SIMDGROUP_BFLOAT):
        plan(_schedule(512, 512, REDUCED[2]), target)
    plan(_schedule(512, 512, REDUCED[0]), target)


def test_every_reduced_precision_kernel_passes_the_check():
    pytest.importorskip("clang.cindex")
    names = set()
    for precision in REDUCED:
        schedule = _schedule(512, 512, precision)
        for kernel in plan(schedule, APPLE, keep=True).kernels:
            if kernel.variant in ("msl_gemm", "msl_scale") and kernel.name not in names:
                names.add(kernel.name)
                msl.check(render(kernel, schedule, APPLE).source, kernel.name)
    assert {"qr_scale", "qr_gemm_tn_am1_b1_bf16", "qr_gemm_nt_a1_b0_fp16"} <= names


def test_the_power_of_two_scale_leaves_the_factorization_as_at_unit_scale(cpu_device):
    """Half inputs on matrices far outside half's range: 2^e times a matrix gives the same V and tau and 2^e R."""
    from qrgen.run import metal_engine

    schedule = _schedule(176, 176, REDUCED[1], batch=3)
    a = stress("random", 176, 176, 3, seed=3)
    h, tau = metal_engine.geqrf(a, cpu_device, schedule)
    for e in (-100, 90):
        hs, taus = metal_engine.geqrf(np.ldexp(a, e), cpu_device, schedule)
        upper = np.triu(np.ones((176, 176), dtype=bool))
        assert np.array_equal(taus, tau)
        assert np.array_equal(hs[:, ~upper], h[:, ~upper]) and np.array_equal(hs[:, upper], np.ldexp(h[:, upper], e))


@pytest.mark.parametrize("precision", REDUCED, ids=lambda p: f"{p.gram}-{p.project}-{p.update}")
def test_reduced_inputs_on_every_family_match_the_reference(cpu_device, precision):
    """Every stress family at 176 x 176 (rows panels, aggregates of 128): the kernels' worst factor residual is
    within a factor 2 of the NumPy reference's with the same rounding (both about 30 to 500, over the gate of 20 at
    this size), orthogonality within the gates, no NaN."""
    from qrgen.run import metal_engine

    schedule = _schedule(176, 176, precision, batch=len(FAMILIES))
    a, labels = mixed(176, 176, len(FAMILIES), seed=11)
    h, tau = metal_engine.geqrf(a, cpu_device, schedule)
    got = check(a, h, tau)
    want = check(a, *reference.geqrf(a, schedule, dtype=np.float32))
    assert np.isfinite(got.factor).all() and (got.orthogonality <= 100).all()
    for label, f, w in zip(labels, got.factor, want.factor):
        assert f <= 2 * w + 1, f"{label}: {f:.2f} against the reference's {w:.2f}"
    assert got.factor.max() >= 0.5 * want.factor.max()


def test_precision_fp32_runs_the_default_half_schedule_from_float_inputs(cpu_device):
    """2048 x 2048 takes half inputs by default (schedule/apple.HALF_FROM), 1024 x 1024 not; precision="fp32" the
    same panels with every product from float inputs, and no scale."""
    from qrgen.run import metal_runtime

    assert metal_runtime.factorizer(1024, 1024, 1, cpu_device).schedule.precision == Precision()
    half = metal_runtime.factorizer(2048, 2048, 1, cpu_device)
    fp32 = metal_runtime.factorizer(2048, 2048, 1, cpu_device, precision="fp32")
    assert half.schedule.precision == Precision("fp32", "fp16", "fp16") and half.schedule.scaled
    assert fp32.schedule == dataclasses.replace(half.schedule, precision=Precision())
    assert not any(k.endswith(("_fp16", "_bf16")) or k == "qr_scale" for k in fp32.kernels)
