"""Panel family "warp": one warp per matrix, the panel's rows spread over its lanes, all columns in registers (the
rows kernel on one warp: templates/cuda/panel_rows.cuh)."""
from __future__ import annotations

from . import family, rows
from .family import PANEL_SIGNATURE as SIGNATURE  # noqa: F401

VARIANT = "warp"
VT_ONLY = False  # a trail kernel writes (VT)^T too
LOOP = True
CLUSTER = False
REG_OVERHEAD = rows.REG_OVERHEAD

# a rows panel on one warp in all but its checks and features
slots, registers, shared_bytes, spec_shared, vec, name, describe, render, quick_level = (
    rows.slots, rows.registers, rows.shared_bytes, rows.spec_shared, rows.vec, rows.name, rows.describe, rows.render,
    rows.quick_level)


def check(panel) -> None:
    family.check_threads(panel)
    family.check_narrow(panel)
    family.check_no(panel, "tile", "slice")
    if panel.threads != 32 or panel.blocks != 1:
        raise ValueError("Panel variant 'warp' takes threads=32 and blocks=1")


def features(panel) -> tuple[str, ...]:
    return ()
