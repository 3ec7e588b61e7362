"""A Factorizer: the plan, compiled kernels and workspaces of one (m, n, schedule, target), and geqrf on device
arrays of that shape through the CUDA engine (graph replay where it pays, one launch where that is all)."""
from __future__ import annotations

import itertools
import logging
import math
import threading

from ..compile import background, index
from ..compile.nvrtc import Binary, cached, compile_many, compile_source
from ..plan import fused
from ..plan.family import PANEL_SIGNATURE, quick_level
from ..plan.planner import plan
from ..problem import Problem
from ..render.sources import render_all
from ..targets import Target
from . import replay
from .arrays import as_device_array, device_copy, on_caller_stream
from .cuda_engine import factor
from .launch import PackedArgs, launch_panel, load_function, sm_count
from .sequence import reads_input
from .workspace import Workspace

log = logging.getLogger("qrgen")  # what a first call compiles, at INFO (silent unless the caller configures logging)
_SERIALS = itertools.count(1)  # Factorizer.serial


class Factorizer:
    """The kernels and launch sequence for one (m, n, schedule, target); geqrf for any batch of that shape."""

    def __init__(self, m: int, n: int, schedule, target: Target = Target(), sources: dict[str, str] | None = None,
                 keep: bool = False):
        if (schedule.m, schedule.n) != (m, n):
            raise ValueError(f"schedule is for {schedule.m}x{schedule.n}, not {m}x{n}")
        # a number no other Factorizer of the process has, which keys its replay plans (run/replay.py): an id() is
        # reused once its object is gone, and a new factorizer would find the plan decided for the old one
        self.serial = next(_SERIALS)
        self.m, self.n, self.k = m, n, min(m, n)
        self.schedule = schedule
        self.target = target
        self.fused_clusters = fused.cluster_sizes(target)  # what its fused launches may take
        # keep: every panel's (or aggregate's) V^T and (VT)^T kept in a region of its own, from which Q is formed
        # after the factorization (run/sequence.drive_q)
        self.keep = keep
        self.plan = plan(schedule, target, keep)
        self.kernels, self.launches = self.plan.kernels, self.plan.launches
        self.shared_bytes = {k.name: k.shared_bytes for k in self.kernels}  # each kernel's dynamic shared memory
        self.aggregates, self.kept = self.plan.aggregates, self.plan.kept
        self.sources = sources  # rendered kernel sources by name (a generated module's files), else rendered here
        # A one-panel schedule with no columns right of its panel reads the input directly (no copy first) when it
        # is aligned for the kernel's loads (sequence.reads_input).
        vec = {k.name: k.vec for k in self.kernels}
        direct = reads_input(self)
        self.direct_vec = vec[self.launches[0].kernel] if direct else 0
        self._functions: dict[int, dict] = {}  # device id -> kernel name -> (module, function)
        # The kernel that writes qr's reduced Q and R in one launch, where the schedule has one (one lanes panel on
        # one block, nothing right of it: plan/lanes.fused_q_kernel), and its packed arguments per device.
        self.fused_q = next((k for k in self.kernels if k.formq), None)
        self.q_args: dict[int, PackedArgs] = {}
        self.lock = threading.Lock()
        self.binaries: list[Binary] = []
        # A first call's second tier (compile/background.py): the job compiling the optimized binaries while the
        # quick ones run, and the modules of the quick ones, kept loaded (a caller's graph may hold their kernels).
        self._job: background.Job | None = None
        self._retired: list[dict] = []
        self._source_of: dict[str, str] = {}  # kernel name -> source, for a rebuild
        # Workspaces kept per (device, batch, stream): calls on one stream reuse them in stream order.
        self._workspaces: dict[tuple, Workspace] = {}
        self._keep_variant: "Factorizer | None | bool" = False  # not yet made (keep_variant)
        # One kernel launch and nothing else: an eager call queues no more than a graph replay would.
        self.one_launch = direct and not self.launches[0].levels and (
            self.launches[0].blocks == 1 or self.launches[0].cluster)

    def keep_variant(self) -> "Factorizer | None":
        """The same schedule as a keep plan, for qr's Q (made once); None where a keep plan does not apply (a panel
        whose kept outputs would not fit its shared memory)."""
        if self._keep_variant is False:
            try:
                self._keep_variant = Factorizer(self.m, self.n, self.schedule, self.target, keep=True)
            except ValueError:
                self._keep_variant = None
        return self._keep_variant

    def rendered(self) -> list[tuple[str, str]]:
        """(name, source) of every kernel: a generated module's, else rendered here (and the render index's entries
        written: compile/index.py)."""
        if self.sources is not None:
            items = [(k.name, self.sources[k.name]) for k in self.kernels]
        else:
            items = [(r.name, r.source) for r in render_all(self.schedule, self.target, keep=self.keep)]
            index.record([(spec, source) for spec, (_, source) in zip(self.kernels, items)], self.schedule,
                         self.target)
        self._source_of = dict(items)
        return items

    def _source(self, name: str) -> str:
        if name not in self._source_of:
            self.rendered()
        return self._source_of[name]

    def _indexed(self) -> list[Binary] | None:
        """Every optimized binary from the cache through the render index (no rendering), or None where one misses."""
        if self.sources is not None:
            return None
        found = index.lookup(self.kernels, self.schedule, self.target)
        return None if None in found else found

    def build(self, use_cache: bool = True, progress=None) -> list[Binary]:
        """Render and compile every kernel, optimized (from the disk cache where it can, without rendering where the
        render index has them all)."""
        found = self._indexed() if use_cache else None
        if found is not None:
            self.binaries = found
            if progress is not None:
                for b in found:
                    progress(b)
            return found
        self.binaries = compile_many(self.rendered(), self.target, use_cache=use_cache, progress=progress)
        return self.binaries

    def prepare(self, batch: int | None = None) -> None:
        """The binaries of a first use, a call on `batch` matrices: optimized from the cache where all are there;
        else, for a call small enough (compile/background.py; batch None: never), in two tiers: quick ones for those
        missing and a job compiling their optimized ones."""
        what = f"{self.m}x{self.n} ({self.target.arch})"
        if batch is None or not background.tiered(Problem(self.m, self.n, batch).flops):
            self.build()
            if any(not b.cached for b in self.binaries):
                log.info("qrgen: compiled %d kernels of %s", sum(not b.cached for b in self.binaries), what)
            return
        indexed = self._indexed()
        if indexed is not None:
            self.binaries = indexed
            return
        items = self.rendered()
        found = [cached(name, src, self.target.arch, self.target.ptx) for name, src in items]
        missing = [item for item, b in zip(items, found) if b is None]
        if not missing:
            self.binaries = found
            return
        try:
            levels = {k.name: quick_level(k) for k in self.kernels}
            quick = iter(compile_many(missing, self.target, quick=levels))
            job = background.Job(missing, self.target)
        except (OSError, RuntimeError):  # no second process, or a kernel only the optimizer compiles: one tier
            self.build()
            return
        self.binaries = [b if b is not None else next(quick) for b in found]
        self._job = job
        log.info("qrgen: %d kernels of %s compiled quickly; the optimized ones compile in process %d",
                 len(missing), what, job.process.pid)

    @property
    def provisional(self) -> bool:
        """Whether quick binaries (a first call's) stand in while the optimized ones compile, here or in the keep
        plan made from this one (qr's)."""
        keep = self._keep_variant
        return self._job is not None or (isinstance(keep, Factorizer) and keep._job is not None)

    def finish(self) -> None:
        """Wait for the optimized binaries of a first call's second tier and change to them."""
        job = self._job
        if job is not None:
            job.wait()
            self._upgrade()

    def _upgrade(self) -> None:
        """Change the quick binaries for the optimized ones (compiled into the cache by the job; any not there are
        compiled now). Workspaces go too: their chunk of a cooperative launch depends on the kernel's occupancy."""
        with self.lock:
            if self._job is None:
                return
            quick = [b.name for b in self.binaries if b.quick]
            optimized = dict(zip(quick, compile_many([(name, self._source(name)) for name in quick],
                                                     self.target)))
            self.binaries = [optimized.get(b.name, b) for b in self.binaries]
            self._retired.extend(self._functions.values())
            self._functions = {}
            self._workspaces.clear()
            self._job = None
        log.info("qrgen: %dx%d (%s) now runs its optimized kernels", self.m, self.n, self.target.arch)

    def _rebuild(self, name: str) -> Binary:
        """One kernel compiled again, its cache entry replaced (the driver refused the cached binary)."""
        return compile_source(name, self._source(name), self.target.arch, ptx=self.target.ptx, refresh=True)

    def functions(self, device_id: int, batch: int | None = None) -> dict:
        """Kernel name -> (module, function) on a device, built and loaded on first use, a call on `batch` matrices
        (in two tiers where the cache misses and the call is small: compile/background.py)."""
        job = self._job
        if job is not None:
            if job.done():
                self._upgrade()
            else:
                import cupy

                if cupy.cuda.get_current_stream().is_capturing():  # a caller's graph keeps the optimized kernels
                    self.finish()
        funcs = self._functions.get(device_id)
        if funcs is not None:
            return funcs
        with self.lock:
            if device_id in self._functions:
                return self._functions[device_id]
            if not self.binaries:
                self.prepare(batch)
            specs = {k.name: k for k in self.kernels}
            funcs = {b.name: load_function(b, self.shared_bytes[b.name], specs[b.name],
                                           rebuild=lambda name=b.name: self._rebuild(name)) for b in self.binaries}
            self._functions[device_id] = funcs
            return funcs

    def capacity(self, func, threads: int, device_id: int) -> int:
        """Blocks of this kernel that can be resident at once on the device (for cooperative launches)."""
        import cupy

        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, threads, 0)
        return max(1, per_sm * sm_count(device_id))

    def __call__(self, a):
        """geqrf of a (..., m, n) float32 device array: returns (h, tau) of the same kind, on the same device."""
        arr = as_device_array(a)
        data = arr.data
        if data.ndim < 2:
            raise ValueError(f"qrgen.geqrf needs an array of shape (..., m, n); got shape {tuple(data.shape)}")
        m, n = data.shape[-2:]
        if (m, n) != (self.m, self.n):
            raise ValueError(f"this factorization is generated for {self.m}x{self.n} matrices; got {m}x{n} "
                             f"(shape {tuple(data.shape)}): build one for {m}x{n} or call qrgen.geqrf")
        return run_wrapped(self, arr)

    def profile(self, a) -> list:
        """Factor a (batch, m, n) CuPy array once with events around every launch; returns the synchronized
        (stage, launch, start, stop) list (see run/cuda_engine.factor)."""
        import cupy

        batch = a.shape[0]
        ws = Workspace(self, batch, a.device.id)
        h = a.copy(order="C")
        tau = cupy.empty((batch, self.k), dtype=cupy.float32)
        stages: list = []
        factor(self, h, tau, ws, a.device.id, stages=stages)
        cupy.cuda.get_current_stream().synchronize()
        return stages

    def run_qr(self, a, stream):
        """(q (batch, m, n), r (batch, n, n)) of qr's reduced mode by the fused kernel, for a (batch, m, n) CuPy array
        on `stream`; a is left as it is."""
        import cupy

        aligned = a.flags.c_contiguous and a.data.ptr % (4 * self.direct_vec) == 0
        src = a if aligned else device_copy(a, stream)
        q = cupy.empty((a.shape[0], self.m, self.n), dtype=cupy.float32)
        r = cupy.empty((a.shape[0], self.n, self.n), dtype=cupy.float32)
        self.launch_qr(a.device.id, a.shape[0], src.data.ptr, q.data.ptr, r.data.ptr, stream.ptr)
        return q, r

    def launch_qr(self, device_id: int, batch: int, src: int, q: int, r: int, stream: int) -> None:
        """The fused kernel's launch (run_qr) on raw pointers: src (batch, m, n) C-contiguous and aligned for its
        loads, q (batch, m, n) and r (batch, n, n) written."""
        _, func = self.functions(device_id, batch)[self.fused_q.name]
        L = self.launches[0]
        # The panel kernels' parameters (PANEL_SIGNATURE): R where h goes, Q where (VT)^T goes, no tau or workspace.
        args = self.q_args.get(device_id)
        if args is None:
            args = self.q_args[device_id] = PackedArgs(PANEL_SIGNATURE, (0, 0, 0, 0, 0, 0, 0, 0, 0, L.rows, L.v_ld,
                                                                         L.v_bs, batch))
        with self.lock:  # the packed values are shared by the calls on this device until the launch is queued
            args.set(0, src)
            args.set(1, r)
            args.set(4, q)
            launch_panel(func, L, batch, stream, args)

    def direct_workspace(self, a_ptr: int, batch: int, device_id: int, stream: int) -> "Workspace | None":
        """For a one-launch factorization (one_launch) of an input at a_ptr: the workspace that an earlier run on
        this device, batch and stream left with its packed arguments, where the input is aligned for the kernel's
        loads and the batch runs in one launch; else None."""
        ws = self._workspaces.get((device_id, batch, stream))
        if (ws is None or self._job is not None or 0 not in ws.panel_args or ws.chunk < batch
                or a_ptr % (4 * self.direct_vec)):
            return None
        return ws

    def launch_direct(self, ws: Workspace, a_ptr: int, batch: int, device_id: int, stream: int, h: int,
                      tau: int) -> None:
        """The launch of a one-launch factorization on raw pointers (direct_workspace): a (batch, m, n)
        C-contiguous read, h and tau written."""
        _, func = self._functions[device_id][self.launches[0].kernel]
        args = ws.panel_args[0]
        with self.lock:
            args.set(0, a_ptr)
            args.set(1, h)
            args.set(2, tau)
            launch_panel(func, self.launches[0], batch, stream, args)

    def run(self, a, stream, skip=(), q=None):
        """(h, tau) for a contiguous-or-not (batch, m, n) CuPy array on `stream`; a is left as it is. `skip`:
        stages left out, for timing by difference (qrgen.bench.profile); the result is then wrong. q (keep
        plans): a (batch, m, c) array holding the identity's first c columns (c = k or m), turned into Q's."""
        import cupy

        device_id = a.device.id
        if self._job is not None:  # a first call's second tier: changes to it here if it is done (or captured)
            self.functions(device_id)
        key = (device_id, a.shape[0], stream.ptr)
        workspace = self._workspaces.get(key)
        if workspace is None:
            if stream.is_capturing():  # inside a caller's capture: from the call's allocator (the graph's), not kept
                workspace = Workspace(self, a.shape[0], device_id)
            else:  # kept between calls: from CuPy's own pool, never from a caller's graph pool (torch's warm-ups)
                with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc):
                    workspace = self._workspaces[key] = Workspace(self, a.shape[0], device_id)
        tau = cupy.empty((a.shape[0], self.k), dtype=cupy.float32)
        direct = self.direct_vec and a.data.ptr % (4 * self.direct_vec) == 0
        # Schedule.scaled: the scale kernel copies the input into h (16-byte aligned where m n is a multiple of 4)
        scaled = self.schedule.scaled and a.data.ptr % 16 == 0
        if (direct or scaled) and a.flags.c_contiguous:
            h = cupy.empty(a.shape, dtype=cupy.float32)
            factor(self, h, tau, workspace, device_id, src=a, skip=skip, q=q)
        else:
            h = device_copy(a, stream)
            factor(self, h, tau, workspace, device_id, skip=skip, q=q)
        return h, tau


def run_wrapped(fac: "Factorizer | None", arr):
    h, tau = factor_device(fac, arr)
    return arr.wrap(h), arr.wrap(tau)


def factor_device(fac: "Factorizer | None", arr):
    """(h, tau) as CuPy arrays for the input's leading dimensions, on the caller's device and stream."""
    import cupy

    data = arr.data
    lead = data.shape[:-2]
    m, n = data.shape[-2:]
    k = min(m, n)
    with on_caller_stream(arr) as stream:
        batch = math.prod(lead)
        if batch and m and n:
            x = data if len(lead) == 1 else data.reshape(batch, m, n)
            if fac.one_launch:  # nothing for a graph replay to save
                h, tau = fac.run(x, stream)
            else:
                h, tau = replay.call(("geqrf", fac.serial), lambda s, y: fac.run(y, s), (x,), stream, fac,
                                     replay.GEQRF_MAX_FLOATS)
        else:
            h = cupy.empty((batch, m, n), dtype=cupy.float32)
            tau = cupy.empty((batch, k), dtype=cupy.float32)
        if len(lead) != 1:
            h = h.reshape(*lead, m, n)
            tau = tau.reshape(*lead, k)
    return h, tau
