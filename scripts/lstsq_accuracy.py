"""Run on the GPU machine: qrgen.lstsq at 2048² and 4096² on the GPU test's matrices, against torch.linalg.lstsq.

    python scripts/lstsq_accuracy.py tf32|fp32

Per system: the forward error against the float64 solution, the backward ratio ||A^T r||_2 / (||A||_F (||A||_F
||x||_2 + ||b||_2) eps32) (the GPU test's) and cond(A). "fp32": qrgen with precision="fp32"; "tf32": the
schedule's own precision (tf32 aggregate products at these sizes).
"""
import sys

import cupy
import numpy as np
import torch

import qrgen
from qrgen.testing import stress

EPS32 = float(np.finfo(np.float32).eps)


def report(name, x, a, b, exact, cond, m):
    forward = ((x - exact).abs().amax(1) / exact.abs().amax(1).clamp(min=1)).cpu().numpy()
    r = b - (a @ x[..., None])[..., 0]
    norm_a = torch.linalg.norm(a, dim=(1, 2))
    normal = torch.linalg.norm((a.transpose(1, 2) @ r[..., None])[..., 0], dim=1)
    ratio = (normal / (norm_a * (norm_a * torch.linalg.norm(x, dim=1) + torch.linalg.norm(b, dim=1)) * EPS32))
    print(f"{m}: {name:>12}: forward error {np.array2string(forward, precision=2)}  backward ratio "
          f"{np.array2string(ratio.cpu().numpy(), precision=3)}  cond {np.array2string(cond, precision=0)}",
          flush=True)


def main():
    mode = sys.argv[1]
    for m in (2048, 4096):
        a = stress("random", m, m, 4, seed=1)
        b = np.random.default_rng(0).standard_normal((4, m)).astype(np.float32)
        a64 = torch.as_tensor(a, device="cuda", dtype=torch.float64)
        b64 = torch.as_tensor(b, device="cuda", dtype=torch.float64)
        exact = torch.linalg.solve(a64, b64)
        s = torch.linalg.svdvals(a64)
        cond = (s[:, 0] / s[:, -1]).cpu().numpy()
        x, _ = qrgen.lstsq(cupy.asarray(a), cupy.asarray(b), precision="fp32" if mode == "fp32" else None)
        theirs = torch.linalg.lstsq(torch.as_tensor(a, device="cuda"),
                                    torch.as_tensor(b, device="cuda")[..., None]).solution[..., 0]
        report(f"qrgen {mode}", torch.as_tensor(x, device="cuda").double(), a64, b64, exact, cond, m)
        report("torch fp32", theirs.double(), a64, b64, exact, cond, m)


if __name__ == "__main__":
    main()
