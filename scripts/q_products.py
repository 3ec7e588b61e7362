"""Run on the GPU machine: qrgen.qmatrix.householder_product with its two products per block in fp32 (cuBLAS)
against tf32x3 (the gemm3 kernels), graph-replay and eager medians in two rounds, and Q's gates on a mixed batch.

    python scripts/q_products.py 2x4096x4096 8x2048x2048 60x1024x1024

The library's own choice (qr's Q where no keep plan applies, qrgen.householder_product) stays fp32 until this says
otherwise (BENCHMARKS.md)."""
import sys

import cupy
import numpy as np

sys.path.insert(0, "tests")
import qrgen  # noqa: E402
from qrgen import qmatrix  # noqa: E402
from qrgen.bench import graph_time_us, median_time_us  # noqa: E402
from qrgen.testing import mixed  # noqa: E402
from test_qmatrix import _q_gates  # noqa: E402

for case in sys.argv[1:] or ["2x4096x4096", "8x2048x2048"]:
    batch, m, n = (int(v) for v in case.split("x"))
    rng = np.random.default_rng(0)
    facts = [qrgen.geqrf(cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32))) for _ in range(2)]
    a, _ = mixed(m, n, min(batch, 4), seed=1)
    h, tau = qrgen.geqrf(cupy.asarray(a))
    r = np.triu(h.get()[:, :min(m, n)])
    reps = 10 if batch * m * n <= 1 << 25 else 5
    for rnd in range(2):
        for precision in qmatrix.Q_PRECISIONS:
            def q(ht, p=precision):
                return qmatrix.householder_product(ht[0], ht[1], precision=p)

            eager = median_time_us(q, facts, reps)
            graph = graph_time_us(q, facts, reps)
            gates = ""
            if rnd == 0:
                f, o = _q_gates(a, qmatrix.householder_product(h, tau, precision=precision).get(), r)
                gates = f" factor {f.max():.2f} orthogonality {o.max():.2f}"
            print(f"{case} round {rnd} {precision}: eager {eager:,.1f} us, graph {graph:,.1f} us{gates}", flush=True)
    del facts
    cupy.get_default_memory_pool().free_all_blocks()
