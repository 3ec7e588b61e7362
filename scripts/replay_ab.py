"""Run on the GPU machine: eager qrgen.geqrf and qrgen.qr medians (L2 flushed, 10 runs) with the replay of
qrgen.replay as it is ("off" above its size caps) and with the caps lifted ("on": every call from the second on
replays a captured graph with copies in and out), the gates (geqrf) or max |QR - A| (qr) of one call each.

    python scripts/replay_ab.py 8x2048x2048 2x4096x4096"""
import sys
import cupy
import qrgen
from qrgen import replay
from qrgen.bench import median_time_us
from qrgen.check import check

for case in sys.argv[1:]:
    batch, m, n = (int(x) for x in case.split("x"))
    inputs = [cupy.random.standard_normal((batch, m, n), dtype=cupy.float32) for _ in range(2)]
    for name, fn in (("geqrf", qrgen.geqrf), ("qr", qrgen.qr)):
        row = []
        for cap in ("off", "on"):
            replay.clear()
            g0, r0 = replay.GEQRF_MAX_FLOATS, replay.REPLAY_MAX_FLOATS
            if cap == "on":
                replay.GEQRF_MAX_FLOATS = replay.REPLAY_MAX_FLOATS = 1 << 40
            try:
                t = median_time_us(fn, inputs, 10, warmup=3)
                if name == "geqrf":
                    h, tau = fn(inputs[0])
                    res = check(inputs[0], h, tau)
                    ok = f"factor {float(res.factor.max()):.2f} orth {float(res.orthogonality.max()):.2f}"
                else:
                    q, r = fn(inputs[0])
                    ok = f"|QR-A| {float(cupy.abs(q @ r - inputs[0]).max()):.2e}"
            finally:
                replay.GEQRF_MAX_FLOATS, replay.REPLAY_MAX_FLOATS = g0, r0
            row.append(f"{cap} {t:,.0f} us ({ok})")
        print(f"{case} {name} eager: " + " | ".join(row), flush=True)
    replay.clear()
