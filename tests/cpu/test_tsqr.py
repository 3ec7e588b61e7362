"""CPU layer: the tsqr panel (a tree of QRs over row tiles, Householder reflectors rebuilt from its Q), in the
NumPy reference, the launch sequence (the NumPy engine), the schedule model, its plan and the generated source."""
import json

import numpy as np
import pytest

from qrgen.numerics import reference
from qrgen.numerics.check import check
from qrgen.numerics.stress import FAMILIES, stress
from qrgen.plan import cols
from qrgen.plan.planner import check as check_target
from qrgen.plan.planner import plan
from qrgen.plan.tsqr import tsqr_layout, tsqr_levels, tsqr_phases
from qrgen.render.sources import render
from qrgen.run import numpy_engine
from qrgen.schedule.model import Panel, Precision, Schedule
from qrgen.schedule.panels import tsqr_panel
from qrgen.targets import Target


@pytest.mark.parametrize("rows,width,tile", [(1000, 8, 64), (333, 32, 64), (2049, 16, 128), (40, 8, 64),
                                             (100, 32, 64)])
def test_tsqr_panel_passes_the_gates_in_float32(rows, width, tile):
    for family in FAMILIES:
        a = stress(family, rows, width, 3, seed=rows)
        p = a.copy()
        tau, v = reference.tsqr_panel(p, tile)
        result = check(a, p, tau)
        assert result.ok, (family, result.factor.max(), result.orthogonality.max())
        assert np.array_equal(np.tril(p, -1)[:, :width], np.tril(v, -1)[:, :width])
        assert np.array_equal(p[:, width:], v[:, width:])


def test_tsqr_panel_is_householder_qr_in_exact_arithmetic():
    """In float64 on a full-rank panel the rebuilt reflectors, tau and R are those of Householder QR itself (the
    signs S of the LU are the signs Householder's beta takes)."""
    a = stress("random", 700, 16, 2, seed=1).astype(np.float64)
    p, q = a.copy(), a.copy()
    tau, _ = reference.tsqr_panel(p, 64)
    tau_h, _ = reference.panel_factor(q)
    assert np.allclose(p, q, atol=1e-10) and np.allclose(tau, tau_h, atol=1e-12)
    # T = -U S V1^-T, as the final phase forms it, is slarft's T of the rebuilt reflectors
    q_thin = -np.linalg.qr(a)[0]  # any orthonormal basis: the LU's signs adapt to it
    lu, s = reference.tsqr_lu(q_thin[:, :16])
    tau_r, v, _, tm = reference.tsqr_reflectors(q_thin, lu, s, np.zeros((2, 16, 16)))
    assert np.allclose(tm, reference.tmatrix(np.matmul(v.transpose(0, 2, 1), v), tau_r), atol=1e-10)


def test_tree_geometry_and_layout():
    levels = tsqr_levels(100000, 32, 512)
    assert levels == ((100000, 196), (6272, 13), (416, 1))
    assert tsqr_levels(300, 32, 512) == ((300, 1),)
    lay = tsqr_layout(levels, 32)
    regions = sorted([(s, tiles * 32 * 32) for s, (_, tiles) in zip(lay.stack, levels)]
                     + [(s, tiles * 32) for s, (_, tiles) in zip(lay.tau, levels)]
                     + [(s, tiles * 32 * 32) for s, (_, tiles) in zip(lay.t, levels)] + [(lay.v1, 32 * 32)])
    assert all(start % 4 == 0 for start, _ in regions)
    assert all(a + n <= b for (a, n), (b, _) in zip(regions, regions[1:]))
    assert regions[-1][0] + regions[-1][1] <= lay.floats
    phases = tsqr_phases(levels, 32)
    assert [(p.kind, p.rows) for p in phases] == [(0, 100000), (1, 6272), (1, 416), (2, 416), (2, 6272), (3, 100000)]
    assert phases[3].y == -1 and phases[4].y == lay.stack[1] and phases[5].y == lay.stack[0]  # root: the identity
    assert phases[-1].out == lay.stack[-1] and phases[2].out == lay.stack[2]  # the root's R
    assert phases[1].at == lay.stack[0] and phases[1].out == lay.stack[1] and phases[4].at == lay.stack[0]
    single = tsqr_phases(((300, 1),), 32)
    assert [p.kind for p in single] == [0, 3] and single[-1].y == -1


@pytest.mark.parametrize("kwargs,match", [({"tile": 100}, "Panel.tile"), ({"tile": 32}, "Panel.tile"),
                                          ({"tile": 4096}, "Panel.tile"), ({"blocks": 2}, "blocks=1"),
                                          ({"threads": 8, "tile": 64}, "threads")])
def test_tsqr_panel_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Panel(**{"width": 16, "variant": "tsqr", "threads": 128, "tile": 512, **kwargs})
    with pytest.raises(ValueError, match="Panel.tile applies"):
        Panel(16, "rows", 128, tile=512)


def test_tsqr_schedule_json_plan_and_source():
    schedule = Schedule(5000, 64, (Panel(32, "tsqr", 256, tile=512, loop=True), Panel(32, "tsqr", 128, tile=256)))
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    assert "tile" not in Schedule(64, 64, (Panel(32, "rows", 64),) * 2).to_json()["panels"][0]
    assert "tiles of 512 rows" in schedule.describe()
    p = plan(schedule)
    kernels, launches = p.kernels, p.launches
    assert [k.name for k in kernels] == ["qr_tsqr_w32_t256_s2_v4_trail_loop", "qr_tsqr_w32_t128_s2_v4"]
    assert launches[0].levels == tsqr_levels(5000, 32, 512) and launches[1].tile == 256
    source = render(kernels[0], schedule, Target()).source
    assert "TsqrPanel<5000, 64, 64, 32, 256, 2, 4, true, true, 0, false>" in source
    with pytest.raises(ValueError, match="registers"):  # 8 rows of 32 columns per thread
        check_target(Schedule(5000, 32, (Panel(32, "tsqr", 64, tile=512),)), Target())


def test_tsqr_cols_tiles_schedule_json_plan_and_source():
    """Tiles factored as cols panels (Panel.slice): a warp a slice, the reflectors in dynamic shared memory, the
    field in the schedule's JSON, the kernel's name and its template values; fields that do not fit are refused."""
    schedule = Schedule(5000, 20, (Panel(16, "tsqr", 256, tile=512, slice=2), Panel(4, "tsqr", 64, tile=512, slice=2)))
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    assert schedule.to_json()["panels"][0]["slice"] == 2
    assert "slice" not in Schedule(5000, 16, (Panel(16, "tsqr", 256, tile=512),)).to_json()["panels"][0]
    assert "(cols, slice 2)" in schedule.describe()
    kernels = plan(schedule).kernels
    assert [k.name for k in kernels] == ["qr_tsqr_w16_t256_s2_c2_v4_trail", "qr_tsqr_w4_t64_s8_c2_v4"]
    assert kernels[0].shared_bytes == cols.shared_bytes_of(16, 16, True)  # every reflector of a tile, G, T
    source = render(kernels[0], schedule, Target()).source
    assert "TsqrPanel<5000, 20, 20, 16, 256, 2, 4, true, false, 2, false>" in source
    assert "QR_DYNAMIC_SHARED(dyn)" in source
    with pytest.raises(ValueError, match="32 \\* ceil\\(width / slice\\) = 256"):
        Panel(16, "tsqr", 128, tile=512, slice=2)
    with pytest.raises(ValueError, match="one of"):
        Panel(16, "tsqr", 256, tile=512, slice=3)
    with pytest.raises(ValueError, match="loop"):
        Panel(16, "tsqr", 256, tile=512, slice=2, loop=True)
    with pytest.raises(ValueError, match="at most 4 x threads \\(cols tiles"):  # 8 rows of 16 columns a thread
        Panel(16, "tsqr", 256, tile=2048, slice=2)
    with pytest.raises(ValueError, match="at most 16 x threads"):  # 2,048 rows
        Panel(4, "tsqr", 64, tile=2048, slice=2)
    # the helper picks the narrowest slice that fits, else none (rows tiles)
    assert tsqr_panel(5000, 16, 16, 256, 512, 2) == Panel(16, "tsqr", 256, tile=512, slice=2)
    assert tsqr_panel(5000, 6, 16, 256, 512, 2) == Panel(6, "tsqr", 64, tile=512, slice=4)  # 3 warps: no block
    assert tsqr_panel(5000, 20, 32, 256, 512, 2) == Panel(20, "tsqr", 256, tile=512)  # 3 or 5 or 10 warps


@pytest.mark.parametrize("schedule", [
    Schedule(3000, 48, (Panel(16, "tsqr", 64, tile=256),) * 3),
    Schedule(1500, 96, (Panel(32, "tsqr", 128, tile=256),) * 3, aggregate=64),
    Schedule(2000, 120, (Panel(16, "tsqr", 64, tile=128, loop=True),) * 7 + (Panel(8, "rows", 512),),
             Precision("fp32", "tf32x3", "tf32x3"), aggregate=64, lookahead=2),
    Schedule(3000, 37, (Panel(16, "tsqr", 128, tile=256, loop=True),) * 2 + (Panel(5, "tsqr", 64, tile=128),)),
], ids=["plain", "aggregates", "lookahead", "odd-width"])
def test_tsqr_launch_sequence(schedule):
    """The tsqr phases through the work buffer at the kernel's offsets (the NumPy engine, starting from NaN)
    against the reference's tsqr_panel."""
    a = stress("random", schedule.m, schedule.n, 2, seed=7)
    h, tau, log = numpy_engine.geqrf(a, schedule)
    hr, tr = reference.geqrf(a, schedule, dtype=np.float32)
    assert np.abs(h - hr).max() <= 1e-4 * np.abs(a).max() and np.abs(tau - tr).max() <= 1e-4
    hostile = np.concatenate([stress(f, schedule.m, schedule.n, 1, seed=3) for f in FAMILIES])
    assert check(hostile, *numpy_engine.geqrf(hostile, schedule)[:2]).ok
