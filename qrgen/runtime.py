"""Running a schedule on the GPU: array interop (torch, CuPy, DLPack), kernel loading and the launch sequence."""
from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from . import codegen, cublas, replay
from .compile import Binary, compile_many
from .problem import Problem, Target
from .schedule import PORTABLE_CLUSTER, Schedule, check_precision, find

_KDLCUDA = 2


# ---------------------------------------------------------------------------------------------------------------
# Arrays in and out


@dataclass
class _Array:
    """The input seen as a CuPy array (no copy), and how to hand results back as the caller's kind."""

    data: object  # cupy.ndarray
    stream_ptr: int | None  # the caller's current stream (torch), None for CuPy's current stream
    wrap: object = field(default=None)


def _describe(a) -> str:
    return f"{type(a).__module__}.{type(a).__qualname__}"


def as_device_array(a) -> _Array:
    """Accept a torch.Tensor, cupy.ndarray or any object with __dlpack__ on a CUDA device, without copying."""
    import cupy

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        if a.device.type != "cuda":
            raise TypeError(f"qrgen needs a CUDA tensor; got a torch.Tensor on {a.device}: move it with a.cuda()")
        _check_dtype(str(a.dtype).replace("torch.", ""))
        if a.is_neg():  # a lazily negated view: its memory holds -a
            a = a.resolve_neg()
        device = a.get_device()
        return _Array(_cupy_view(cupy, a, device), _torch_stream(torch, device), torch.from_dlpack)
    if isinstance(a, cupy.ndarray):
        _check_dtype(str(a.dtype))
        return _Array(a, None, lambda x: x)
    if isinstance(a, np.ndarray) or not hasattr(a, "__dlpack__"):
        hint = " (a NumPy array lives on the host: use cupy.asarray(a))" if isinstance(a, np.ndarray) else ""
        raise TypeError(f"qrgen takes a float32 array on a CUDA device (torch.Tensor, cupy.ndarray or any "
                        f"__dlpack__ array); got a host or unknown array {_describe(a)}{hint}")
    device_type, _ = a.__dlpack_device__()
    if int(device_type) != _KDLCUDA:
        raise TypeError(f"qrgen takes arrays on a CUDA device; {_describe(a)} is on DLPack device type "
                        f"{int(device_type)} (1 is the host)")
    dtype = getattr(a, "dtype", None)
    if dtype is not None:
        _check_dtype(str(dtype))
    data = cupy.from_dlpack(a)
    _check_dtype(str(data.dtype))
    module = sys.modules.get(type(a).__module__.split(".")[0])
    back = getattr(module, "from_dlpack", None) if module is not None else None
    return _Array(data, None, back or (lambda x: x))


def _cupy_view(cupy, a, device: int):
    """A CuPy array over a CUDA float32 torch.Tensor's memory (its strides, the tensor kept alive as the owner): no
    DLPack exchange, whose stream handshake is not needed where the work runs on the tensor's current stream."""
    shape, strides = tuple(a.shape), tuple(4 * s for s in a.stride())
    if not a.numel():
        return cupy.empty(shape, cupy.float32)
    extent = 4 + sum((d - 1) * s for d, s in zip(shape, strides))
    memory = cupy.cuda.UnownedMemory(a.data_ptr(), extent, a, device)
    return cupy.ndarray(shape, cupy.float32, cupy.cuda.MemoryPointer(memory, 0), strides)


def _torch_stream(torch, device: int) -> int:
    """The handle of torch's current stream on a device (torch's raw accessor where it has one: a Stream object
    costs about 8 us of host time)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _check_dtype(name: str) -> None:
    if name != "float32":
        raise TypeError(f"qrgen factors float32 matrices; got dtype {name}: convert with .astype('float32') "
                        f"(CuPy) or .float() (torch)")


# ---------------------------------------------------------------------------------------------------------------
# Kernels for one shape


class Factorizer:
    """The kernels and launch sequence for one (m, n, schedule, arch); geqrf for any batch of that shape."""

    def __init__(self, m: int, n: int, schedule: Schedule, arch: str, sources: dict[str, str] | None = None,
                 keep: bool = False):
        if (schedule.m, schedule.n) != (m, n):
            raise ValueError(f"schedule is for {schedule.m}x{schedule.n}, not {m}x{n}")
        self.m, self.n, self.k = m, n, min(m, n)
        self.schedule = schedule
        self.arch = arch
        # keep: every panel's (or aggregate's) V^T and (VT)^T kept in a region of its own, from which Q is formed
        # after the factorization (drive_q)
        self.keep = keep
        self.kernels, self.launches = codegen.plan(schedule, keep)
        self.shared_bytes = {k.name: k.shared_bytes for k in self.kernels}  # each kernel's dynamic shared memory
        self.aggregates = codegen.aggregates(schedule)
        self.kept = codegen.kept_blocks(self.launches, self.aggregates) if keep else ()
        self.sources = sources  # rendered kernel sources by name (a generated module's files), else rendered here
        # A one-panel schedule with no columns right of its panel reads the input directly (no copy first) when it
        # is aligned for the kernel's loads; a wide one (m < n) needs those columns in h before its update.
        vec = {k.name: k.vec for k in self.kernels}
        direct = len(self.launches) == 1 and self.launches[0].nc == 0 and not schedule.scaled
        self._direct_vec = vec[self.launches[0].kernel] if direct else 0
        self._functions: dict[int, dict] = {}  # device id -> kernel name -> (module, function)
        # The kernel that writes qr's reduced Q and R in one launch, where the schedule has one (one lanes panel on
        # one block, nothing right of it: codegen.fused_q_kernel), and its packed arguments per device.
        self.fused_q = next((k for k in self.kernels if k.formq), None)
        self._q_args: dict[int, "_PackedArgs"] = {}
        self._lock = threading.Lock()
        self.binaries: list[Binary] = []
        # Workspaces kept per (device, batch, stream): calls on one stream reuse them in stream order.
        self._workspaces: dict[tuple, "_Workspace"] = {}
        self._keep_variant: "Factorizer | None | bool" = False  # not yet made (keep_variant)
        # One kernel launch and nothing else: an eager call queues no more than a graph replay would.
        self.one_launch = direct and not self.launches[0].levels and (
            self.launches[0].blocks == 1 or self.launches[0].cluster)

    def keep_variant(self) -> "Factorizer | None":
        """The same schedule as a keep plan, for qr's Q (made once); None where a keep plan does not apply (a panel
        whose kept outputs would not fit its shared memory)."""
        if self._keep_variant is False:
            try:
                self._keep_variant = Factorizer(self.m, self.n, self.schedule, self.arch, keep=True)
            except ValueError:
                self._keep_variant = None
        return self._keep_variant

    def build(self, use_cache: bool = True, progress=None) -> list[Binary]:
        """Render and compile every kernel (from the disk cache where it can)."""
        if self.sources is not None:
            items = [(k.name, self.sources[k.name]) for k in self.kernels]
        else:
            items = [(r.name, r.source) for r in codegen.render_all(self.schedule, self.arch, keep=self.keep)]
        self.binaries = compile_many(items, self.arch, use_cache=use_cache, progress=progress)
        return self.binaries

    def _load(self, device_id: int) -> dict:
        funcs = self._functions.get(device_id)
        if funcs is not None:
            return funcs
        with self._lock:
            if device_id in self._functions:
                return self._functions[device_id]
            if not self.binaries:
                self.build()
            specs = {k.name: k for k in self.kernels}
            funcs = {b.name: load_function(b, self.shared_bytes[b.name], specs[b.name]) for b in self.binaries}
            self._functions[device_id] = funcs
            return funcs

    def _capacity(self, func, threads: int, device_id: int) -> int:
        """Blocks of this kernel that can be resident at once on the device (for cooperative launches)."""
        import cupy

        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, threads, 0)
        sms = cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]
        return max(1, per_sm * sms)

    def __call__(self, a):
        """geqrf of a (..., m, n) float32 device array: returns (h, tau) of the same kind, on the same device."""
        out = fast_geqrf(self, a)
        if out is not None:
            return out
        arr = as_device_array(a)
        data = arr.data
        if data.ndim < 2:
            raise ValueError(f"qrgen.geqrf needs an array of shape (..., m, n); got shape {tuple(data.shape)}")
        m, n = data.shape[-2:]
        if (m, n) != (self.m, self.n):
            raise ValueError(f"this factorization is generated for {self.m}x{self.n} matrices; got {m}x{n} "
                             f"(shape {tuple(data.shape)}): build one for {m}x{n} or call qrgen.geqrf")
        return _run(self, arr)

    def profile(self, a) -> list:
        """Factor a (batch, m, n) CuPy array once with events around every launch; returns the synchronized
        (stage, launch, start, stop) list (see _factor)."""
        import cupy

        batch = a.shape[0]
        ws = _Workspace(self, batch, a.device.id)
        h = a.copy(order="C")
        tau = cupy.empty((batch, self.k), dtype=cupy.float32)
        stages: list = []
        _factor(self, h, tau, ws, a.device.id, stages=stages)
        cupy.cuda.get_current_stream().synchronize()
        return stages

    def run_qr(self, a, stream):
        """(q (batch, m, n), r (batch, n, n)) of qr's reduced mode by the fused kernel, for a (batch, m, n) CuPy array
        on `stream`; a is left as it is."""
        import cupy

        aligned = a.flags.c_contiguous and a.data.ptr % (4 * self._direct_vec) == 0
        src = a if aligned else a.copy(order="C")
        q = cupy.empty((a.shape[0], self.m, self.n), dtype=cupy.float32)
        r = cupy.empty((a.shape[0], self.n, self.n), dtype=cupy.float32)
        self.launch_qr(a.device.id, a.shape[0], src.data.ptr, q.data.ptr, r.data.ptr, stream.ptr)
        return q, r

    def launch_qr(self, device_id: int, batch: int, src: int, q: int, r: int, stream: int) -> None:
        """The fused kernel's launch (run_qr) on raw pointers: src (batch, m, n) C-contiguous and aligned for its
        loads, q (batch, m, n) and r (batch, n, n) written."""
        _, func = self._load(device_id)[self.fused_q.name]
        L = self.launches[0]
        # The panel kernels' parameters (_PANEL_PARAMS): R where h goes, Q where (VT)^T goes, no tau or workspace.
        args = self._q_args.get(device_id)
        if args is None:
            args = self._q_args[device_id] = _PackedArgs(_PANEL_PARAMS, (0, 0, 0, 0, 0, 0, 0, 0, 0, L.rows, L.v_ld,
                                                                         L.v_bs))
        with self._lock:  # the packed values are shared by the calls on this device until the launch is queued
            args.set(0, src)
            args.set(1, r)
            args.set(4, q)
            _launch_panel(func, L, batch, stream, args)

    def direct_workspace(self, a_ptr: int, batch: int, device_id: int, stream: int) -> "_Workspace | None":
        """For a one-launch factorization (one_launch) of an input at a_ptr: the workspace that an earlier run on
        this device, batch and stream left with its packed arguments, where the input is aligned for the kernel's
        loads and the batch runs in one launch; else None."""
        ws = self._workspaces.get((device_id, batch, stream))
        if ws is None or 0 not in ws.panel_args or ws.chunk < batch or a_ptr % (4 * self._direct_vec):
            return None
        return ws

    def launch_direct(self, ws: "_Workspace", a_ptr: int, batch: int, device_id: int, stream: int, h: int,
                      tau: int) -> None:
        """The launch of a one-launch factorization on raw pointers (direct_workspace): a (batch, m, n)
        C-contiguous read, h and tau written."""
        _, func = self._functions[device_id][self.launches[0].kernel]
        args = ws.panel_args[0]
        with self._lock:
            args.set(0, a_ptr)
            args.set(1, h)
            args.set(2, tau)
            _launch_panel(func, self.launches[0], batch, stream, args)

    def run(self, a, stream, skip=(), q=None):
        """(h, tau) for a contiguous-or-not (batch, m, n) CuPy array on `stream`; a is left as it is. `skip`:
        stages left out, for timing by difference (qrgen.bench.stage_times); the result is then wrong. q (keep
        plans): a (batch, m, c) array holding the identity's first c columns (c = k or m), turned into Q's."""
        import cupy

        device_id = a.device.id
        key = (device_id, a.shape[0], stream.ptr)
        workspace = self._workspaces.get(key)
        if workspace is None:
            workspace = self._workspaces[key] = _Workspace(self, a.shape[0], device_id)
        tau = cupy.empty((a.shape[0], self.k), dtype=cupy.float32)
        direct = self._direct_vec and a.data.ptr % (4 * self._direct_vec) == 0
        # Schedule.scaled: the scale kernel copies the input into h (16-byte aligned where m n is a multiple of 4)
        scaled = self.schedule.scaled and a.data.ptr % 16 == 0
        if (direct or scaled) and a.flags.c_contiguous:
            h = cupy.empty(a.shape, dtype=cupy.float32)
            _factor(self, h, tau, workspace, device_id, src=a, skip=skip, q=q)
        else:
            h = a.copy(order="C")
            _factor(self, h, tau, workspace, device_id, skip=skip, q=q)
        return h, tau


@contextlib.contextmanager
def on_caller_stream(arr: _Array):
    """Make the array's device current and the caller's stream CuPy's current stream; yields that stream."""
    import cupy

    with contextlib.ExitStack() as scope:
        if cupy.cuda.runtime.getDevice() != arr.data.device.id:
            scope.enter_context(cupy.cuda.Device(arr.data.device.id))
        if arr.stream_ptr is None:
            stream = cupy.cuda.get_current_stream()
        else:
            stream = _external_stream(arr.stream_ptr)
            scope.enter_context(stream)
        yield stream


def _run(fac: "Factorizer | None", arr: _Array):
    h, tau = factor_device(fac, arr)
    return arr.wrap(h), arr.wrap(tau)


def factor_device(fac: "Factorizer | None", arr: _Array):
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
                h, tau = replay.call(("geqrf", id(fac)), lambda s, y: fac.run(y, s), (x,), stream, fac,
                                     replay.GEQRF_MAX_FLOATS)
        else:
            h = cupy.empty((batch, m, n), dtype=cupy.float32)
            tau = cupy.empty((batch, k), dtype=cupy.float32)
        if len(lead) != 1:
            h = h.reshape(*lead, m, n)
            tau = tau.reshape(*lead, k)
    return h, tau


_EXTERNAL_STREAMS: dict[int, object] = {}


def _external_stream(ptr: int):
    """CuPy's handle on another framework's stream (kept per pointer: creating one per call costs host time)."""
    stream = _EXTERNAL_STREAMS.get(ptr)
    if stream is None:
        import cupy

        class _Handle:  # the CUDA stream protocol, for Stream.from_external
            def __cuda_stream__(self):
                return (0, ptr)

        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        stream = from_external(_Handle()) if from_external else cupy.cuda.ExternalStream(ptr)
        _EXTERNAL_STREAMS[ptr] = stream
    return stream


@dataclass(frozen=True)
class Sizes:
    """Floats per matrix of each work buffer a plan needs beside h and tau."""

    vt: int  # V^T of a panel, or of an aggregate (its panels write into it)
    zt: int  # (V T)^T of a panel
    w: int  # W of a trailing update
    g: int  # G and T of an aggregate
    zg: int  # (V T)^T of an aggregate
    wq: int = 1  # W of Q's products (keep plans)
    ts: int = 1  # a tsqr panel's tree (codegen.tsqr_layout)

    def floats(self, name: str) -> int:
        """Floats per matrix of a buffer of buffer_names (a lookahead's second buffers as their first)."""
        return getattr(self, name.rstrip("23"))

    @classmethod
    def of(cls, fac: "Factorizer") -> "Sizes":
        trail = [L for L in fac.launches if L.trail] or fac.launches
        # a keep plan merges every aggregate, the last one too (for Q); a plain plan those with columns after them
        aggs = [a for a in fac.aggregates if a.nc > 0 or fac.keep]
        kept = sum(b.width * b.rows for b in fac.kept)  # every kept block's region (keep plans)
        return cls(vt=max([L.v_bs for L in trail] + [kept]),
                   zt=max([L.width * L.rows for L in trail] + [kept if not fac.aggregates else 0]),
                   wq=max([b.width * (fac.m - b.c0) for b in fac.kept] + [1]),
                   w=max([L.width * L.nc for L in fac.launches] + [(a.a1 - a.a0) * a.nc for a in aggs] + [1]),
                   g=max([(a.a1 - a.a0) ** 2 for a in aggs] + [1]),
                   zg=max([(a.a1 - a.a0) * a.rows for a in aggs] + [kept if fac.aggregates else 0] + [1]),
                   ts=max([codegen.tsqr_layout(L.levels, L.width).floats for L in fac.launches if L.levels] + [1]))


def buffer_names(fac: "Factorizer") -> tuple[str, ...]:
    """The work buffers of a plan: with lookahead, V^T and (V T)^T of the aggregates rotate over two buffers
    (the side stream still reads one aggregate's while the next one's panels write the other), three with
    Schedule.reach (the side stream may still read an aggregate's while the next two write theirs), and the side
    stream's W has its own."""
    names = ("vt", "zt", "w", "g", "zg")
    ahead = fac.schedule.lookahead
    # (a keep plan's aggregates have regions of their own, so it needs no second V^T and (V T)^T)
    rotate = () if not ahead or fac.keep else ("vt2", "zg2", "vt3", "zg3") if _reaches(fac) else ("vt2", "zg2")
    return (names + rotate + (("w2",) if ahead else ())
            + (("wq",) if fac.keep else ()) + (("ts",) if any(L.levels for L in fac.launches) else ()))


def _reaches(fac) -> bool:
    """Whether a plan's panels reach through the next aggregate (Schedule.reach, with two aggregates or more)."""
    return any(a.c1 > a.a1 for a in fac.aggregates)


def side_pieces(c0: int, c1: int, rows: int, batch: int, sms: int, waves: int) -> list[tuple[int, int]]:
    """Columns [c0, c1) of a lookahead's side-stream update in pieces of about `waves` waves of 128 x 128 tiles
    over the SMs (whole multiples of 64 columns, at least 128), one GEMM pair each. A piece's last wave drains
    before the next piece may start, so a panel kernel waiting on the main stream gets whole SMs there even where
    stream priorities do not apply (graph replays) or cuBLAS's kernel does not keep to the SM count it was given
    (fp32 GEMMs, as measured: Schedule.lookahead's default)."""
    width = max(128, waves * sms * 128 * 128 // max(1, rows * batch) // 64 * 64)
    return [(c, min(c + width, c1)) for c in range(c0, c1, width)]


def drive(fac: "Factorizer", engine) -> None:
    """The launch sequence of one chunk of matrices, on any engine (CuPy here; NumPy in qrgen.simulate).

    Operands are (buffer name, float offset within a matrix); each buffer holds the chunk's matrices at a fixed
    stride. Per panel: its kernel, then W = (V T)^T C and C -= V W on the columns to the end of its aggregate
    (through cuBLAS or the split kernels, as the schedule's panel_update says).
    After an aggregate's last panel: G = V^T V, T from G and tau, (V T)^T, then the same two products on the
    columns right of the aggregate. With the schedule's lookahead those products are two pairs: the next
    aggregate's columns first, then (engine.fork: on a side stream that waits for everything queued so far) the
    columns past it; the next aggregate's panels, G, T and (V T)^T run meanwhile, and engine.join (the main
    stream waits for the side stream) comes before anything touches those columns again.
    With Schedule.reach each panel's own products run through the next aggregate's columns, and an aggregate's
    merge and all its products (from the next aggregate's end) go to the side lane: first the columns of the
    aggregate after next, then engine.mark(), which the main lane waits for (engine.wait_mark) before the next
    aggregate's first products, which reach into those columns; the rest in pieces. V^T and (VT)^T then rotate over
    three buffers, and the one join is at the end.
    """
    m, n = fac.m, fac.n
    prec = fac.schedule.precision
    sizes = engine.sizes
    via = fac.schedule.panel_update  # how the panels' own products run: "cublas" or "split" (fp32 kernels)
    cublas_panels = via == "cublas"
    ahead = fac.schedule.lookahead
    epoch = 0
    aggs = list(fac.aggregates)
    by_last = {a.last: i for i, a in enumerate(aggs) if a.nc > 0 or fac.keep}
    firsts = {a.first for a in aggs if a.nc > 0}
    owner = {p: i for i, a in enumerate(aggs) for p in range(a.first, a.last + 1)}
    pending = False  # side-stream work not yet joined
    reach = _reaches(fac)
    marked = False  # reach: a mark queued on the side lane that the main lane has not waited for
    if fac.schedule.scaled:
        engine.scale(0)

    def suffix(index):  # which of the rotating V^T / (V T)^T buffers panel `index` and its aggregate use
        if not ahead or fac.keep:
            return ""
        return ("", "2", "3")[owner.get(index, 0) % (3 if reach else 2)]

    def kept_base(index):  # a keep plan: where the kept block of panel `index` begins in "vt" (and "zt" or "zg")
        return engine.nb * fac.kept[owner[index] if aggs else index].offset

    def products(z, zld, zs, v, vld, vs, width, rows, col, nc, w, project, update, how="cublas", side=False,
                 own=False):
        """W = Z^T C, then C -= V W, on the nc columns of h from offset `col` (rows from the panel's first); own: a
        panel's own products, which SkipStages leaves out for the pseudo-stage "own" (profiling)."""
        if own and "own" in getattr(engine, "skip", ()):
            return
        if how == "fused":
            engine.fused(z, zld, zs, v, vld, vs, width, rows, ("h", col), nc)
            return
        c = ("h", col)
        engine.gemm("project", False, False, width, nc, rows, 1.0, z, zld, zs, c, n, m * n, 0.0, (w, 0), nc,
                    sizes.w, project, via=how, side=side)
        engine.gemm("update", True, False, rows, nc, width, -1.0, v, vld, vs, (w, 0), nc, sizes.w, 1.0, c, n,
                    m * n, update, via=how, side=side)

    for index, L in enumerate(fac.launches):
        vt = "vt" + suffix(index)
        if fac.keep:
            # A keep plan's panel writes its V^T into its kept block's region (a panel's own, or its aggregate's,
            # zero above each panel's rows: all of "vt" is zeroed once), and its (VT)^T into its own region
            # where there are no aggregates (an aggregate's comes from the merge).
            if index == 0 and aggs:
                engine.zero("vt")
            base = kept_base(index)
            v, z = ("vt", L.v_row * L.v_ld + L.v_row + base), ("zt", 0 if aggs else base)
        else:
            if index in firsts:
                engine.zero(vt)  # an aggregate's V^T is zero above each panel's rows
            v, z = (vt, L.v_row * L.v_ld + L.v_row), ("zt", 0)
        engine.panel(index, L, epoch, v, z)
        if L.blocks > 1:
            epoch += L.blocks * L.barriers
        if L.nc > 0:
            if marked:
                engine.wait_mark()
                marked = False
            products(z, L.rows, L.width * L.rows, v, L.v_ld, L.v_bs, L.width, L.rows,
                     L.c0 * n + L.c0 + L.width, L.nc, "w", prec.project if cublas_panels else "fp32",
                     prec.update if cublas_panels else "fp32", how=via, own=True)
        i = by_last.get(index)
        if i is None:
            continue
        agg = aggs[i]
        a, rows = agg.a1 - agg.a0, agg.rows
        vbs = a * rows
        if fac.keep:  # the aggregate's kept region, its matrices a * rows floats apart in "vt" and "zg"
            base = kept_base(index)
            vt_at, zg_at, zg_bs = ("vt", base), ("zg", base), vbs
        else:
            vt_at, zg_at, zg_bs = (vt, 0), ("zg" + suffix(index), 0), sizes.zg
        # the merge's products (G = V^T V, (VT)^T = T^T V^T) as three tf32 products where the update takes them
        merge3 = prec.update == "tf32x3"
        if reach:
            engine.fork()
            pending = True
        engine.gemm("gram", False, True, a, a, rows, 1.0, vt_at, rows, vbs, vt_at, rows, vbs,
                    0.0, ("g", 0), a, sizes.g, "tf32x3" if merge3 and prec.gram == "fp32" else prec.gram, side=reach)
        engine.tmat(agg, side=reach)
        engine.gemm("aggregate", True, False, a, rows, a, 1.0, ("t", 0), a, sizes.g, vt_at, rows, vbs,
                    0.0, zg_at, rows, zg_bs, "tf32x3" if merge3 else "fp32", side=reach)
        if agg.nc == 0:  # a keep plan's last aggregate: merged for Q only
            continue
        args = (zg_at, rows, zg_bs, vt_at, rows, vbs, a, rows)
        row0 = agg.a0 * n
        if reach:
            # the columns the next aggregate's panels reach into (the aggregate after next), then the rest
            near = aggs[i + 2].a1 if i + 2 < len(aggs) else agg.c1
            if near > agg.c1:
                products(*args, row0 + agg.c1, near - agg.c1, "w2", prec.project, prec.update, side=True)
                engine.mark()
                marked = True
            for c0, c1 in side_pieces(near, n, rows, engine.nb, engine.sms, ahead):
                products(*args, row0 + c0, c1 - c0, "w2", prec.project, prec.update, side=True)
            continue
        if pending:
            engine.join()
            pending = False
        nxt = aggs[i + 1] if i + 1 < len(aggs) else None
        if ahead and nxt is not None and nxt.nc > 0:
            near = nxt.a1 - agg.a1
            products(*args, row0 + agg.a1, near, "w", prec.project, prec.update)
            engine.fork()
            for c0, c1 in side_pieces(nxt.a1, n, rows, engine.nb, engine.sms, ahead):
                products(*args, row0 + c0, c1 - c0, "w2", prec.project, prec.update, side=True)
            pending = True
        else:
            products(*args, row0 + agg.a1, agg.nc, "w", prec.project, prec.update)
    if pending:
        engine.join()
    if fac.schedule.scaled:
        engine.scale(2)


def drive_q(fac: "Factorizer", engine, qcols: int) -> None:
    """Q from a keep plan's kept blocks, after drive(): the engine's buffer "q" holds the chunk's (m, qcols)
    matrices, the identity's first qcols columns (qcols = k for qr's reduced Q, m for the complete one). Q =
    H_0 ... H_{k-1} I, the last block first: a block's reflector I - V T V^T (a panel's, or an aggregate's) changes
    only P = Q[c0:, c0:] (the columns left of c0 are still the identity's, zero in its rows), by W = V^T P and then
    P -= (V T) W, the (VT)^T read transposed, in codegen.q_precision's precision for the block's width.

    The later blocks have changed only rows and columns from c0 + w on, so P = [[I_w, 0], [0, P22]] and
    W = [V1^T, V2^T P22] (V split after its first w rows): for an aggregate, W's first w columns come from a product
    of depth w (V1^T times P's identity block) and the rest from one of depth rows - w over P22 alone, three GEMMs
    where two would read all of P (the first product shrinks by a third at 1024² with aggregates of 128); a
    panel's block is too narrow for the extra launch to pay, and keeps two."""
    m = fac.m
    for b in reversed(fac.kept):
        base = engine.nb * b.offset
        w, qc = b.width, qcols - b.c0
        precision = codegen.q_precision(w)
        q = ("q", b.c0 * qcols + b.c0)
        vt = ("vt", base)
        if b.z == "zg":  # W[:, :w] = V1^T I_w; W[:, w:] = V2^T P22 (when P has columns past the block)
            engine.gemm("qproject", False, False, w, w, w, 1.0, vt, b.rows, w * b.rows, q, qcols, m * qcols, 0.0,
                        ("wq", 0), qc, engine.sizes.wq, precision)
            if qc > w:
                engine.gemm("qproject", False, False, w, qc - w, b.rows - w, 1.0, ("vt", base + w), b.rows,
                            w * b.rows, ("q", (b.c0 + w) * qcols + b.c0 + w), qcols, m * qcols, 0.0, ("wq", w), qc,
                            engine.sizes.wq, precision)
        else:
            engine.gemm("qproject", False, False, w, qc, b.rows, 1.0, vt, b.rows, w * b.rows, q, qcols, m * qcols,
                        0.0, ("wq", 0), qc, engine.sizes.wq, precision)
        engine.gemm("qupdate", True, False, b.rows, qc, w, -1.0, (b.z, base), b.rows, w * b.rows, ("wq", 0), qc,
                    engine.sizes.wq, 1.0, q, qcols, m * qcols, precision)


STAGES = ("panel", "project", "update", "gram", "tmat", "aggregate", "scale", "own")


class SkipStages:
    """An engine that passes every operation to `engine` except those of the stages named in `skip`: for timing
    a factorization by difference (the result is then wrong; the work of the other stages is the same). "own" names
    the panels' own products (drive's products for a panel, in whatever kernels), "project" and "update" every
    product of that kind."""

    def __init__(self, engine, skip):
        unknown = set(skip) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; the stages are {STAGES}")
        self.engine, self.skip = engine, frozenset(skip)
        self.sizes, self.nb, self.sms = engine.sizes, engine.nb, engine.sms

    def zero(self, name):
        self.engine.zero(name)

    def panel(self, index, launch, epoch, v, z):
        if "panel" not in self.skip:
            self.engine.panel(index, launch, epoch, v, z)

    def fork(self):
        self.engine.fork()

    def join(self):
        self.engine.join()

    def mark(self):
        self.engine.mark()

    def wait_mark(self):
        self.engine.wait_mark()

    def tmat(self, agg, side=False):
        if "tmat" not in self.skip:
            self.engine.tmat(agg, side)

    def scale(self, phase):
        if "scale" not in self.skip:
            self.engine.scale(phase)

    def gemm(self, stage, *args, **kwargs):
        if stage not in self.skip:
            self.engine.gemm(stage, *args, **kwargs)

    def fused(self, *args):
        if not {"project", "update"} & self.skip:
            self.engine.fused(*args)


MAX_GRID_Y = 65535  # CUDA's limit on grid.y (and z), where tsqr and fused launches put the matrices


class _Workspace:
    """Buffers the launch sequence needs beside h and tau, kept between calls."""

    def __init__(self, fac: "Factorizer", batch: int, device_id: int):
        import cupy

        funcs = fac._load(device_id)
        self.chunk = batch
        for launch in fac.launches:
            if launch.blocks > 1 and not launch.cluster:  # cooperative: every block of the chunk resident
                _, func = funcs[launch.kernel]
                per_pass = max(1, fac._capacity(func, launch.threads, device_id) // launch.blocks)
                self.chunk = min(self.chunk, per_pass)
        if any(L.levels for L in fac.launches) or fac.schedule.panel_update in ("split", "fused"):
            self.chunk = min(self.chunk, MAX_GRID_Y)
        self.sizes = Sizes.of(fac)
        self.buffers = {name: cupy.empty((self.chunk, self.sizes.floats(name)), dtype=cupy.float32)
                        for name in buffer_names(fac)}
        self.buffers["t"] = cupy.empty((self.chunk, self.sizes.g), dtype=cupy.float32)
        self.sms = cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]
        # G in parts (gram_splits): part q of the chunk's matrices q * chunk * sizes.g floats into "g"
        self.gram_splits = gram_splits(fac, self.chunk, self.sms) if "g" in self.buffers else 1
        if self.gram_splits > 1:
            self.buffers["g"] = cupy.empty((self.gram_splits * self.chunk, self.sizes.g), dtype=cupy.float32)
        # The split panel products: partial sums per row block, and a counter per matrix and column tile that the
        # last block of each launch resets (zero between launches).
        split = [L for L in fac.launches if L.nc > 0] if fac.schedule.panel_update == "split" else []
        self.buffers["part"] = cupy.empty((self.chunk, max([split_rows(L.rows, L.nc, self.chunk, self.sms)[0]
                                                             * L.width * L.nc for L in split] + [1])),
                                          dtype=cupy.float32)
        self.counters = cupy.zeros((self.chunk * max([-(-L.nc // 32) for L in split] + [1]),), dtype=cupy.uint32)
        max_blocks = max(L.blocks for L in fac.launches)
        self.xch = cupy.empty((self.chunk, 2 * max_blocks * 64), dtype=cupy.float32)
        self.flags = cupy.zeros((self.chunk,), dtype=cupy.uint32)
        self.amax = cupy.zeros((self.chunk,), dtype=cupy.uint32)  # Schedule.scaled: each matrix's max |a| (bits)
        self.multi_block = any(L.blocks > 1 and not L.cluster for L in fac.launches)  # flags to clear per call
        self.ptrs = {name: b.data.ptr for name, b in self.buffers.items()}
        self.strides = {"h": fac.m * fac.n, "t": self.sizes.g,
                        **{name: self.sizes.floats(name) for name in buffer_names(fac)}}
        self.panel_args: dict[int, _PackedArgs] = {}  # per panel, its packed launch arguments
        self.tsqr_args: dict[int, list] = {}  # per tsqr panel, (tiles, packed arguments) per phase
        self.packed: dict[tuple, _PackedArgs] = {}  # per signature, the other kernels' (_CupyEngine._launch)
        self.lanes = _Lanes() if fac.schedule.lookahead else None


HIGH_PRIORITY = -1000  # CUDA clamps a stream priority to the device's range: this is its highest


class _Lanes:
    """The two streams of a lookahead schedule (the panels' chain at the highest priority, so that their blocks go
    first as the side stream's GEMM blocks retire) and the events that order them with each other and with the
    caller's stream. Events are recorded again for every fork and join: a wait takes the latest record."""

    def __init__(self):
        import cupy

        self.main = cupy.cuda.Stream(non_blocking=True, priority=HIGH_PRIORITY)
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.forked, self.joined, self.started, self.done, self.marked = (
            cupy.cuda.Event(block=False, disable_timing=True) for _ in range(5))
        self.pending = False  # side-stream work queued since the last join

    @contextlib.contextmanager
    def from_stream(self, caller):
        """Run the body on the main lane (CuPy's current stream inside), after the caller's queued work; the caller's
        stream then waits for both lanes."""
        self.started.record(caller)
        self.main.wait_event(self.started)
        try:
            with self.main:
                yield
        finally:  # also when a launch failed midway: the caller's later work still waits for what was queued
            if self.pending:  # (a join without a fork would wait on the side stream's work of another call)
                self.join()
            self.done.record(self.main)
            caller.wait_event(self.done)

    def fork(self):
        self.forked.record(self.main)
        self.side.wait_event(self.forked)
        self.pending = True

    def join(self):
        self.joined.record(self.side)
        self.main.wait_event(self.joined)
        self.pending = False

    def mark(self):
        """A point in the side stream's queue that wait_mark makes the main stream wait for (the latest mark)."""
        self.marked.record(self.side)

    def wait_mark(self):
        self.main.wait_event(self.marked)


# The panel kernels' parameters (templates/cuda/qr.cu.j2): src, h, tau, vt, zt, xch, flags, epoch, c0, mp, vld, vbs.
_PANEL_PARAMS = (ctypes.c_uint64,) * 7 + (ctypes.c_uint32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                          ctypes.c_int64)
# The split kernels' (templates/cuda/split.cu.j2) and the T kernel's (tmat.cuh.j2): pointers, leading dimensions
# (int) and batch strides (long long) as they declare them.
_P, _I, _L = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
_SPLIT_PROJECT_PARAMS = (_P, _I, _L, _P, _I, _L, _P, _L, _P, _I, _L, _P, _I, _I, _I)
_SPLIT_UPDATE_PARAMS = (_P, _I, _L, _P, _I, _L, _P, _I, _L, _I, _I)
_FUSED_PARAMS = _SPLIT_UPDATE_PARAMS  # zt, zld, zs, vt, vld, vs, c, ldc, cs, rows, nc (templates/cuda/fused.cu.j2)
_TMAT_PARAMS = (_P, _P, _P, _I, _L, _I, _I, _L)  # gram, tau, t, reflectors, G's stride, tau's; G's parts, their stride
# src, h, tau, vt, zt, ts, its stride; kind, rows, at, out, tau_at, t_at, y, v1 (offsets in ts), c0, vld; vbs
_TSQR_PARAMS = (_P,) * 6 + (_L,) + (_I,) * 10 + (_L,)
# The tf32x3 products (templates/cuda/gemm3.cu.j2): a, lda, sa, b, ldb, sb, c, ldc, sc, M, N, K, alpha, beta, parts of
# K, floats between the parts' outputs.
_GEMM3_PARAMS = (_P, _I, _L, _P, _I, _L, _P, _I, _L, _I, _I, _I, ctypes.c_float, ctypes.c_float, _I, _L)
_SCALE_PARAMS = (_P, _P, _P, _I, _I, _I)


class _PackedArgs:
    """A kernel's arguments packed once as the driver takes them (an array of pointers to the values), so that a
    launch costs one driver call; per call only the pointers that change (src, h, tau) are rewritten. The driver
    copies the values when the launch is queued, so rewriting them for the next call is safe."""

    def __init__(self, types, values):
        self.values = [t(v) for t, v in zip(types, values)]
        self.pointers = (ctypes.c_void_p * len(self.values))(*[ctypes.addressof(v) for v in self.values])
        self.address = ctypes.addressof(self.pointers)

    def set(self, index: int, value) -> None:
        self.values[index].value = value


def split_rows(rows: int, nc: int, batch: int, sms: int) -> tuple[int, int]:
    """(blocks along the rows, rows per block) of a split projection: about two blocks per SM over the batch and
    the 32-column tiles, each block at least SPLIT_TILE rows (a multiple of it)."""
    tile = codegen.SPLIT_TILE
    tiles = -(-nc // 32)
    splits = max(1, min(-(-rows // tile), -(-2 * sms // (batch * tiles))))
    chunk = -(-rows // splits)
    chunk = -(-chunk // tile) * tile
    return -(-rows // chunk), chunk


GRAM_SPLITS_MAX = 8  # parts of an aggregate's G at most (gram_splits)
GRAM_SPLIT_ROWS = 256  # rows of V a part at least


def gram_splits(fac: "Factorizer", chunk: int, sms: int) -> int:
    """Parts to split the K (rows of V) of an aggregate's G = V^T V into, for `chunk` matrices: where the gram kernel
    can take G (an fp32 Gram precision: codegen.gemm3_kinds) and the matrices' upper 64 x 64 tiles (3 for 128
    reflectors) fill fewer than two blocks per SM, enough parts for about that many, at most GRAM_SPLITS_MAX; else
    1 (G in one piece, from cuBLAS or the gram kernel as the schedule says). The parts go through the tf32x3 gram
    kernel (fp32-class accuracy), written apart, and the T kernel adds them as it stages G. A cuBLAS SGEMM of G for
    8 matrices of 2048 rows ran 31 µs an aggregate on 32 blocks (BENCHMARKS.md, seventeenth session's profile)."""
    if "gram" not in codegen.gemm3_kinds(fac.schedule):
        return 1
    a = max([agg.a1 - agg.a0 for agg in fac.aggregates] + [1])
    tiles = sum(1 for i in range(-(-a // 64)) for j in range(-(-a // 64)) if i <= j)
    return max(1, min(GRAM_SPLITS_MAX, 2 * sms // (chunk * tiles)))


def _launch_panel(func, L, batch: int, stream: int, args: _PackedArgs) -> None:
    """A panel kernel's launch for `batch` matrices: L.blocks blocks each, cooperative where the blocks of a matrix
    wait for each other (all must then be resident)."""
    import cupy

    driver = cupy.cuda.driver
    if L.blocks > 1 and not L.cluster:
        driver.launchCooperativeKernel(func.ptr, batch * L.blocks, 1, 1, L.threads, 1, 1, L.shared_bytes, stream,
                                       args.address)
    else:
        driver.launchKernel(func.ptr, batch * L.blocks, 1, 1, L.threads, 1, 1, L.shared_bytes, stream,
                            args.address, 0)


class _CupyEngine:
    """drive()'s operations as kernel launches and cuBLAS calls on CuPy's current stream."""

    def __init__(self, fac: "Factorizer", ws: _Workspace, funcs: dict, h, tau, src, stages: list | None,
                 device_id: int, lanes: "_Lanes | None"):
        import cupy

        self.fac, self.ws, self.funcs, self.stages, self.lanes = fac, ws, funcs, stages, lanes
        self.cupy = cupy
        self.device_id = device_id
        self.stream_ptr = cupy.cuda.get_current_stream().ptr
        self.sizes, self.sms = ws.sizes, ws.sms
        self.nb = h.shape[0]
        # The side lane's GEMMs plan for the SMs the panels leave (the widest panel's blocks over the chunk):
        # with one piece, measured on the H200 without it (calls 2 and 3 of BENCHMARKS.md's eighth session) and
        # with it (call 5): 8 x 2048² 5,423 and 5,446 -> 5,355 µs, 2 x 4096² 14,303 and 14,464 -> 14,240.
        self.side_sms = max(self.sms // 4, self.sms - max(L.blocks for L in fac.launches) * self.nb)
        self.h, self.tau, self.src = h, tau, src
        self.h_ptr, self.tau_ptr = h.data.ptr, tau.data.ptr
        self.src_ptr = None if src is None else src.data.ptr
        self.strides = ws.strides
        self.ptrs = {**ws.ptrs, "h": self.h_ptr}
        self.gram_parts = 1  # the parts the last G came in (gram_splits), for the T kernel that reads it

    def _mark(self, stage, launch):
        if self.stages is None:
            return None
        start, stop = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        start.record()
        self.stages.append((stage, launch, start, stop))
        return stop

    def _done(self, stop):
        if stop is not None:
            stop.record()

    def zero(self, name):
        self.cupy.cuda.runtime.memsetAsync(self.ptrs[name], 0, 4 * self.nb * self.strides[name], self.stream_ptr)

    def panel(self, index, L, epoch, v, z):
        _, func = self.funcs[L.kernel]
        src = self.src_ptr if (index == 0 and self.src_ptr is not None) else self.h_ptr
        stop = self._mark("panel", L)
        if L.levels:
            self._tsqr(index, func, L, src, v, z)
            self._done(stop)
            return
        ws = self.ws
        with self.fac._lock:  # the packed values are shared with the fast lane's launches (launch_direct)
            args = ws.panel_args.get(index)
            if args is None:  # the same for every call on this workspace but src, h and tau
                args = ws.panel_args[index] = _PackedArgs(_PANEL_PARAMS, (
                    src, self.h_ptr, self.tau_ptr, ws.ptrs[v[0]] + 4 * v[1], ws.ptrs[z[0]] + 4 * z[1],
                    ws.xch.data.ptr, ws.flags.data.ptr, epoch, L.c0, L.rows, L.v_ld, L.v_bs))
            else:
                args.set(0, src)
                args.set(1, self.h_ptr)
                args.set(2, self.tau_ptr)
                if self.fac.keep:  # the kept regions' offsets scale with the chunk's matrices
                    args.set(3, ws.ptrs[v[0]] + 4 * v[1])
                    args.set(4, ws.ptrs[z[0]] + 4 * z[1])
            _launch_panel(func, L, self.nb, self.stream_ptr, args)
        self._done(stop)

    def _tsqr(self, index, func, L, src, v, z):
        """A tsqr panel: one launch per phase of codegen.tsqr_phases, every tile of every matrix a block. Each
        phase's arguments are packed once per workspace; a call rewrites only src, h and tau (and the V^T and (VT)^T
        offsets in keep plans, which scale with the chunk)."""
        ws = self.ws
        packed = ws.tsqr_args.get(index)
        if packed is None:
            packed = ws.tsqr_args[index] = [
                (ph.tiles, _PackedArgs(_TSQR_PARAMS, (
                    src, self.h_ptr, self.tau_ptr, ws.ptrs[v[0]] + 4 * v[1], ws.ptrs[z[0]] + 4 * z[1],
                    ws.ptrs["ts"], self.strides["ts"], ph.kind, ph.rows, ph.at, ph.out, ph.tau, ph.t, ph.y, ph.v1,
                    L.c0, L.v_ld, L.v_bs))) for ph in codegen.tsqr_phases(L.levels, L.width)]
        launch = self.cupy.cuda.driver.launchKernel
        for tiles, args in packed:
            args.set(0, src)
            args.set(1, self.h_ptr)
            args.set(2, self.tau_ptr)
            if self.fac.keep:
                args.set(3, ws.ptrs[v[0]] + 4 * v[1])
                args.set(4, ws.ptrs[z[0]] + 4 * z[1])
            launch(func.ptr, tiles, self.nb, 1, L.threads, 1, 1, 0, self.stream_ptr, args.address, 0)

    def tmat(self, agg, side=False):
        from .codegen import TMAT_KERNEL

        _, func = self.funcs[TMAT_KERNEL]
        a = agg.a1 - agg.a0
        stop = self._mark("tmat", None)
        self._launch(func, (self.nb, 1, 1), codegen.TMAT_THREADS, codegen.tmat_shared_bytes(a), _TMAT_PARAMS,
                     (self.ptrs["g"], self.tau_ptr + 4 * agg.a0, self.ptrs["t"], a, self.sizes.g, self.fac.k,
                      self.gram_parts, self.ws.chunk * self.sizes.g),
                     self.lanes.side.ptr if side and self.lanes is not None else None)
        self._done(stop)

    def scale(self, phase):
        """Schedule.scaled's power-of-two scale per matrix: phase 0, the scale (the input's largest magnitudes)
        then h = the input scaled (the copy into h where h is not yet one: the panels then read h); phase 2, R
        scaled back (templates/cuda/scale.cu.j2)."""
        _, func = self.funcs[codegen.SCALE_KERNEL]
        stop = self._mark("scale", None)
        per_matrix = max(1, -(-8 * self.sms // self.nb))  # about 8 blocks per SM over the chunk
        grid = (min(per_matrix, -(-self.fac.m * self.fac.n // (4 * codegen.SCALE_THREADS))), self.nb, 1)
        amax = self.ws.amax.data.ptr
        if phase == 0:
            self.cupy.cuda.runtime.memsetAsync(amax, 0, 4 * self.nb, self.stream_ptr)
        src = self.src_ptr if (phase == 0 and self.src_ptr is not None) else self.h_ptr
        for p in ((0, 1) if phase == 0 else (2,)):
            self._launch(func, grid, codegen.SCALE_THREADS, 0, _SCALE_PARAMS,
                         (src, self.h_ptr, amax, p, self.fac.m, self.fac.n))
        self.src_ptr = None
        self._done(stop)

    def _launch(self, func, grid, threads, shared, types, values, stream=None):
        """One driver call with the arguments packed as it takes them (one packed set per signature, rewritten
        each launch: the driver copies the values when the launch is queued): a few µs of host time where CuPy's
        generic kernel call takes about 10."""
        args = self.ws.packed.get(types)
        if args is None:
            args = self.ws.packed[types] = _PackedArgs(types, values)
        else:
            for i, v in enumerate(values):
                args.set(i, v)
        self.cupy.cuda.driver.launchKernel(func.ptr, *grid, threads, 1, 1, shared,
                                           self.stream_ptr if stream is None else stream, args.address, 0)

    def fork(self):
        if self.lanes is not None:
            self.lanes.fork()

    def join(self):
        if self.lanes is not None:
            self.lanes.join()

    def mark(self):
        if self.lanes is not None:
            self.lanes.mark()

    def wait_mark(self):
        if self.lanes is not None:
            self.lanes.wait_mark()

    def gemm(self, stage, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
             precision, via="cublas", side=False):
        """Row-major C = alpha op(A) op(B) + beta C per matrix, as column-major cuBLAS computes C^T; via "split":
        a panel's projection (W = Z^T C) or update (C -= V W) by the split kernels. `side`: on the side lane (its
        own cuBLAS handle and workspace: the two lanes' GEMMs run at once), where the plan has lanes."""
        stop = self._mark(stage, None)
        if via == "split":
            self._split(stage, rows, cols, depth, a, lda, sa, b, ldb, sb, c, ldc, sc)
            self._done(stop)
            return
        side = side and self.lanes is not None
        if stage == "gram":
            self.gram_parts = 1
            parts = min(self.ws.gram_splits, max(1, depth // GRAM_SPLIT_ROWS))
            if precision in ("fp32", "tf32x3") and parts > 1 and self._gemm3(
                    trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, side,
                    parts):
                self.gram_parts = parts
                self._done(stop)
                return
        if precision == "tf32x3":
            if self._gemm3(trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, side):
                self._done(stop)
                return
            precision = "fp32"  # products the gemm3 kernels do not take (thin or not 16-byte aligned): cuBLAS fp32
        cublas.gemm(self.device_id, self.lanes.side.ptr if side else self.stream_ptr, trans_a, trans_b, rows, cols,
                    depth, alpha, self.ptrs[a[0]] + 4 * a[1], lda, sa, self.ptrs[b[0]] + 4 * b[1], ldb, sb, beta,
                    self.ptrs[c[0]] + 4 * c[1], ldc, sc, self.nb, precision, slot=int(side),
                    sm_target=self.side_sms if side else 0)
        self._done(stop)

    def _gemm3(self, trans_a, trans_b, rows, cols, depth, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, side,
               parts=1):
        """C = alpha op(A) op(B) + beta C by the tf32x3 kernel for op(A) op(B) = A B (the projection's layout),
        A^T B (the update's) or A B^T (the Gram matrix's), where every pointer is 16-byte aligned and every
        dimension, leading dimension and batch stride a multiple of 4 floats; False (nothing launched) otherwise.
        parts > 1: K in that many parts, part q written q * chunk * sc floats after C (gram_splits, with beta 0)."""
        kind = {(False, False): "project", (True, False): "update", (False, True): "gram"}.get((trans_a, trans_b))
        ptrs = [self.ptrs[x[0]] + 4 * x[1] for x in (a, b, c)]
        if kind is None or any(p % 16 for p in ptrs) or any(v % 4 for v in (rows, cols, depth, lda, ldb, ldc, sa,
                                                                              sb, sc)):
            return False
        if min(rows, cols, depth) < codegen.GEMM3_MIN:  # a panel's thin products: cuBLAS splits them better
            return False
        kind = codegen.project_kind(rows) if kind == "project" else kind
        cfg = codegen.GEMM3[kind]
        _, func = self.funcs[codegen.gemm3_name(kind)]
        grid = (-(-cols // cfg["bn"]), -(-rows // cfg["bm"]), self.nb * parts)
        self._launch(func, grid, codegen.gemm3_threads(cfg), codegen.gemm3_shared_bytes(cfg), _GEMM3_PARAMS,
                     (ptrs[0], lda, sa, ptrs[1], ldb, sb, ptrs[2], ldc, sc, rows, cols, depth, alpha, beta, parts,
                      self.ws.chunk * sc), self.lanes.side.ptr if side else self.stream_ptr)
        return True

    def fused(self, z, zld, zs, v, vld, vs, width, rows, c, nc):
        """A panel's W = Z^T C and C -= V W (C: rows x nc of h from offset c[1]) in one launch of the fused kernel
        (timed as the stage "project")."""
        stop = self._mark("project", None)
        cluster = codegen.fused_cluster(self.nb, nc, rows, self.ws.sms)
        name = codegen.fused_name(width, cluster)
        _, func = self.funcs[name]
        ptr = self.ptrs
        self._launch(func, (-(-nc // 32), self.nb, cluster), codegen.FUSED_THREADS, self.fac.shared_bytes[name],
                     _FUSED_PARAMS,
                     (ptr[z[0]] + 4 * z[1], zld, zs, ptr[v[0]] + 4 * v[1], vld, vs, ptr[c[0]] + 4 * c[1], self.fac.n,
                      self.fac.m * self.fac.n, rows, nc))
        self._done(stop)

    def _split(self, stage, rows, cols, depth, a, lda, sa, b, ldb, sb, c, ldc, sc):
        ptr = self.ptrs
        tiles = -(-cols // 32)
        if stage == "project":  # W (rows = width, cols) = Z^T (width x depth) C (depth x cols)
            splits, chunk = split_rows(depth, cols, self.ws.chunk, self.ws.sms)  # as the workspace was sized
            _, func = self.funcs[codegen.split_name("project", rows)]
            part = self.ws.buffers["part"]
            self._launch(func, (tiles, splits, self.nb), codegen.SPLIT_THREADS, 0, _SPLIT_PROJECT_PARAMS,
                         (ptr[a[0]] + 4 * a[1], lda, sa, ptr[b[0]] + 4 * b[1], ldb, sb, part.data.ptr, part.shape[1],
                          ptr[c[0]] + 4 * c[1], ldc, sc, self.ws.counters.data.ptr, depth, cols, chunk))
        else:  # C (rows x cols) -= V (V^T: depth = width x rows) W (width x cols)
            _, func = self.funcs[codegen.split_name("update", depth)]
            self._launch(func, (tiles, -(-rows // codegen.SPLIT_TILE), self.nb), codegen.SPLIT_THREADS, 0,
                         _SPLIT_UPDATE_PARAMS, (ptr[a[0]] + 4 * a[1], lda, sa, ptr[b[0]] + 4 * b[1], ldb, sb,
                                                ptr[c[0]] + 4 * c[1], ldc, sc, rows, cols))


def _factor(fac: Factorizer, h, tau, ws: _Workspace, device_id: int, src=None, stages: list | None = None,
            skip=(), q=None) -> None:
    """In place on h (batch, m, n), writing tau (batch, k); on CuPy's current stream. The first panel reads src
    (the input) instead of h where given. With `stages`, each launch is bracketed by CUDA events appended there
    as (stage, launch, start, stop), stage being "panel", "project", "update", "gram", "tmat" or "aggregate";
    a lookahead schedule then runs on one stream (each launch timed alone), else on its two lanes."""
    import cupy

    funcs = fac._load(device_id)
    batch = h.shape[0]
    lanes = ws.lanes if stages is None else None
    with lanes.from_stream(cupy.cuda.get_current_stream()) if lanes else contextlib.nullcontext():
        for b0 in range(0, batch, ws.chunk):
            nb = min(ws.chunk, batch - b0)
            whole = nb == batch
            hc, tc = (h, tau) if whole else (h[b0:b0 + nb], tau[b0:b0 + nb])
            sc = None if src is None else (src if whole else src[b0:b0 + nb])
            if ws.multi_block:
                ws.flags.fill(0)
            engine = _CupyEngine(fac, ws, funcs, hc, tc, sc, stages, device_id, lanes)
            drive(fac, SkipStages(engine, skip) if skip else engine)
            if q is not None:
                engine.ptrs["q"] = q[b0:b0 + nb].data.ptr
                drive_q(fac, engine, q.shape[2])


_COMMON_FUNCTIONS: dict[tuple, tuple] = {}  # (device, kernel name) -> (module, function)


def _common_kernel(kernel: codegen.KernelSpec, render, device: int):
    """A kernel that is the same for every schedule (the T kernel, the gemm3 kernels), rendered (render(arch)),
    built or taken from the cache and loaded once per device, for the Q functions, which have no Factorizer."""
    key = (device, kernel.name)
    if key not in _COMMON_FUNCTIONS:
        rendered = render(device_arch(device))
        (binary,) = compile_many([(rendered.name, rendered.source)], device_arch(device))
        _COMMON_FUNCTIONS[key] = load_function(binary, kernel.shared_bytes)
    return _COMMON_FUNCTIONS[key][1]


CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # (CuPy does not name it)


class _LaunchConfig(ctypes.Structure):
    """The driver's CUlaunchConfig (cuda.h), for cuOccupancyMaxActiveClusters."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def max_active_clusters(func_ptr: int, blocks: int, threads: int, shared_bytes: int) -> int:
    """How many clusters of `blocks` blocks of this kernel (its cluster size compiled in) the current device can
    hold at once (cuOccupancyMaxActiveClusters): 0 where no GPC has room for one."""
    lib = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_int(0)
    config = _LaunchConfig((blocks, 1, 1), (threads, 1, 1), shared_bytes, None, None, 0)
    status = lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(func_ptr), ctypes.byref(config))
    if status != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {status}")
    return count.value


def load_function(binary: Binary, shared_bytes: int, kernel: "codegen.KernelSpec | None" = None) -> tuple:
    """(module, function) of a compiled kernel on the current device, allowed its dynamic shared memory (past
    48 KiB with its static shared memory a kernel must ask for it) and, for a cluster of more than PORTABLE_CLUSTER
    blocks, the non-portable cluster size; a GPU that cannot hold one such cluster is an error that says so."""
    import cupy

    module = cupy.cuda.function.Module()
    module.load(binary.cubin)
    func = module.get_function(binary.name)
    driver = cupy.cuda.driver
    # past 48 KiB of static and dynamic shared memory together (a "whole" kernel's panel state beside its matrix)
    static = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, func.ptr) if shared_bytes else 0
    if shared_bytes and shared_bytes + static > 48 * 1024:
        driver.funcSetAttribute(func.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
    if kernel is not None and kernel.cluster and kernel.blocks > PORTABLE_CLUSTER:
        driver.funcSetAttribute(func.ptr, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        if max_active_clusters(func.ptr, kernel.blocks, kernel.threads, shared_bytes) < 1:
            raise RuntimeError(
                f"kernel {binary.name} runs on clusters of {kernel.blocks} blocks, more than this GPU can hold at "
                f"once (the portable most is {PORTABLE_CLUSTER}); use a schedule whose panels have clusters of at most "
                f"{PORTABLE_CLUSTER} blocks (qrgen tune, or the default schedule)")
    return module, func

def gemm3_matmul(a, b, c, alpha: float, beta: float) -> bool:
    """c = alpha a @ b + beta c in tf32x3 by the gemm3 kernels, on the current device and stream, for CuPy float32
    arrays a (batch, M, K) with K contiguous (the "project" kernel) or M contiguous (a transposed view: "update"),
    b (batch, K, N) and c (batch, M, N) with row-major last two axes, any batch strides; False (nothing launched)
    where the kernels do not take the product: a dimension under codegen.GEMM3_MIN, a leading dimension, batch
    stride or address not a multiple of 4 floats, another layout."""
    import cupy

    batch, rows, depth = a.shape
    cols = b.shape[2]
    (sa, a1, a2), (sb, ldb, b2), (sc, ldc, c2) = ((v // 4 for v in x.strides) for x in (a, b, c))
    kind, lda = (codegen.project_kind(rows), a1) if a2 == 1 else ("update", a2) if a1 == 1 else (None, 0)
    if kind is None or b2 != 1 or c2 != 1 or b.shape[0] != batch or c.shape[0] != batch:
        return False
    if min(rows, cols, depth) < codegen.GEMM3_MIN or any(x.dtype != cupy.float32 or x.data.ptr % 16 for x in (a, b, c)):
        return False
    if any(v % 4 for v in (rows, cols, depth, lda, ldb, ldc, sa, sb, sc)):
        return False
    device = cupy.cuda.Device().id
    kernel, cfg = codegen.gemm3_kernel(kind), codegen.GEMM3[kind]
    func = _common_kernel(kernel, lambda arch: codegen.render_gemm3(kernel, arch), device)
    func((-(-cols // cfg["bn"]), -(-rows // cfg["bm"]), batch), (codegen.gemm3_threads(cfg),),
         (a, np.int32(lda), np.int64(sa), b, np.int32(ldb), np.int64(sb), c, np.int32(ldc), np.int64(sc),
          np.int32(rows), np.int32(cols), np.int32(depth), np.float32(alpha), np.float32(beta), np.int32(1),
          np.int64(0)), shared_mem=kernel.shared_bytes)
    return True


def tmatrix_gpu(gram, tau):
    """T (batch, w, w) of compact WY forms from G = V^T V (batch, w, w) and tau (batch, w), CuPy float32 arrays on
    the current device and stream; w up to codegen.TMAT_MAX."""
    import cupy

    batch, w = tau.shape
    if w > codegen.TMAT_MAX:
        raise ValueError(f"blocks of at most {codegen.TMAT_MAX} reflectors; got {w}")
    device = cupy.cuda.Device().id
    func = _common_kernel(codegen.tmat_kernel(), codegen.render_tmat, device)
    g = cupy.ascontiguousarray(gram, dtype=cupy.float32)
    ts = cupy.ascontiguousarray(tau, dtype=cupy.float32)
    t = cupy.empty((batch, w, w), dtype=cupy.float32)
    if batch and w:
        func((batch,), (codegen.TMAT_THREADS,), (g, ts, t, np.int32(w), np.int64(w * w), np.int32(w), np.int32(1),
                        np.int64(0)), shared_mem=codegen.tmat_shared_bytes(w))
    return t


# ---------------------------------------------------------------------------------------------------------------
# qrgen.geqrf: any shape, kernels built on first use and kept

_FACTORIZERS: dict[tuple, Factorizer] = {}
_FACTORIZERS_LOCK = threading.Lock()


_ARCHES: dict[int, str] = {}


def device_arch(device_id: int) -> str:
    arch = _ARCHES.get(device_id)
    if arch is None:
        import cupy

        arch = _ARCHES[device_id] = f"sm_{cupy.cuda.Device(device_id).compute_capability}"
    return arch


def factorizer_for(m: int, n: int, batch: int, arch: str, precision: str | None = None) -> Factorizer:
    key = (m, n, batch, arch, precision)
    with _FACTORIZERS_LOCK:
        fac = _FACTORIZERS.get(key)
        if fac is None:
            schedule, _ = find(Problem(m, n, batch), Target("cuda", arch), precision=precision)
            fac = Factorizer(m, n, schedule, arch)
            _FACTORIZERS[key] = fac
        return fac


def geqrf(a, *, precision: str | None = None):
    """QR factorization of a batch: a is (..., m, n) float32 on a CUDA device (torch, CuPy or DLPack).

    Returns (h, tau) of a's kind, on its device and current stream, in LAPACK's geqrf convention: h holds R on
    and above the diagonal and the reflectors' tails below it; tau (..., min(m, n)) their scalars. a is not
    modified. Non-contiguous input is accepted (it is copied into h, which is always C-contiguous).
    precision: None runs the shape's schedule as it is (from 2048 columns that may mean tf32 inputs to the
    trailing update's products: within the accuracy gates, about 300 times the backward error of fp32); "fp32"
    runs the same schedule with every product from fp32 inputs.
    """
    if precision is None:
        out = fast_geqrf(None, a)
        if out is not None:
            return out
    check_precision(precision)
    arr = as_device_array(a)
    data = arr.data
    if data.ndim < 2:
        raise ValueError(f"qrgen.geqrf needs an array of shape (..., m, n); got shape {tuple(data.shape)}")
    m, n = data.shape[-2:]
    batch = math.prod(data.shape[:-2])
    if m == 0 or n == 0 or batch == 0:
        return _run(None, arr)
    fac = factorizer_for(m, n, batch, device_arch(data.device.id), precision)
    return _run(fac, arr)


# ---------------------------------------------------------------------------------------------------------------
# The fast lane: calls whose whole work is one kernel launch (20 x 32² and the like), where the general path's
# host time (DLPack in and out, stream objects, workspace lookups: 40 µs a CuPy call, 120 a torch one, measured on
# the H200) would exceed the kernel's. Only for what needs nothing more: a C-contiguous float32 torch.Tensor or
# cupy.ndarray (not subclasses) on the current device, a shape whose factorizer is made and has run on this
# device, batch and stream. Everything else, the first call included, takes the general path, which checks it.

_F32 = np.dtype(np.float32)


def _fast_view(a):
    """(pointer, shape, device, stream pointer, empty) of an input the fast lane takes, else None; empty(shape)
    returns (array of the input's kind, its pointer), allocated as the input's library allocates on that stream."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(a) is cupy.ndarray:
        if a.dtype is not _F32 or a.ndim < 2 or not a.flags.c_contiguous or not a.size:
            return None
        device = a.data.device_id
        if cupy.cuda.runtime.getDevice() != device:
            return None
        return a.data.ptr, a.shape, device, cupy.cuda.get_current_stream().ptr, _cupy_empty
    torch = sys.modules.get("torch")
    if torch is None or type(a) is not torch.Tensor or cupy is None:
        return None
    if (a.dtype is not torch.float32 or not a.is_cuda or a.dim() < 2 or not a.is_contiguous() or not a.numel()
            or a.is_neg()):
        return None
    device = a.get_device()
    if cupy.cuda.runtime.getDevice() != device:
        return None
    stream = _torch_stream(torch, device)

    def empty(shape, dev=a.device):
        out = torch.empty(shape, dtype=torch.float32, device=dev)
        return out, out.data_ptr()

    return a.data_ptr(), tuple(a.shape), device, stream, empty


def _cupy_empty(shape):
    import cupy

    out = cupy.empty(shape, dtype=cupy.float32)
    return out, out.data.ptr


def _fast_target(fac: "Factorizer | None", a):
    """(factorizer, pointer, shape, device, stream pointer, empty) of a call the fast lane may take (_fast_view),
    the factorizer being the given one (a generated module's) if its shape matches, else qrgen.geqrf's for the
    device; None where there is none (not made yet) or the input is not for the fast lane."""
    view = _fast_view(a)
    if view is None:
        return None
    ptr, shape, device, stream, empty = view
    m, n = shape[-2:]
    if fac is None:
        arch = _ARCHES.get(device)
        fac = None if arch is None else _FACTORIZERS.get((m, n, math.prod(shape[:-2]), arch, None))
    elif (fac.m, fac.n) != (m, n):
        fac = None
    return None if fac is None else (fac, ptr, shape, device, stream, empty)


def fast_geqrf(fac: "Factorizer | None", a):
    """(h, tau) by the fast lane, or None where the general path is to run."""
    target = _fast_target(fac, a)
    if target is None or not target[0].one_launch:
        return None
    fac, ptr, shape, device, stream, empty = target
    batch = math.prod(shape[:-2])
    ws = fac.direct_workspace(ptr, batch, device, stream)
    if ws is None:
        return None
    h, h_ptr = empty(shape)
    tau, tau_ptr = empty(shape[:-2] + (fac.k,))
    fac.launch_direct(ws, ptr, batch, device, stream, h_ptr, tau_ptr)
    return h, tau


def fast_qr(fac: "Factorizer | None", a):
    """qr's reduced (q, r) by the fast lane (the fused kernel), or None where the general path is to run."""
    target = _fast_target(fac, a)
    if target is None or target[0].fused_q is None:
        return None
    fac, ptr, shape, device, stream, empty = target
    if device not in fac._q_args or ptr % (4 * fac._direct_vec):
        return None
    q, q_ptr = empty(shape)
    r, r_ptr = empty(shape[:-2] + (fac.n, fac.n))
    fac.launch_qr(device, math.prod(shape[:-2]), ptr, q_ptr, r_ptr, stream)
    return q, r
