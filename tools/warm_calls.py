"""Warm first calls: for each case, one process fills a cache folder of its own (qrgen.warmup, optimized kernels),
then fresh processes on that cache time qrgen.geqrf's first call (the GPU context made and the input on the GPU
before the clock starts; the call synchronized), and one more process runs the first call under cProfile and
reports where it went: the kernels' preparation (the cache and render index look-ups, or rendering), the modules'
loading, cuBLAS (its library, handles, GEMMs), the workspaces and the rest.

    python3 tools/warm_calls.py 3x3000x3000 60x1024x1024 2x4096x4096 1x20000x100 [--repeat 5] [--out warm.json]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import statistics
import tempfile
import time

from tools.first_calls import worker_result

# (label, file suffix, function) whose cumulative time a profiled first call reports; a label sums its functions
PARTS = (
    ("prepare", "qrgen/run/factorizer.py", "prepare"),
    ("render", "qrgen/render/sources.py", "render"),
    ("index", "qrgen/compile/index.py", "lookup"),
    ("nvrtc_load", "qrgen/compile/nvrtc.py", "_library"),
    ("module_load", "qrgen/run/launch.py", "load_function"),
    ("cublas_library", "qrgen/run/cublas.py", "_library"),
    ("cublas_handles", "qrgen/run/cublas.py", "_handle"),
    ("cublas_gemms", "qrgen/run/cublas.py", "gemm"),
    ("workspaces", "qrgen/run/workspace.py", "__init__"),
    ("plan", "qrgen/run/registry.py", "factorizer_for"),
    ("device_target", "qrgen/run/launch.py", "device_target"),
)


def fill(text: str) -> dict:
    import qrgen
    from tools import cases

    c = cases.case(text)
    return qrgen.warmup([(c.batch, c.m, c.n)], qr=False)


def worker(text: str, profile: bool) -> dict:
    import cupy

    import qrgen
    from qrgen.numerics.stress import mixed

    from tools import cases

    c = cases.case(text)
    host, _ = mixed(c.m, c.n, c.batch, seed=3)
    a = cupy.asarray(host)
    sync = cupy.cuda.get_current_stream().synchronize
    sync()
    out = {"case": text}
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    start = time.perf_counter()
    h, tau = qrgen.geqrf(a)
    sync()
    out["first_call_s"] = time.perf_counter() - start
    if profile:
        prof.disable()
        stats = pstats.Stats(prof).stats
        for label, suffix, func in PARTS:
            out[label + "_s"] = sum(v[3] for (path, _, name), v in stats.items()
                                    if path.replace(os.sep, "/").endswith(suffix) and name == func)
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]  # the most time spent in a function itself
        out["top_own_s"] = [(f"{Path(path).name}:{line}({name})", round(v[2], 4)) for (path, line, name), v in top]
    from qrgen.run.launch import current_target
    from qrgen.run.registry import made

    fac = made(c.m, c.n, c.batch, current_target())
    out["kernels"] = len(fac.binaries)
    out["all_cached"] = all(b.cached and not b.quick for b in fac.binaries)
    start = time.perf_counter()
    qrgen.geqrf(a)
    sync()
    out["second_call_s"] = time.perf_counter() - start
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="BATCHxMxN cases")
    p.add_argument("--repeat", type=int, default=5, help="fresh processes timing the first call per case")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--worker", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        text, mode = args.worker
        print(json.dumps(fill(text) if mode == "fill" else worker(text, mode == "profile")))
        return 0
    if not args.cases:
        p.error("give at least one BATCHxMxN case")
    root = Path(__file__).resolve().parent.parent
    results = []
    for text in args.cases:
        with tempfile.TemporaryDirectory(prefix="qrgen-warm-") as folder:
            env = {**os.environ, "QRGEN_CACHE_DIR": os.path.join(folder, "cache"),
                   "CUDA_CACHE_PATH": os.path.join(folder, "driver"), "QRGEN_FIRST_CALL": "wait"}
            runs = []
            for mode in ["fill"] + ["time"] * args.repeat + ["profile"]:
                result = worker_result(__file__, [text, mode], env, root, f"{text} {mode}")
                if result is None:
                    break
                runs.append((mode, result))
            else:
                times = [r["first_call_s"] for mode, r in runs if mode == "time"]
                result = {"case": text, "filled": runs[0][1], "first_call_s": times,
                          "median_s": statistics.median(times), "profiled": runs[-1][1]}
                results.append(result)
                print(json.dumps(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
