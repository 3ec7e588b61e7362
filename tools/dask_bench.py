"""qrgen.dask against plain qrgen on the same data: a batch BATCHxMxN split into chunks of each size given, and a
tall MxN matrix split into row chunks, on a dask-cuda cluster of one worker per GPU used (the input persisted on the
workers first; the clock around persisting the results and waiting for them), beside plain qrgen.geqrf / qrgen.qr
of the whole array on one GPU (the clock around one call and a synchronize). Median of --reps after a warm-up, ms.

    python3 tools/dask_bench.py --batch 640x512x512 --chunks 20 40 80 160 320 640 --tall 20000000x256 \
        --rows 1000000 2500000 --gpus 1 2 4
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import statistics
import time

import cupy
import dask.array as da
from distributed import Client, wait

import qrgen
import qrgen.dask as qd
from tools import cases


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def plain_ms(fn, a, reps: int) -> float:
    def call():
        fn(a)
        cupy.cuda.runtime.deviceSynchronize()
    return median_ms(call, reps)


def dask_ms(client, make, op, reps: int) -> float:
    """Median ms of persisting op's results on the workers and waiting for them, each time on a fresh input: a dask
    array of random float32 CuPy chunks made on the workers beforehand (make(seed)), so no result is reused."""
    times = []
    for seed in range(reps + 1):  # the first: warm-up
        x = client.persist(make(seed))
        wait(x)
        start = time.perf_counter()
        out = client.persist(list(op(x)))
        wait(out)
        times.append((time.perf_counter() - start) * 1e3)
        del x, out
    return statistics.median(times[1:])


def random_chunks(shape, chunks):
    return lambda seed: da.random.RandomState(seed, RandomState=cupy.random.RandomState).standard_normal(
        shape, chunks=chunks, dtype="float32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=cases.case, default=None, metavar="BATCHxMxN")
    ap.add_argument("--chunks", type=int, nargs="*", default=[], help="matrices a chunk of the batch")
    ap.add_argument("--tall", default=None, metavar="MxN")
    ap.add_argument("--rows", type=int, nargs="*", default=[], help="rows a chunk of the tall matrix")
    ap.add_argument("--gpus", type=int, nargs="*", default=[1])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from dask_cuda import LocalCUDACluster

    results = []
    plain = {}
    if args.batch:
        c = args.batch
        a = cupy.random.standard_normal((c.batch, c.m, c.n), dtype=cupy.float32)
        plain["batch geqrf"] = plain_ms(qrgen.geqrf, a, args.reps)
        del a
    if args.tall:
        m, n = (int(v) for v in args.tall.split("x"))
        a = cupy.random.standard_normal((m, n), dtype=cupy.float32)
        plain["tall geqrf"] = plain_ms(qrgen.geqrf, a, args.reps)
        plain["tall qr"] = plain_ms(qrgen.qr, a, args.reps)
        del a
    cupy.get_default_memory_pool().free_all_blocks()
    print(json.dumps({"plain_ms": plain}), flush=True)
    for gpus in args.gpus:
        if gpus > cupy.cuda.runtime.getDeviceCount():
            print(json.dumps({"gpus": gpus, "skipped": "not that many GPUs"}), flush=True)
            continue
        with LocalCUDACluster(n_workers=gpus, dashboard_address=None) as cluster, Client(cluster) as client:
            if args.batch:
                c = args.batch
                for chunk in args.chunks:
                    make = random_chunks((c.batch, c.m, c.n), (chunk, c.m, c.n))
                    ms = dask_ms(client, make, qd.geqrf, args.reps)
                    row = {"gpus": gpus, "case": str(c), "chunk": chunk, "op": "geqrf", "dask_ms": ms,
                           "plain_ms": plain["batch geqrf"]}
                    results.append(row)
                    print(json.dumps(row), flush=True)
            if args.tall:
                m, n = (int(v) for v in args.tall.split("x"))
                for rows in args.rows:
                    for op, fn in (("geqrf", qd.geqrf), ("qr", qd.qr)):
                        ms = dask_ms(client, random_chunks((m, n), (rows, n)), fn, args.reps)
                        row = {"gpus": gpus, "case": args.tall, "chunk": rows, "op": op, "dask_ms": ms,
                               "plain_ms": plain[f"tall {op}"]}
                        results.append(row)
                        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
