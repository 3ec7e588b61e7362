"""Two checkouts of qrgen timed against each other in one run: for each case, each checkout in its own process, in
turn for several rounds, qrgen.geqrf (or qrgen.qr) eager (CUDA events around one call, the L2 flushed by a 256 MB
write right before it, no host synchronization between) and as CUDA-graph replays, medians of fresh random inputs;
and the digest of the results on a seeded batch of every stress family, to show the two are bit-identical.

    python3 tools/ab_mains.py OLD_ROOT NEW_ROOT [BATCHxMxN ...] [--function qr] [--rounds 2] [--reps 20] [--out F]

(the seven reference batches by default). Each worker imports only the public qrgen.geqrf or qrgen.qr of its
checkout."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

REFERENCE = ("20x32x32", "40x176x176", "40x352x352", "640x512x512", "60x1024x1024", "8x2048x2048", "2x4096x4096")
FLUSH_BYTES = 256 << 20


def _median_us(cupy, fn, inputs, reps, warmup=3):
    flush = cupy.empty(FLUSH_BYTES // 4, dtype=cupy.float32)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    cupy.cuda.get_current_stream().synchronize()
    times = []
    for i in range(reps):
        x = inputs[i % len(inputs)]
        flush.fill(float(i))
        start.record()
        fn(x)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3)
    return statistics.median(times)


def _end_capture():
    try:
        from qrgen.run.replay import end_capture
    except ImportError:
        from qrgen.replay import end_capture
    return end_capture


def _mixed():
    try:
        from qrgen.numerics.stress import mixed
    except ImportError:
        from qrgen.testing import mixed
    return mixed


def worker(case: str, reps: int, digest: bool, function: str = "geqrf") -> dict:
    import cupy
    import qrgen

    batch, m, n = (int(v) for v in case.split("x"))
    call = getattr(qrgen, function)
    sets = max(2, min(4, (1 << 30) // (batch * m * n * 4)))
    rng = cupy.random.default_rng(0)
    inputs = [rng.standard_normal((batch, m, n), dtype=cupy.float32) for _ in range(sets)]
    call(inputs[0])
    cupy.cuda.get_current_stream().synchronize()
    eager = _median_us(cupy, call, inputs, reps)
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs, outputs = [], []
    end_capture = _end_capture()
    with stream:
        for x in inputs:
            call(x)
        stream.synchronize()
        for x in inputs:
            stream.begin_capture()
            outputs.append(call(x))
            graphs.append(end_capture(stream))
        graph = _median_us(cupy, lambda g: g.launch(stream), graphs, reps, warmup=1)
    out = {"eager_us": eager, "graph_us": graph}
    if digest:  # h and tau of a batch of every stress family (up to 64 matrices), and of the first timed input
        a, _ = _mixed()(m, n, min(batch, 64), seed=1)
        parts = call(cupy.asarray(a)) + call(inputs[0])
        out["digest"] = hashlib.sha256(b"".join(cupy.asnumpy(x).tobytes() for x in parts)).hexdigest()
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("cases", nargs="*", default=list(REFERENCE))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    p.add_argument("--function", default="geqrf", choices=("geqrf", "qr"), help="the call timed (default geqrf)")
    args = p.parse_args()
    results = {}
    for case in args.cases:
        runs = {"old": [], "new": []}
        for r in range(args.rounds):
            order = (("old", args.old), ("new", args.new))
            for label, root in order if r % 2 == 0 else order[::-1]:
                path = [os.path.abspath(root)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "QRGEN_FIRST_CALL": "wait"}
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", case, str(args.reps),
                                      "1" if r == 0 else "0", args.function],
                                     env=env, cwd=root, capture_output=True, text=True)
                if out.returncode:
                    print(f"{case} {label}: failed\n{out.stderr[-3000:]}", flush=True)
                    runs[label].append(None)
                    continue
                runs[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
        results[case] = runs
        row = {}
        for label in ("old", "new"):
            ok = [r for r in runs[label] if r]
            row[label] = (statistics.median(r["eager_us"] for r in ok) if ok else float("nan"),
                          statistics.median(r["graph_us"] for r in ok) if ok else float("nan"),
                          {r["digest"] for r in ok if "digest" in r})
        same = row["old"][2] == row["new"][2] and len(row["old"][2]) == 1
        print(f"| {case} | {row['old'][0]:,.1f} | {row['new'][0]:,.1f} | {row['new'][0] / row['old'][0] - 1:+.1%} | "
              f"{row['old'][1]:,.1f} | {row['new'][1]:,.1f} | {row['new'][1] / row['old'][1] - 1:+.1%} | "
              f"{'identical' if same else 'DIFFERENT'} |", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
