"""First calls with an empty kernel cache and with a warm one: for each case, a fresh process with a cache folder
of its own (and a driver compute cache of its own, where NVRTC keeps what it compiles too) times qrgen.geqrf's
first call (the GPU context made and the input, a batch of every stress family, on the GPU before the clock
starts), one call on the quick tier while it lasts, the wait until the optimized binaries are in and a call on
those; then it checks both results against the gates (after the second tier is done: the host's float64 checks
would compete with it), whether they are bit-identical, and times qrgen.qr's first call. A second fresh process on
the same caches times the warm first calls. With --wait, a third process times the cold first call with
QRGEN_FIRST_CALL=wait (one tier, the optimized binaries first).

    python3 tools/first_calls.py 59x1024x1024 1000x64x64 [--wait] [--out first.json]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time


def worker_result(script: str, args: list, env: dict, cwd, label: str) -> dict | None:
    """The JSON result (the last line of its output) of `script --worker ARGS` in a fresh process, or None after
    printing its error where it failed."""
    run = subprocess.run([sys.executable, script, "--worker", *args], env=env, cwd=cwd, capture_output=True,
                         text=True)
    if run.returncode:
        print(f"{label}: failed\n{run.stderr[-3000:]}", flush=True)
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


def _calls_us(fn, sync, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def worker(text: str, phase: str) -> dict:
    start = time.perf_counter()
    import cupy
    import numpy as np

    import qrgen
    from qrgen.numerics.stress import mixed
    from qrgen.run.launch import current_target
    from qrgen.run.registry import made

    from tools import cases

    c = cases.case(text)
    host, _ = mixed(c.m, c.n, c.batch, seed=3)
    a = cupy.asarray(host)
    sync = cupy.cuda.get_current_stream().synchronize
    sync()
    out = {"case": text, "phase": phase, "import_and_context_s": time.perf_counter() - start}
    t0 = time.perf_counter()
    h, tau = qrgen.geqrf(a)
    sync()
    t1 = time.perf_counter()
    out["first_call_s"] = t1 - t0
    fac = made(c.m, c.n, c.batch, current_target())
    out["quick_binaries"] = sum(b.quick for b in fac.binaries)
    out["binaries"] = len(fac.binaries)
    out["compile_max_s"] = max(b.seconds for b in fac.binaries)  # each kernel's own, compiled in parallel
    out["compile_sum_s"] = sum(b.seconds for b in fac.binaries)
    out["slowest"] = sorted(((round(b.seconds, 2), b.name) for b in fac.binaries), reverse=True)[:4]
    if fac.provisional:  # the host's float64 checks wait until the second tier is done: they would compete with it
        quick_us = _calls_us(lambda: qrgen.geqrf(a), sync, reps=1)
        out["quick_call_us"] = quick_us if fac.provisional else None  # None: the optimized ones came in meanwhile
        fac.finish()
        out["optimized_after_s"] = time.perf_counter() - t1
        h2, tau2 = qrgen.geqrf(a)
        out["bit_identical"] = bool((h2 == h).all() and (tau2 == tau).all())
        out["gates_optimized"] = bool(qrgen.check(host, h2.get(), tau2.get()).ok)
    out["gates"] = bool(qrgen.check(host, h.get(), tau.get()).ok)
    out["optimized_call_us"] = _calls_us(lambda: qrgen.geqrf(a), sync)
    t2 = time.perf_counter()
    q, r = qrgen.qr(a)
    sync()
    out["qr_first_call_s"] = time.perf_counter() - t2
    out["qr_gates"] = bool(np.isfinite(r.get()).all())
    keep = fac.keep_variant()
    if keep is not None:
        keep.finish()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="BATCHxMxN cases")
    p.add_argument("--wait", action="store_true", help="also the cold first call with QRGEN_FIRST_CALL=wait")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--worker", nargs=2, metavar=("CASE", "PHASE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    if not args.cases:
        p.error("give at least one BATCHxMxN case")
    root = Path(__file__).resolve().parent.parent
    results = []
    for text in args.cases:
        with tempfile.TemporaryDirectory(prefix="qrgen-first-") as cache:
            phases = [("cold", "quick"), ("warm", "quick")]
            if args.wait:
                phases.append(("cold-wait", "wait"))
            for phase, mode in phases:
                folder = os.path.join(cache, "wait" if mode == "wait" else "tiers")
                # NVRTC 12.9+ also keeps what it compiles in the driver's compute cache: cold means both empty
                env = {**os.environ, "QRGEN_CACHE_DIR": folder, "CUDA_CACHE_PATH": folder + "-driver",
                       "QRGEN_FIRST_CALL": mode}
                result = worker_result(__file__, [text, phase], env, root, f"{text} {phase}")
                if result is None:
                    continue
                results.append(result)
                print(json.dumps(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
