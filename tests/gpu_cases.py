"""Test helpers of the GPU layer (tests/ is on sys.path through conftest.py): a geqrf call checked against the
gates, and the aggregated schedules several GPU tests run."""
import numpy as np

import qrgen
from qrgen.numerics.check import check
from qrgen.schedule.model import Schedule
from qrgen.schedule.panels import default_panel

EPS32 = float(np.finfo(np.float32).eps)


def geqrf_checked(a_host, geqrf=qrgen.geqrf):
    """check() of geqrf (qrgen.geqrf, or a Factorizer) on a host batch copied to the GPU."""
    import cupy

    h, tau = geqrf(cupy.asarray(a_host))
    return check(a_host, h, tau)


def aggregated_schedule(m, n, width, aggregate, panel_update="cublas", lookahead=0, reach=False):
    """Default panels of at most `width` columns that do not straddle aggregates of `aggregate` columns, with the
    given panel update ("cublas", "rowsplit" or "fused"), lookahead and reach."""
    k = min(m, n)
    panels, col = [], 0
    while col < k:
        end = min(k, (col // aggregate + 1) * aggregate)
        panel = default_panel(m - col, end - col, (width,))
        panels.append(panel)
        col += panel.width
    return Schedule(m, n, tuple(panels), aggregate=aggregate, panel_update=panel_update, lookahead=lookahead,
                    reach=reach)
