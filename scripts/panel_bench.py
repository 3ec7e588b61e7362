"""Run on the GPU machine: one panel kernel alone (a rows x 32 matrix, nothing right of the panel), graph-replay
time and time per column, with the gates on a batch of every stress family.

    python scripts/panel_bench.py 60x1024:rows-t256-loop 60x512:lanes-s32 8x2048:lanes-s16-c8 ...

A case is BATCHxROWS:KERNEL, KERNEL one of
    lanes-sS[-cB]      a lanes panel with about S rows per warp (qrgen.schedule.lanes_panel), on B blocks (a cluster)
    rows-tT[-loop]     a rows panel of T threads on one block, the column loop unrolled or not (Panel.loop)
"""
import sys

import cupy
import numpy as np

from qrgen.bench import graph_time_us
from qrgen.check import check
from qrgen.runtime import Factorizer
from qrgen.schedule import Panel, Precision, Schedule, lanes_panel
from qrgen.testing import mixed

WIDTH = 32


def panel_for(rows: int, kernel: str) -> Panel | None:
    parts = kernel.split("-")
    if parts[0] == "lanes":
        slots = int(parts[1][1:])
        blocks = int(parts[2][1:]) if len(parts) > 2 else 1
        return lanes_panel(rows, WIDTH, slots, blocks)
    if parts[0] == "rows":
        return Panel(WIDTH, "rows", int(parts[1][1:]), 1, loop="loop" in parts[2:])
    raise SystemExit(f"unknown kernel {kernel!r}: lanes-sS[-cB] or rows-tT[-loop]")


def main(cases: list[str]) -> None:
    for case in cases:
        shape, kernel = case.split(":")
        batch, rows = (int(v) for v in shape.split("x"))
        panel = panel_for(rows, kernel)
        try:
            schedule = Schedule(rows, WIDTH, (panel,), Precision()) if panel else None
        except ValueError as exc:
            print(f"{case}: does not fit ({exc})")
            continue
        if schedule is None:
            print(f"{case}: does not fit")
            continue
        fac = Factorizer(rows, WIDTH, schedule, "sm_90")
        rng = np.random.default_rng(1)
        inputs = [cupy.asarray(rng.standard_normal((batch, rows, WIDTH), dtype=np.float32)) for _ in range(2)]
        t = graph_time_us(fac, inputs, 30)
        a = cupy.asarray(mixed(rows, WIDTH, batch, seed=3)[0])
        h, tau = fac(a)
        report = check(a, h, tau)
        print(f"{case:<28} {panel.threads:>4} threads x {panel.blocks}: {t:8.1f} µs ({t / WIDTH:5.2f} µs a column); "
              f"factor {report.factor.max():.2f}, orthogonality {report.orthogonality.max():.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
