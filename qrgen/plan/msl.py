"""The Metal backend's kernel families beside its panels: the rows panel as templates/metal/qr.metal.j2 renders it
(one threadgroup per matrix, the loop over columns unrolled by the template), the tsqr panel of plan/tsqr.py as
templates/metal/tsqr.metal.j2 renders it (a threadgroup per tile, one dispatch per phase), the GEMM of the trailing,
merge and Q products on simdgroup matrices (templates/metal/gemm.metal.j2: one kernel per transpose and scaling
pattern the launch sequence uses and input precision its schedule names: float, half or bfloat inputs, float
accumulators), T of an aggregate (templates/metal/tmat.metal.j2) and the power-of-two scale of schedules with half
inputs (templates/metal/scale.metal.j2). What Metal kernels may do,
and how their threadgroup memory is passed, is templates/metal/dialect.h's; the planner asks this module
(plan/planner.py, through the backend record's `families`) which kernels a schedule needs and whether Metal can run
it."""
from __future__ import annotations

from ..render.environment import environment
from ..targets import SIMDGROUP_BFLOAT
from ..version import __version__
from .specs import KernelSpec, Rendered

PANEL_VARIANTS = ("rows", "tsqr", "whole")
TMAT_MAX = 256  # reflectors of the T kernel (rows of T in device memory: no threadgroup memory bound)
GEMM_THREADS = 128
GEMM_TILE = 32
GEMM_TG_FLOATS = 32 * 16 + 16 * 32 + 2 * 32 * 32
GEMM_CHUNK = 256  # the depth whose products are summed apart (gemm.metal.j2)
# The launch sequence's products (run/sequence.drive, drive_q) by stage: (op(A) transposed, op(B) transposed, alpha,
# beta). Q's products take the trailing update's patterns.
GEMM_KINDS = {"project": (False, False, 1.0, 0.0), "update": (True, False, -1.0, 1.0),
              "gram": (False, True, 1.0, 0.0), "aggregate": (True, False, 1.0, 0.0)}
STAGE_KIND = {"project": "project", "update": "update", "gram": "gram", "aggregate": "aggregate",
              "qproject": "project", "qupdate": "update"}
# A stage's input precision -> the MSL type its GEMM stages op(A) and op(B) as (a schedule's other precisions, and
# Q's tf32x3, run from float inputs on Metal: Apple GPUs have no tf32)
GEMM_INPUTS = {"fp32": "float", "fp16": "half", "bf16": "bfloat"}
SCALE_THREADS = 256
SCALE_FLOATS_PER_THREADGROUP = 256 * 16  # phases 1 and 2: a threadgroup per this many floats of a matrix, at most
SCALE_MAX_THREADGROUPS = 1024            # this many per matrix


def tg_floats(variant: str, threads: int, width: int, m: int, n: int) -> int:
    """Threadgroup memory of a panel kernel, in floats: a rows panel's (templates/metal/panel.j2's layout), a tsqr
    panel's (the rows panel's, four width x (width + 1) blocks, two of 32: tsqr.metal.j2), or a whole kernel's, the
    matrix with rows n | 1 floats apart beside the sums (whole.metal.j2)."""
    warps = threads // 32
    if variant == "whole":
        return m * (n | 1) + warps * 33 + 33
    rows = warps * 33 + 33 + 64 + 2 * width * (width + 1) + 32
    return rows + 4 * width * (width + 1) + 64 if variant == "tsqr" else rows


def panel_tg_floats(spec: KernelSpec, m: int, n: int) -> int:
    return tg_floats(spec.variant, spec.threads, spec.width, m, n)


def gemm_input(precision: str) -> str:
    """The precision a stage's GEMM takes its inputs in on Metal: fp16, bf16, else fp32."""
    return precision if precision in GEMM_INPUTS else "fp32"


def gemm_name(kind: str, precision: str = "fp32") -> str:
    ta, tb, alpha, beta = GEMM_KINDS[kind]
    inputs = "" if gemm_input(precision) == "fp32" else f"_{precision}"
    return f"qr_gemm_{'t' if ta else 'n'}{'t' if tb else 'n'}_a{'m' if alpha < 0 else ''}1_b{int(beta)}{inputs}"


def gemm_kernel(kind: str, precision: str = "fp32") -> KernelSpec:
    """The GEMM of a stage's kind with its inputs in `precision` (KernelSpec.kind: "kind" or "kind:precision")."""
    member = kind if gemm_input(precision) == "fp32" else f"{kind}:{precision}"
    return KernelSpec(gemm_name(kind, precision), "msl_gemm", 0, GEMM_THREADS, 1, 0, 1, False, 0, 4 * GEMM_TG_FLOATS,
                      (), kind=member)


def scale_kernel() -> KernelSpec:
    return KernelSpec("qr_scale", "msl_scale", 0, SCALE_THREADS, 1, 0, 1, False, 0, 4 * SCALE_THREADS // 32, ())


def scale_threadgroups(m: int, n: int) -> int:
    """Threadgroups per matrix of the scale kernel's phases 1 and 2."""
    return max(1, min(SCALE_MAX_THREADGROUPS, -(-m * n // SCALE_FLOATS_PER_THREADGROUP)))


def tmat_kernel() -> KernelSpec:
    return KernelSpec("qr_tmat", "msl_tmat", 0, 1024, 1, 0, 1, False, 0, 16, ())


# The kernels of Q and Q^T C from (h, tau) and of least squares (run/metal_q.py): V^T of a block from h, and the
# triangular solve
VT_THREADS = 256
TRSM_THREADS = 32
Q_KERNELS = (KernelSpec("qr_vt", "msl_vt", 0, VT_THREADS, 1, 0, 1, False, 0, 16, ()),
             KernelSpec("qr_trsm", "msl_trsm", 0, TRSM_THREADS, 1, 0, 1, False, 0, 16, ()))


def check(schedule, target) -> None:
    """ValueError naming what a Metal target cannot run: panels other than whole ones and rows and tsqr panels on one
    threadgroup (tsqr: per tile) with the loop over columns unrolled, products other than the backend's GEMM's, inputs
    other than fp32, fp16 and bf16 (bf16 where the family has bfloat simdgroup matrices), aggregates over
    TMAT_MAX."""
    for index, panel in enumerate(schedule.panels):
        need = 4 * tg_floats(panel.variant, panel.threads, panel.width, schedule.m, schedule.n)
        if need > target.limits.shared_bytes:
            raise ValueError(f"Schedule.panels[{index}] ({panel.variant}) needs {need} bytes of threadgroup memory "
                             f"for a {schedule.m}x{schedule.n} matrix; {target.arch} has {target.limits.shared_bytes}")
        if panel.variant not in PANEL_VARIANTS or panel.blocks != 1 or panel.cluster or panel.loop:
            raise ValueError(f"Schedule.panels[{index}] ({panel.variant}, {panel.blocks} block(s)"
                             f"{', cluster' if panel.cluster else ''}{', loop' if panel.loop else ''}): Metal runs "
                             f"panels of variant {PANEL_VARIANTS} on one threadgroup, the loop over columns unrolled "
                             f"(a 'whole' kernel factors column by column: its slice is not used)")
        if panel.variant == "tsqr" and panel.slice:
            raise ValueError(f"Schedule.panels[{index}] (tsqr, slice {panel.slice}): Metal factors a tsqr panel's "
                             f"tiles as rows panels (slice 0)")
    if schedule.panel_update != "cublas":
        raise ValueError(f"Schedule.panel_update {schedule.panel_update!r}: on Metal the panels' own products run "
                         f"through the backend's GEMM kernels ('cublas')")
    stages = {s: getattr(schedule.precision, s) for s in ("gram", "project", "update")}
    if any(p not in GEMM_INPUTS for p in stages.values()):
        raise ValueError(f"Schedule.precision {stages}: Metal's GEMMs take inputs in {tuple(GEMM_INPUTS)} (Apple GPUs "
                         f"have no tf32)")
    if "bf16" in stages.values() and SIMDGROUP_BFLOAT not in target.features:
        raise ValueError(f"Schedule.precision {stages}: {target.arch} has no bfloat simdgroup matrices "
                         f"({SIMDGROUP_BFLOAT})")
    if schedule.widest_aggregate > TMAT_MAX:
        raise ValueError(f"Schedule.aggregate {schedule.aggregate}: Metal's T kernel takes at most {TMAT_MAX} "
                         f"columns")


def product_kernels(schedule, launches, aggregates, keep: bool) -> list[KernelSpec]:
    """The GEMM, T and scale kernels a plan's launch sequence calls: the trailing products and G in the schedule's
    precisions, (VT)^T and Q's products from float inputs."""
    prec = schedule.precision
    kinds = []
    if keep or any(L.nc > 0 for L in launches) or any(a.nc > 0 for a in aggregates):
        kinds += [("project", prec.project), ("update", prec.update)]
    if keep:
        kinds += [("project", "fp32"), ("update", "fp32")]
    merged = [a for a in aggregates if a.nc > 0 or keep]
    if merged:
        kinds += [("gram", prec.gram), ("aggregate", "fp32")]
    specs = list({gemm_name(k, p): gemm_kernel(k, p) for k, p in kinds}.values())
    return specs + ([tmat_kernel()] if merged else []) + ([scale_kernel()] if schedule.scaled else [])


def _literal(x: float) -> str:
    return f"{x:.1f}f"


def render(spec: KernelSpec, schedule, target) -> Rendered:
    env, common = environment(), dict(version=__version__, arch=target.arch, k=spec)
    if spec.variant == "msl_gemm":
        kind, _, precision = spec.kind.partition(":")
        ta, tb, alpha, beta = GEMM_KINDS[kind]
        source = env.get_template("metal/gemm.metal.j2").render(
            **common, ta=ta, tb=tb, alpha=alpha, beta=beta, alpha_literal=_literal(alpha),
            beta_literal=_literal(beta), tg_floats=GEMM_TG_FLOATS, chunk=GEMM_CHUNK,
            input=GEMM_INPUTS[precision or "fp32"])
    elif spec.variant == "msl_tmat":
        source = env.get_template("metal/tmat.metal.j2").render(**common, tmat_max=TMAT_MAX)
    elif spec.variant in ("msl_vt", "msl_trsm", "msl_scale"):
        source = env.get_template(f"metal/{spec.variant[4:]}.metal.j2").render(**common)
    else:
        raise ValueError(f"no Metal kernel family {spec.variant!r}")
    return Rendered(spec.name, source)


def render_panel(spec: KernelSpec, schedule) -> dict:
    """The template variables of a panel kernel on Metal beside the common ones (plan/family.render_panel)."""
    return {"tg_floats": panel_tg_floats(spec, schedule.m, schedule.n)}
