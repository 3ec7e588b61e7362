"""Compiling ahead: every kernel that the calls of a list of problems will need, compiled at once (in parallel over
all of them) into the kernel cache and, on a GPU, loaded, so that their first calls compile nothing. For services
that know their shapes, and for `qrgen warmup`."""
from __future__ import annotations

import time

from .api import keeps_q
from .compile.nvrtc import compile_many
from .problem import Problem
from .run.registry import factorizer_for
from .targets import Target


def warmup(cases, *, target: Target | None = None, qr: bool = True, jobs: int | None = None, log=None) -> dict:
    """Compile (and on a GPU load) the kernels of qrgen.geqrf, and with qr=True of qrgen.qr's reduced mode, for each
    (batch, m, n) of `cases`, on `target` (default: the current GPU's). Returns {"kernels": distinct kernels,
    "compiled": how many were not in the cache, "seconds": wall time}. Problems are validated before anything is
    compiled."""
    start = time.perf_counter()
    problems = [case if isinstance(case, Problem) else Problem(case[1], case[2], case[0]) for case in cases]
    on_gpu = target is None
    if on_gpu:
        import cupy

        from .run.launch import device_target

        device = cupy.cuda.Device().id
        target = device_target(device)
    factorizers = []
    for p in problems:
        fac = factorizer_for(p.m, p.n, p.batch, target)
        factorizers.append(fac)
        if qr and keeps_q(fac.schedule, len(fac.launches), p.batch * p.m * p.k):
            keep = fac.keep_variant()
            if keep is not None:
                factorizers.append(keep)
    items = {}
    for fac in factorizers:
        for item in fac.rendered():  # and the render index's entries, so that later processes render nothing
            items.setdefault(item, None)
    binaries = compile_many(list(items), target, jobs=jobs, progress=log)
    if on_gpu:
        for fac in factorizers:  # from the cache just filled: loading only
            fac.functions(device)
    return {"kernels": len(binaries), "compiled": sum(not b.cached for b in binaries),
            "seconds": time.perf_counter() - start}
