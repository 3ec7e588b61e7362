"""Timing qrgen against torch.geqrf in one run: CUDA events, warm-up, L2 flushed, fresh inputs, median."""
from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

import numpy as np

from .compile.background import first_calls
from .plan import tf32x3
from .run.replay import end_capture

REFERENCE_CASES = ((20, 32, 32), (40, 176, 176), (40, 352, 352), (640, 512, 512), (60, 1024, 1024),
                   (8, 2048, 2048), (2, 4096, 4096))
SINGLE_TALL_CASES = ((1, 4096, 4096), (1, 2048, 2048), (1, 4096, 1024), (1, 8192, 512), (1, 100000, 32),
                     (1, 40000, 256))
SMALL_CASES = ((1000, 64, 64), (500, 128, 128), (100, 256, 256), (4000, 16, 16))  # many small matrices
UNTUNED_CASES = ((7, 300, 300), (500, 128, 128), (16, 256, 1024), (3, 3000, 3000))  # no shipped file of their own
FLUSH_BYTES = 256 << 20


def optimized(fn):
    """fn with the optimized kernels from its first call on (a first call's quick tier is never timed)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with first_calls("wait"):
            return fn(*args, **kwargs)
    return wrapper


@dataclass(frozen=True)
class Timing:
    batch: int
    m: int
    n: int
    qrgen_us: float
    torch_us: float | None
    factor: float
    orthogonality: float
    passed: bool
    graph_us: float | None = None  # the same call captured once in a CUDA graph and replayed (no Python per call)
    # The same call on batches of hostile matrices, by name: "mixed" (every stress family at random positions) or
    # one family of qrgen.numerics.stress (all matrices of it), with their µs.
    hostile: tuple[tuple[str, float], ...] = ()

    @property
    def speedup(self) -> float | None:
        return None if self.torch_us is None else self.torch_us / self.qrgen_us


def median_time_us(fn, inputs: list, reps: int, warmup: int = 3, framework: str = "cupy") -> float:
    """Median of reps runs of fn(x), x cycling through inputs, L2 flushed right before each by a 256 MB write with
    no host synchronization between it and the call; events on the framework's current stream (the stream the
    work runs on)."""
    import cupy

    flush = cupy.empty(FLUSH_BYTES // 4, dtype=cupy.float32)
    if framework == "torch":
        import torch

        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        elapsed_ms = lambda: start.elapsed_time(stop)  # noqa: E731
    else:
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        elapsed_ms = lambda: cupy.cuda.get_elapsed_time(start, stop)  # noqa: E731
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    times = []
    for i in range(reps):
        x = inputs[i % len(inputs)]
        flush.fill(float(i))
        start.record()
        fn(x)
        stop.record()
        stop.synchronize()
        times.append(elapsed_ms() * 1e3)
    return statistics.median(times)


def graph_time_us(fn, inputs: list, reps: int) -> float:
    """median_time_us of CUDA-graph replays, one graph captured per input from fn(x) on a non-blocking stream
    (after an eager warm-up), instantiated with node priorities as torch.cuda.CUDAGraph instantiates its graphs
    (replay.end_capture): the GPU time of a call without the host's per-call cost."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    graphs, outputs = [], []  # outputs stay alive while their graph is replayed
    with stream:
        for x in inputs:
            fn(x)
        stream.synchronize()
        for x in inputs:
            stream.begin_capture()
            try:
                outputs.append(fn(x))
            except BaseException:
                stream.end_capture()  # leave the stream usable; the capture is discarded
                raise
            graphs.append(end_capture(stream))
        return median_time_us(lambda graph: graph.launch(stream), graphs, reps, warmup=1)


def back_to_back_us(fn, calls: int = 100, rounds: int = 5) -> float:
    """GPU µs a call of fn() with `calls` of them captured back to back in one CUDA graph (after one eager
    warm-up; no flush, so the L2 stays warm): the kernels' own time, without launch gaps. Median of `rounds`
    replays; fn's outputs stay alive while the graph is replayed."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            outputs = [fn() for _ in range(calls)]  # noqa: F841
        finally:
            graph = end_capture(stream)
        graph.launch(stream)
        stream.synchronize()
        start, stop, times = cupy.cuda.Event(), cupy.cuda.Event(), []
        for _ in range(rounds):
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / calls)
    return float(np.median(times))


@optimized
def run_case(batch: int, m: int, n: int, reps: int = 20, with_torch: bool = True, torch_reps: int = 5,
             seed: int = 0, hostile: tuple[str, ...] = ()) -> Timing:
    """Time qrgen.geqrf (CuPy arrays) and torch.geqrf (on the same stream, same inputs) and check the gates.
    hostile: also time batches of these: "mixed" (every stress family at random positions) or a family's name."""
    import cupy

    from .api import geqrf
    from .numerics.check import check
    from .numerics.stress import mixed, stress
    from .run import replay

    replay.clear()  # each case starts as a process calling only this shape would (replay's caps are per process)
    rng = np.random.default_rng(seed)
    sets = max(2, min(4, (1 << 30) // max(1, batch * m * n * 4)))
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(sets)]
    geqrf(inputs[0])  # build or load the kernels outside the timing
    cupy.cuda.get_current_stream().synchronize()
    qrgen_us = median_time_us(geqrf, inputs, reps)
    try:
        graph_us = graph_time_us(geqrf, inputs, reps)
    except Exception as exc:  # reported in the table as missing, with the reason on stderr
        import sys

        print(f"graph capture of {batch}x{m}x{n} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        graph_us = None
    hostile_us = []
    for name in hostile:  # no structure is detected: a hostile batch must cost what a dense one does
        batches = [cupy.asarray(mixed(m, n, batch, seed=seed + 10 + i)[0] if name == "mixed"
                                else stress(name, m, n, batch, seed=seed + 10 + i)) for i in range(2)]
        hostile_us.append((name, median_time_us(geqrf, batches, reps)))
        del batches
    torch_us = None
    if with_torch:
        import torch

        tinputs = [torch.from_dlpack(x) for x in inputs]
        torch_us = median_time_us(torch.geqrf, tinputs, torch_reps, warmup=1, framework="torch")
    # The gates on a batch of every stress family (at most 64 matrices of this shape are checked on the host).
    check_batch = max(1, min(batch, 64 if m * n <= 1 << 20 else 4))
    a, _ = mixed(m, n, check_batch, seed=seed + 1)
    h, tau = geqrf(cupy.asarray(a))
    result = check(a, h, tau)
    f, o = result.worst()
    return Timing(batch, m, n, qrgen_us, torch_us, f, o, result.ok, graph_us, tuple(hostile_us))


def table(rows: list[Timing]) -> str:
    graph = any(r.graph_us is not None for r in rows)
    names = list(dict.fromkeys(name for r in rows for name, _ in r.hostile))  # hostile batches, in first-seen order
    lines = ["| batch x shape | qrgen µs |" + (" graph replay µs |" if graph else "")
             + "".join(f" {name} batch µs |" for name in names)
             + " torch.geqrf µs | speed-up | factor | orthogonality | gates |",
             "|---|---:|" + ("---:|" if graph else "") + "---:|" * len(names) + "---:|---:|---:|---:|---|"]
    for r in rows:
        shape = f"{r.m}²" if r.m == r.n else f"{r.m}x{r.n}"
        torch_us = "—" if r.torch_us is None else f"{r.torch_us:,.0f}"
        speed = "—" if r.speedup is None else f"{r.speedup:.1f}x"
        graph_cell = ""
        if graph:
            graph_cell = " — |" if r.graph_us is None else f" {r.graph_us:,.1f} |"
        times = dict(r.hostile)
        hostile_cells = "".join(" — |" if name not in times else
                                f" {times[name]:,.1f} ({times[name] / r.qrgen_us - 1:+.0%}) |" for name in names)
        lines.append(f"| {r.batch} x {shape} | {r.qrgen_us:,.1f} |{graph_cell}{hostile_cells} {torch_us} | {speed} | "
                     f"{r.factor:.2f} | "
                     f"{r.orthogonality:.2f} | {'pass' if r.passed else 'FAIL'} |")
    return "\n".join(lines)


def gemm_flops(fac, batch: int) -> float:
    """Floating-point operations of the trailing-update products (project and update) of one call."""
    return sum(w.flops for w in stage_work(fac, batch) if w.stage in ("own products", "aggregates' products"))


# The H200's ceilings as measured on the lent machine (../shared/gpu/README.md): FLOP/s of 8192³ products through
# PyTorch by input precision (tf32x3 is three tf32 products), and bytes/s of a device-to-device copy, read plus
# written.
CEILING_FLOPS = {"fp32": 51e12, "tf32": 400e12, "tf32x3": 400e12 / 3, "bf16": 750e12, "fp16": 750e12}
CEILING_BYTES = 4.2e12


@dataclass(frozen=True)
class StageWork:
    """What one stage of a factorization must do at the least, for all matrices of a call: floating-point
    operations by input precision, and bytes read plus written in global memory (each operand once per product,
    as the schedule's launches are split: a fused panel product reads C once, cuBLAS's two read it twice)."""

    stage: str
    flops_by: tuple[tuple[str, float], ...]
    bytes: float

    @property
    def flops(self) -> float:
        return sum(f for _, f in self.flops_by)

    @property
    def arithmetic_us(self) -> float:
        """The stage's time at the measured product ceilings (no latency, every SM busy)."""
        return 1e6 * sum(f / CEILING_FLOPS[p] for p, f in self.flops_by)

    @property
    def memory_us(self) -> float:
        """The stage's time at the measured copy bandwidth."""
        return 1e6 * self.bytes / CEILING_BYTES


def _householder_flops(rows: int, width: int) -> float:
    """Unblocked Householder QR of rows x width: a dot and an update of every column right of column j, over rows
    j and below (2 m w² - 2 w³ / 3 for large sizes)."""
    return float(sum(4 * (rows - j) * (width - j) for j in range(min(rows, width))))


def stage_work(fac, batch: int) -> tuple[StageWork, ...]:
    """The floors of each stage of fac's launch sequence (run/sequence.drive) for a call on `batch` matrices:
    the panel kernels (Householder on their columns; where they write V^T and (V T)^T also G = V^T V and V T,
    on fp32 cores), the panels' own products and the aggregates' products (W = Z^T C, C -= V W in the schedule's
    precisions; a panel's own in fp32 unless they go through cuBLAS), the aggregates' merge (G = V^T V, T, (V T)^T;
    an fp32 G in tf32x3 where the gram kernel may take it) and the power-of-two scaling where the schedule has it.
    Symmetric G and triangular T count half the operations of a full product: what the stage must do, not what
    its kernels do."""
    prec, f = fac.schedule.precision, 4.0 * batch  # f: bytes of a float, times the matrices
    panel_flops = panel_bytes = 0.0
    own: dict[str, float] = {}
    own_bytes = 0.0
    fused = fac.schedule.panel_update != "cublas"
    for L in fac.launches:
        r, w = L.rows, L.width
        panel_flops += _householder_flops(r, w) + (2.0 * r * w * w if L.trail else 0.0)  # G's half, V T
        panel_bytes += f * r * w * (4 if L.trail else 2)  # the panel read and written, V^T and (V T)^T written
        if L.nc:
            for p in (("fp32", "fp32") if fused else (prec.project, prec.update)):
                own[p] = own.get(p, 0.0) + 2.0 * r * w * L.nc
            own_bytes += f * (r * L.nc * (2 if fused else 3) + 2 * r * w + (0 if fused else 2 * w * L.nc))
    merge3 = prec.update == "tf32x3"
    gram = "tf32x3" if prec.gram == "fp32" and (merge3 or "gram" in tf32x3.kinds(fac.schedule)) else prec.gram
    agg: dict[str, float] = {}
    merge: dict[str, float] = {}
    agg_bytes = merge_bytes = 0.0
    for i, a in enumerate(fac.aggregates):
        if not a.nc:  # (the last aggregate: nothing to its right, so no merge)
            continue
        width, r = a.a1 - a.a0, a.rows
        fused_t = i in fac.plan.t_fused  # no (V T)^T: the projection applies T (the plan's rule, not t_fills')
        late = i in fac.plan.t_late  # nor here: W = T^T (V^T C) by a product of its own (never t_fused)
        merge[gram] = merge.get(gram, 0.0) + 1.0 * r * width * width  # G's upper half
        if fused_t:
            agg[prec.project] = agg.get(prec.project, 0.0) + 1.0 * width * width * a.nc  # T^T (V^T C), T triangular
        elif late:
            vt = "tf32x3" if merge3 else "fp32"
            merge[vt] = merge.get(vt, 0.0) + 1.0 * width * width * a.nc  # T^T Y, T triangular
        else:
            vt = "tf32x3" if merge3 else "fp32"
            merge[vt] = merge.get(vt, 0.0) + 1.0 * r * width * width  # (V T)^T, T triangular
        merge["fp32"] = merge.get("fp32", 0.0) + width ** 3 / 3.0  # T from G and tau
        merge_bytes += f * ((1 if fused_t or late else 3) * r * width + 2 * width * width
                            + (2 * width * a.nc if late else 0))  # T^T Y reads Y, writes W
        for p in (prec.project, prec.update):
            agg[p] = agg.get(p, 0.0) + 2.0 * r * width * a.nc
        agg_bytes += f * (3 * r * a.nc + 2 * r * width + 2 * width * a.nc)

    def work(stage, flops, nbytes):
        return StageWork(stage, tuple((p, v * batch) for p, v in sorted(flops.items())), nbytes)

    stages = [work("panels", {"fp32": panel_flops}, panel_bytes), work("own products", own, own_bytes),
              work("aggregates' products", agg, agg_bytes), work("merge", merge, merge_bytes)]
    if fac.schedule.scaled:  # the largest magnitude read, the copy scaled, R scaled back
        stages.append(work("scaling", {}, f * fac.m * fac.n * 4))
    return tuple(s for s in stages if s.flops or s.bytes)


def floors_text(fac, batch: int) -> str:
    """stage_work as lines of the profile: each stage's arithmetic and memory floors."""
    lines = ["  floors at the H200's measured ceilings (fp32 51, tf32 400, fp16 750 TFLOP/s; 4.2 TB/s):"]
    for w in stage_work(fac, batch):
        kinds = ", ".join(p for p, _ in w.flops_by) or "none"
        lines.append(f"    {w.stage}: {w.flops / 1e9:.3g} GFLOP ({kinds}) {w.arithmetic_us:,.1f} µs; "
                     f"{w.bytes / 1e6:.3g} MB {w.memory_us:,.1f} µs")
    lines.append(f"    panels: {fac.k} columns one after another, each a reduction over the panel's rows")
    return "\n".join(lines)


@optimized
def profile_case(batch: int, m: int, n: int, seed: int = 0, reps: int = 10, fac=None) -> str:
    """Where one factorization's GPU time goes, by difference: the call replayed as a CUDA graph in full, with the
    aggregates' merge (G, T, (VT)^T or for t_late aggregates W = T^T (V^T C); and each of its three stages alone)
    left out, with the panels' own products left out, and with only the panel kernels, so host gaps are not counted
    (events around each launch of an eager call would count them). Leaving stages out makes the result wrong but
    not the remaining work: no kernel's work depends on the values. Also the eager call, for the host's share.
    fac: a run.factorizer.Factorizer for m x n to profile (default: the shape's schedule for the batch)."""
    import cupy

    from .run.launch import device_target
    from .run.registry import factorizer_for

    rng = np.random.default_rng(seed)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    fac = fac or factorizer_for(m, n, batch, device_target(inputs[0].device.id))

    def timed(skip):
        return graph_time_us(lambda x: fac.run(x, cupy.cuda.get_current_stream(), skip), inputs, reps)

    eager = median_time_us(lambda x: fac.run(x, cupy.cuda.get_current_stream()), inputs, reps)
    full = timed(())
    merge_stages = ("gram", "tmat", "aggregate")
    no_merge = timed(merge_stages) if fac.aggregates else full
    panels = timed(("project", "update", "scale") + merge_stages)
    gemm = max(0.0, no_merge - panels)
    k = min(m, n)
    lines = [f"{batch} x {m}x{n}: {len(fac.launches)} panels ({fac.schedule.describe()})",
             f"  eager call {eager:,.1f} µs; graph replay {full:,.1f} µs (host's share of the eager call "
             f"{max(0.0, eager - full):,.1f} µs)",
             f"  panel kernels {panels:,.1f} µs ({panels / k:.2f} µs per column)",
             f"  trailing-update GEMMs {gemm:,.1f} µs ({gemm_flops(fac, batch) / max(gemm, 1e-9) / 1e6:.1f} TFLOP/s), "
             f"of which the panels' own products (left out alone) {max(0.0, full - timed(('own',))):,.1f} µs"]
    if fac.schedule.lookahead:
        lines.append("  (lookahead: each figure is what leaving the stage out saves; GEMM time hidden behind the "
                     "panels is in none of them)")
    if fac.schedule.scaled:
        lines.append(f"  power-of-two scaling (fp16 products) {max(0.0, full - timed(('scale',))):,.1f} µs")
    if fac.aggregates:
        parts = ", ".join(f"{label} {max(0.0, full - timed((stage,))):,.1f}"
                          for label, stage in (("G", "gram"), ("T", "tmat"), ("(VT)^T or T^T Y", "aggregate")))
        merges = sum(1 for a in fac.aggregates if a.nc > 0)
        lines.append(f"  aggregates' merge {max(0.0, full - no_merge):,.1f} µs over {merges} aggregates "
                     f"(each stage left out alone: {parts} µs)")
    lines.append(floors_text(fac, batch))
    return "\n".join(lines)


@optimized
def run_qr_case(batch: int, m: int, n: int, reps: int = 10, seed: int = 0) -> str:
    """qrgen.qr(mode="reduced") against torch.linalg.qr and cupy.linalg.qr on the same inputs, one markdown row:
    medians in µs and the speed-up over torch. CuPy's batched qr loops over the matrices; it is timed once on at
    most 64 of them and scaled, which the row says."""
    import cupy

    from .api import qr
    from .run import replay

    replay.clear()  # as run_case
    rng = np.random.default_rng(seed)
    inputs = [cupy.asarray(rng.standard_normal((batch, m, n), dtype=np.float32)) for _ in range(2)]
    qr(inputs[0])
    ours = median_time_us(qr, inputs, reps)
    import torch

    tin = [torch.from_dlpack(x) for x in inputs]
    theirs = median_time_us(lambda x: torch.linalg.qr(x, mode="reduced"), tin, 3, warmup=1, framework="torch")
    part = min(batch, 64)
    cupy_us = median_time_us(lambda x: cupy.linalg.qr(x[:part], mode="reduced"), inputs, 3, warmup=1) * batch / part
    scaled = "" if part == batch else f" (timed on {part}, scaled)"
    return (f"| {batch} x {m}x{n} | {ours:,.1f} | {theirs:,.0f} | {cupy_us:,.0f}{scaled} | "
            f"{theirs / ours:.1f}x |")


QR_CASES = REFERENCE_CASES + ((20000, 32, 32),)


def case_sets(qr: bool = False, tall: bool = False, small: bool = False, untuned: bool = False,
              cases: tuple = ()) -> tuple:
    """`qrgen bench`'s cases: the ones given, then the sets asked for in this order (tall, small, untuned; a case in
    two of them once); with neither, qr's defaults with qr=True, else the reference batches."""
    chosen = [*cases] + [c for flag, group in ((tall, SINGLE_TALL_CASES), (small, SMALL_CASES),
                                               (untuned, UNTUNED_CASES)) if flag for c in group]
    return tuple(dict.fromkeys(chosen)) or (QR_CASES if qr else REFERENCE_CASES)


MARKDOWN_FAMILIES = ("mixed", "rankdef", "normspread")  # the hostile batches of the reference table


def _cuda_version(number: int) -> str:
    """CUDA's version numbers as they are written: 13020 -> 13.2."""
    return f"{number // 1000}.{number % 1000 // 10}"


def environment_facts() -> dict:
    """The device, driver and library versions a table was measured with."""
    import datetime
    import importlib.metadata

    import cupy

    from .compile.nvrtc import version as nvrtc_version
    from .version import __version__

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    return dict(date=datetime.date.today().isoformat(), device=f"{props['name'].decode()} "
                f"(sm_{props['major']}{props['minor']}, {props['multiProcessorCount']} SMs)",
                driver=_cuda_version(cupy.cuda.runtime.driverGetVersion()),
                runtime=_cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
                nvrtc=".".join(map(str, nvrtc_version())), cupy=cupy.__version__, torch=torch_version,
                version=__version__)


def markdown_document(sections: list[tuple[str, str]], command: str, facts: dict) -> str:
    """BENCHMARKS.md: how the numbers are measured, then each (title, table) section, with the facts of the run."""
    from .render.environment import environment

    return environment().get_template("docs/BENCHMARKS.md.j2").render(
        command=command, sections=[{"title": t, "table": table} for t, table in sections], **facts)
