"""Run on the GPU machine: graph-replay time of the committed schedules of 8 x 2048² and 2 x 4096² as they are and
with precision="fp32" (the same panels, every product from fp32 inputs), in one run."""
import cupy
import numpy as np

from qrgen.bench import graph_time_us
from qrgen.runtime import factorizer_for

for batch, m, n in ((8, 2048, 2048), (2, 4096, 4096)):
    rng = np.random.default_rng(0)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    for precision in (None, "fp32"):
        fac = factorizer_for(m, n, batch, "sm_90", precision)
        fac.build()
        print(f"{batch} x {m}x{n} precision={precision}: graph replay {graph_time_us(fac, inputs, 10):,.1f} us "
              f"[{fac.schedule.describe()[-120:]}]", flush=True)
