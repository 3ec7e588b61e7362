"""Run on the GPU machine: each launch of a tsqr schedule's first panel alone, 20 back to back in one CUDA graph (GPU
time per launch), then the panel's launches together, and an empty launch of the same kernel.

    python scripts/tsqr_phases.py 1x40000x256 [1x100000x32 ...]

The shape's schedule (its file, or the default) must start with a tsqr panel. Phases run again on what the last
one left, which is fine for timing (no NaN can arise from it), not for results.
"""
import sys

import cupy
import numpy as np

from qrgen import codegen, runtime


def graph_us(stream, fn, copies=20, reps=5):
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


def main():
    for case in sys.argv[1:]:
        batch, m, n = (int(v) for v in case.split("x"))
        fac = runtime.factorizer_for(m, n, batch, "sm_90")
        a = cupy.asarray(np.random.default_rng(0).standard_normal((batch, m, n), dtype=np.float32))
        fac(a)
        funcs = fac._load(0)
        ws = runtime._Workspace(fac, batch, 0)
        h = a.copy()
        tau = cupy.empty((batch, min(m, n)), dtype=cupy.float32)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            eng = runtime._CupyEngine(fac, ws, funcs, h, tau, None, None, 0, None)
        L = fac.launches[0]
        if not L.levels:
            raise SystemExit(f"{case}'s schedule does not start with a tsqr panel")
        _, func = funcs[L.kernel]
        phases = codegen.tsqr_phases(L.levels, L.width)
        v, z = ("vt", 0), ("zt", 0)

        def one(ph):
            def go():
                eng._launch(func, (ph.tiles, eng.nb, 1), L.threads, 0, runtime._TSQR_PARAMS,
                            (eng.h_ptr, eng.h_ptr, eng.tau_ptr, ws.ptrs[v[0]], ws.ptrs[z[0]], ws.ptrs["ts"],
                             eng.strides["ts"], ph.kind, ph.rows, ph.at, ph.out, ph.tau, ph.t, ph.y, ph.v1, L.c0,
                             L.v_ld, L.v_bs), stream=stream.ptr)
            return go

        print(f"{case}: {fac.schedule.describe()}; panel 0 levels (rows, tiles) {L.levels}")
        for ph in phases:
            h[...] = a
            print(f"   kind {ph.kind} rows {ph.rows:6d} tiles {ph.tiles:4d}: {graph_us(stream, one(ph)):8.1f} µs")
        fns = [one(ph) for ph in phases]
        print(f"   the panel's {len(phases)} launches: {graph_us(stream, lambda: [f() for f in fns], 5):8.1f} µs")
        def empty():  # a kind that matches no phase: the kernel returns at once
            eng._launch(func, (1, 1, 1), 32, 0, runtime._TSQR_PARAMS, (0,) * 7 + (99,) + (0,) * 10,
                        stream=stream.ptr)

        print(f"   an empty launch: {graph_us(stream, empty):8.1f} µs")


if __name__ == "__main__":
    main()
