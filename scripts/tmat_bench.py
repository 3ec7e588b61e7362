"""Run on the GPU machine: the T kernel alone (runtime.tmatrix_gpu) for several (batch, reflectors), its time a
launch with 50 launches back to back in one CUDA graph, and its largest error against slarft's T in float64 (NumPy)
relative to T's largest entry. TAG names the tree on PYTHONPATH in the output (for A/B runs of two trees).

    python scripts/tmat_bench.py TAG"""
import sys
import numpy as np
import cupy
from qrgen import reference
from qrgen.bench import back_to_back_us
from qrgen.runtime import tmatrix_gpu
from qrgen.testing import stress

tag = sys.argv[1] if len(sys.argv) > 1 else "qrgen"
for batch, w in ((2, 128), (8, 128), (60, 128), (2, 256), (60, 64), (640, 32)):
    h, tau = reference.geqrf(stress("random", w + 40, w, min(batch, 4), seed=w).astype(np.float64))
    v = np.tril(h, -1)
    v[:, np.arange(w), np.arange(w)] = 1
    g = np.swapaxes(v, 1, 2) @ v
    reps = -(-batch // len(g))
    gg = cupy.asarray(np.concatenate([g] * reps)[:batch], dtype=cupy.float32)
    tt = cupy.asarray(np.concatenate([tau] * reps)[:batch], dtype=cupy.float32)
    want = reference._tmatrix(g, tau)
    got = tmatrix_gpu(gg, tt).get()[: len(g)]
    err = np.abs(got - want).max() / np.abs(want).max()
    b2b = back_to_back_us(lambda: tmatrix_gpu(gg, tt), calls=50, rounds=5)
    print(f"{tag} tmat batch {batch} w {w}: b2b {b2b:.1f} us, rel err {err:.2e}", flush=True)
