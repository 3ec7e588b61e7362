"""qrgen.geqrf inside PyTorch programs: for each case, on torch tensors, the eager call, the same function compiled
with torch.compile(mode="reduce-overhead") (inductor's CUDA graphs replayed, fresh inputs copied in), and
torch.geqrf, timed as qrgen bench times (CUDA events, L2 flushed, warm-up, median), with the gates on the compiled
call's result.

    python3 tools/torch_replay.py 20x32x32 40x176x176 60x1024x1024 2x4096x4096 [--reps 20]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse

from tools import cases


def row(c, reps: int) -> str:
    import numpy as np
    import torch

    import qrgen
    from qrgen.bench import median_time_us
    from qrgen.numerics.stress import mixed

    rng = np.random.default_rng(0)
    inputs = [torch.from_numpy(rng.standard_normal((c.batch, c.m, c.n), dtype=np.float32)).cuda() for _ in range(3)]
    compiled = torch.compile(lambda x: qrgen.geqrf(x), mode="reduce-overhead", fullgraph=True,
                             dynamic=False)
    eager = median_time_us(qrgen.geqrf, inputs, reps, warmup=3, framework="torch")
    replay = median_time_us(compiled, inputs, reps, warmup=5, framework="torch")
    ref = median_time_us(torch.geqrf, inputs, max(3, reps // 4), warmup=1, framework="torch")
    host, _ = mixed(c.m, c.n, c.batch, seed=1)
    h, tau = compiled(torch.from_numpy(host).cuda())
    ok = qrgen.check(host, h.cpu().numpy(), tau.cpu().numpy()).ok
    return (f"| {c.batch} x {c.m}x{c.n} | {eager:,.1f} | {replay:,.1f} | {ref:,.0f} | {ref / replay:.1f}x | "
            f"{'pass' if ok else 'FAIL'} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", type=cases.case, help="BATCHxMxN cases")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    print("| case | qrgen.geqrf eager µs | reduce-overhead replay µs | torch.geqrf µs | speed-up (replay) | gates |")
    print("|---|---:|---:|---:|---:|---|")
    for c in args.cases:
        print(row(c, args.reps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
