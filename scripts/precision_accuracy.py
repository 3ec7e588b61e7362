"""No GPU needed: the worst scaled residuals over the stress families of the default schedule of a shape with its
trailing-update stages in other precisions, by the NumPy reference in float32 with GEMM inputs rounded as each
stage says (round to nearest; cuBLAS may convert otherwise, so the GPU's gates have the last word).

    python scripts/precision_accuracy.py N BATCH
"""
import sys
import time
from dataclasses import replace

import numpy as np

from qrgen import reference
from qrgen.check import check
from qrgen.problem import Problem
from qrgen.schedule import Precision, default_schedule
from qrgen.testing import FAMILIES, stress

VARIANTS = [("fp32", Precision(), None),
            ("tf32 aggregate products, panels' own fp32 (split)", Precision("fp32", "tf32", "tf32"), "split"),
            ("tf32 aggregate update only", Precision("fp32", "fp32", "tf32"), "split"),
            ("tf32 everywhere (cuBLAS panels)", Precision("fp32", "tf32", "tf32"), "cublas")]


def main():
    n, batch = int(sys.argv[1]), int(sys.argv[2])
    base = default_schedule(Problem(n, n, batch))
    for label, precision, panel_update in VARIANTS:
        schedule = replace(base, precision=precision, panel_update=panel_update or base.panel_update)
        start = time.time()
        worst = []
        for family in FAMILIES:
            a = stress(family, n, n, 1, seed=3)
            h, tau = reference.geqrf(a, schedule, dtype=np.float32)
            worst.append((family, *check(a, h, tau).worst()))
        factor, family = max((w[1], w[0]) for w in worst)
        orth = max(w[2] for w in worst)
        print(f"{n}² {label}: worst factor {factor:.2f} ({family}), orthogonality {orth:.2f} "
              f"({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
