"""Run on the GPU machine: lanes panels of about SLOTS rows per warp over a shape's columns (one warp, with its loop
over columns unrolled, where SLOTS >= the panel's rows), geqrf and, where the schedule has one, qr's fused kernel:
the gates on a batch of every stress family, then eager and CUDA-graph medians (L2 flushed) and the time a call
back to back (100 calls in one graph, L2 warm: the kernel's own time, the steadiest number), two rounds in turn.

    python scripts/lanes_slots.py 20x32x32 20000x32x32 --slots auto,16,32

(BENCHMARKS.md, eighteenth session: one warp against 8 rows per warp at 20 x 32², 16², 48², 64x32 and 176².)
"""
import argparse

import cupy
import numpy as np

from qrgen.bench import back_to_back_us, graph_time_us, median_time_us
from qrgen.check import check
from qrgen.runtime import Factorizer
from qrgen.schedule import Schedule, lanes_panel
from qrgen.testing import mixed

EPS = float(np.finfo(np.float32).eps)


def q_gates(a, q, r) -> tuple[float, float]:
    """Worst ||A - QR||_1 / (||A||_1 n eps32) and ||Q^T Q - I||_1 / (n eps32) of the batch, in float64."""
    a, q, r = (np.asarray(x, dtype=np.float64) for x in (a, q, r))
    n = a.shape[-1]
    norm_a = np.maximum(np.abs(a).sum(-2).max(-1), np.finfo(np.float64).tiny)
    factor = np.abs(a - q @ r).sum(-2).max(-1) / (norm_a * n * EPS)
    orth = np.abs(np.swapaxes(q, -1, -2) @ q - np.eye(n)).sum(-2).max(-1) / (n * EPS)
    return float(factor.max()), float(orth.max())


def lanes_schedule(m: int, n: int, slots) -> Schedule:
    k, panels, col = min(m, n), [], 0
    while col < k:
        panels.append(lanes_panel(m - col, min(32, k - col), slots))
        col += panels[-1].width
    return Schedule(m, n, tuple(panels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help="BATCHxMxN")
    parser.add_argument("--slots", default="auto,16,32", help="rows per warp to try, comma-separated ('auto')")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    for case in args.cases:
        batch, m, n = (int(v) for v in case.split("x"))
        rng = np.random.default_rng(0)
        inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(3)]
        hostile = mixed(m, n, min(batch, 64), seed=5)[0]
        facs = {}
        for text in args.slots.split(","):
            slots = text if text == "auto" else int(text)
            schedule = lanes_schedule(m, n, slots)
            if any(f.schedule == schedule for f in facs.values()):
                continue
            fac = facs[text] = Factorizer(m, n, schedule, "sm_90")
            fac.build()
            report = check(hostile, *fac(cupy.asarray(hostile)))
            line = (f"{case} slots={text} threads {[p.threads for p in schedule.panels]} "
                    f"{[(b.name, b.registers, b.spill_bytes) for b in fac.binaries]}: geqrf gates "
                    f"{report.factor.max():.3f} / {report.orthogonality.max():.3f}")
            if fac.fused_q is not None:
                q, r = fac.run_qr(cupy.asarray(hostile), cupy.cuda.get_current_stream())
                line += " qr gates %.3f / %.3f" % q_gates(hostile, q.get(), r.get())
            print(line, flush=True)
        rows = {text: [] for text in facs}
        for _ in range(2):
            for text, fac in facs.items():
                fns = [fac]
                if fac.fused_q is not None:
                    fns.append(lambda x, fac=fac: fac.run_qr(x, cupy.cuda.get_current_stream()))
                rows[text].append([(median_time_us(fn, inputs, args.reps), graph_time_us(fn, inputs, args.reps),
                                    back_to_back_us(lambda fn=fn: fn(inputs[0])))
                                   for fn in fns])
        for text, rounds in rows.items():
            for i, kind in enumerate(["geqrf", "qr"][:len(rounds[0])]):
                print(f"  {case} slots={text} {kind} eager / graph / back to back µs: "
                      + " | ".join(" / ".join(f"{v:.2f}" for v in r[i]) for r in rounds), flush=True)


if __name__ == "__main__":
    main()
