"""Q's two products per block on the GPU: qrgen.numerics.qmatrix.householder_product with its products in each of
Q_PRECISIONS (fp32 through cuBLAS, tf32x3 through the generated kernels), graph-replay and eager medians in two
rounds, and Q's gates on a batch of every stress family.

    python3 tools/q_products.py 2x4096x4096 8x2048x2048 60x1024x1024

qrgen.householder_product's choice of precision (docs/decisions.md#q-products-tf32x3) rests on what this prints.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import cupy
import numpy as np

import qrgen
from qrgen.bench import graph_time_us, median_time_us
from qrgen.numerics import qmatrix
from tools import cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", type=cases.case, metavar="BATCHxMxN",
                    default=[cases.case("2x4096x4096"), cases.case("8x2048x2048")],
                    help="default 2x4096x4096 8x2048x2048")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds, the precisions in turn (default 2)")
    args = ap.parse_args()
    for case in args.cases:
        batch, m, n = case.batch, case.m, case.n
        facts = [qrgen.geqrf(x) for x in cases.random_inputs(batch, m, n)]
        a = cases.hostile(m, n, min(batch, 4))
        h, tau = qrgen.geqrf(a)
        r = np.triu(h.get()[:, :min(m, n)])
        reps = 10 if batch * m * n <= 1 << 25 else 5
        for rnd in range(args.rounds):
            for precision in qmatrix.Q_PRECISIONS:
                def q(ht, p=precision):
                    return qmatrix.householder_product(ht[0], ht[1], precision=p)

                eager = median_time_us(q, facts, reps)
                graph = graph_time_us(q, facts, reps)
                gates = ""
                if rnd == 0:
                    f, o = cases.q_gates(a.get(), q((h, tau)).get(), r)
                    gates = f" factor {f.max():.2f} orthogonality {o.max():.2f}"
                print(f"{case} round {rnd} {precision}: eager {eager:,.1f} us, graph {graph:,.1f} us{gates}",
                      flush=True)
        del facts
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
