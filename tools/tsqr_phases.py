"""A tsqr panel's launches on the GPU: each launch of the first panel of a case's schedule alone, 20 back to back in
one CUDA graph (GPU time a launch), then the panel's launches together, and an empty launch of the same kernel.

    python3 tools/tsqr_phases.py 1x40000x256 [1x100000x32 ...] [--file SCHEDULE.json ...]

The case's schedule (its file, or the default heuristic; with --file, each file given, for every case) must start
with a tsqr panel (qrgen.plan.tsqr). The phases run again on what the last one left, which is fine for timing (no
NaN can arise from it), not for results.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

import cupy

from qrgen.plan import tsqr
from qrgen.problem import Problem
from qrgen.run.cuda_engine import CudaEngine
from qrgen.run.factorizer import Factorizer
from qrgen.run.recorded import Direct
from qrgen.run.workspace import Workspace
from qrgen.schedule.files import find, load
from tools import cases

COPIES = 20  # launches captured in one graph


def graph_us(stream, fn, copies: int = COPIES, reps: int = 5) -> float:
    """GPU µs of one fn() from `copies` of it captured in a CUDA graph, replayed `reps` times."""
    with stream:
        stream.begin_capture()
        for _ in range(copies):
            fn()
        g = stream.end_capture()
        g.launch(stream)
        stream.synchronize()
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        for _ in range(reps):
            g.launch(stream)
        b.record(stream)
        b.synchronize()
    return cupy.cuda.get_elapsed_time(a, b) * 1e3 / (copies * reps)


def report(case, target, path=None) -> None:
    batch, m, n = case.batch, case.m, case.n
    schedule, origin = (load(path)[0], path) if path else find(Problem(m, n, batch), target)
    fac = Factorizer(m, n, schedule, target)
    L = fac.launches[0]
    if not L.levels:
        raise SystemExit(f"{case}'s schedule ({origin}) does not start with a tsqr panel")
    (a,) = cases.random_inputs(batch, m, n, count=1)
    fac(a)
    device = a.device.id
    funcs = fac.functions(device)
    ws = Workspace(fac, batch, device)
    h = a.copy()
    tau = cupy.empty((batch, min(m, n)), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        engine = CudaEngine(fac, ws, funcs, batch, h.data.ptr, tau.data.ptr, None, None, device, Direct())
    _, func = funcs[L.kernel]
    phases = tsqr.tsqr_phases(L.levels, L.width)

    def one(ph):
        def go():  # the arguments of tsqr.SIGNATURE; the first panel's V^T and (VT)^T start their buffers
            engine.launch(func, (ph.tiles, engine.nb, 1), L.threads, L.shared_bytes, tsqr.SIGNATURE,
                          (engine.h_ptr, engine.h_ptr, engine.tau_ptr, ws.ptrs["reflectors"], ws.ptrs["panel_wy"],
                           ws.ptrs["tsqr_tree"], engine.strides["tsqr_tree"], ph.kind, ph.rows, ph.at, ph.out, ph.tau,
                           ph.t, ph.y, ph.v1, L.c0, L.v_ld, L.v_bs), stream=stream.ptr)
        return go

    def empty():  # a kind that matches no phase: the kernel returns at once
        engine.launch(func, (1, 1, 1), 32, 0, tsqr.SIGNATURE, (0,) * 7 + (99,) + (0,) * 10, stream=stream.ptr)

    print(f"{case}: {fac.schedule.describe()}; panel 0 levels (rows, tiles) {L.levels}")
    for ph in phases:
        h[...] = a
        print(f"   kind {ph.kind} rows {ph.rows:6d} tiles {ph.tiles:4d}: {graph_us(stream, one(ph)):8.1f} µs")
    fns = [one(ph) for ph in phases]
    print(f"   the panel's {len(phases)} launches: {graph_us(stream, lambda: [f() for f in fns], 5):8.1f} µs")
    print(f"   an empty launch: {graph_us(stream, empty):8.1f} µs", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", type=cases.case, metavar="BATCHxMxN", help="such as 1x40000x256")
    ap.add_argument("--file", action="append", default=[], help="a schedule file to time instead (repeatable)")
    args = ap.parse_args()
    target = cases.target()
    for case in args.cases:
        for path in args.file or [None]:
            report(case, target, path)


if __name__ == "__main__":
    main()
