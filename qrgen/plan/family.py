"""The kernel families and what each module provides.

A panel family (warp, rows, lanes, cols, tsqr, whole) defines:
  VARIANT, LOOP (whether Panel.loop applies), REG_OVERHEAD, VT_ONLY (whether its kernel can write V^T alone),
  check(panel)                       the Panel fields it accepts (ValueError naming the field),
  check_plan(schedule, index, trail) (optional) what it needs of its place in the schedule (trail: it writes V^T),
  slots(panel, rows)                 rows each thread holds,
  registers(panel, rows)             estimated registers per thread,
  shared_bytes(panel, rows, trail, m, n)  dynamic plus static shared memory a block needs (resources; trail: it
                                     prepares V^T and (VT)^T, or forms G and T; cols also takes t_out=True, where
                                     the panel forms its aggregate's T: planner.shared),
  spec_shared(panel, rows, trail, m, n)   the dynamic shared memory it is launched with,
  vec(panel, n, c0)                  floats per global load,
  name(spec)                         the kernel's name, spelling its compile-time constants,
  describe(panel)                    words for Schedule.describe,
  features(panel)                    the target features it needs,
  SIGNATURE                          its launch parameters (SIGNATURE_CODES below),
  render(spec, schedule, target)     its source.
The product families (rowsplit, fused, tmat, scale, tf32x3, apply3) define their specs, names, layouts, SIGNATUREs and
render.
"""
from __future__ import annotations

import importlib
import math

from ..render.environment import environment
from ..version import __version__
from .specs import KernelSpec, Rendered

PANEL_VARIANTS = ("warp", "rows", "cols", "lanes", "tsqr", "whole")
THREADS = (32, 64, 128, 256, 512, 1024)
PRECISION_CODE = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}

# Launch parameters by code: P a device pointer, I int, L long long, U unsigned, F float.
SIGNATURE_CODES = "PILUF"
# Every panel kernel but tsqr's (templates/cuda/qr.cu.j2): src, h, tau, vt, zt, xch, flags, epoch, c0, mp, vld, vbs,
# nb (the matrices of the launch: run/launch.launch_panel sets it, with the grid, from its batch).
PANEL_SIGNATURE = "PPPPPPPUIIILI"
PANEL_BATCH_ARG = len(PANEL_SIGNATURE) - 1


def panel_pack(panel, trail: bool, target) -> int:
    """Matrices one block of the panel's kernel factors: its family's pack(panel, trail) where it has one (CUDA's
    lanes), else 1."""
    fam = panel_family(panel.variant)
    return fam.pack(panel, trail) if hasattr(fam, "pack") and not target.record.families else 1


def panel_grid(launch, batch: int) -> int:
    """Blocks of a panel launch for `batch` matrices: launch.blocks a matrix, or one for launch.pack matrices."""
    return -(-batch // launch.pack) * launch.blocks


def panel_family(variant: str):
    """The module of a panel variant."""
    if variant not in PANEL_VARIANTS:
        raise ValueError(f"Panel.variant must be one of {PANEL_VARIANTS}, got {variant!r}")
    return importlib.import_module(f"{__package__}.{variant}")


def family(spec: KernelSpec):
    """The module of a kernel spec's family."""
    name = {"project": "rowsplit", "update": "rowsplit"}.get(spec.variant, spec.variant)
    if name.startswith("msl_"):  # Metal's own families (plan/msl.py)
        name = "msl"
    return importlib.import_module(f"{__package__}.{name}")


QUICK_LEVEL = "mid"  # a first call's NVRTC level for a family's kernels unless the family says otherwise


def quick_level(spec: KernelSpec) -> str:
    """The quick tier's optimization level for a kernel (compile/nvrtc.QUICK; docs/decisions.md#first-call-tiers):
    its family's quick_level(spec) where it has one, else QUICK_LEVEL."""
    fam = family(spec)
    return fam.quick_level(spec) if hasattr(fam, "quick_level") else QUICK_LEVEL


def register_cap(threads: int, limits) -> int:
    """The register cap __launch_bounds__(threads, 1) allows a thread."""
    return min(limits.registers_per_thread, (limits.registers_per_sm // threads) // 8 * 8)


SCHEDULERS = 4  # an SM's warp schedulers, each with a quarter of its register file


def resident_register_cap(threads: int, blocks: int, limits) -> int:
    """The register cap of __launch_bounds__(threads, blocks) as ptxas sets it: the blocks' warps spread over the
    SM's schedulers, each holding a quarter of the register file, so that blocks of fewer than 4 warps get less than
    register_cap's plain share (which it equals where the warps divide evenly)."""
    per_scheduler = math.ceil(blocks * math.ceil(threads / 32) / SCHEDULERS)
    return min(limits.registers_per_thread, limits.registers_per_sm // SCHEDULERS // (per_scheduler * 32) // 8 * 8)


def vec(*values: int) -> int:
    """The widest load (4, 2 or 1 floats) that every value is a multiple of."""
    for v in (4, 2, 1):
        if all(x % v == 0 for x in values):
            return v
    return 1


def check_threads(panel) -> None:
    if panel.threads not in THREADS:
        raise ValueError(f"Panel.threads must be one of {THREADS}, got {panel.threads!r}")


def check_narrow(panel) -> None:
    if panel.width > 32:
        raise ValueError(f"Panel.width must be at most 32 for variant {panel.variant!r}, got {panel.width}")


def check_no(panel, *fields: str) -> None:
    """Fields a variant does not take must keep their defaults."""
    for name in fields:
        if name == "slice" and panel.slice != 0:
            raise ValueError(f"Panel.slice applies to variants 'cols', 'whole' and 'tsqr' only; got "
                             f"slice={panel.slice} for {panel.variant!r}")
        if name == "tile" and panel.tile != 0:
            raise ValueError(f"Panel.tile applies to variant 'tsqr' only; got tile={panel.tile} for "
                             f"{panel.variant!r}")


def rows_slots(panel, rows: int) -> int:
    """Rows per thread where the panel's rows are shared by its blocks' threads (warp, rows)."""
    return math.ceil(math.ceil(rows / panel.blocks) / panel.threads)


def render_panel(spec: KernelSpec, schedule, target, min_blocks: int = 1, **context) -> Rendered:
    """A panel kernel's source (templates/<backend>/qr<suffix>.j2, one launch contract for every panel variant of a
    backend); context: a family's own template values."""
    record = target.record
    template = environment().get_template(f"{record.template_dir}/qr{record.suffix}.j2")
    extra = importlib.import_module(record.families).render_panel(spec, schedule) if record.families else {}
    source = template.render(version=__version__, m=schedule.m, n=schedule.n, k_total=min(schedule.m, schedule.n),
                             arch=target.arch, gram_code=PRECISION_CODE[schedule.precision.gram], k=spec,
                             min_blocks=min_blocks, **context, **extra)
    return Rendered(spec.name, source)
