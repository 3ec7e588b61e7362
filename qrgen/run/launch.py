"""Loading compiled kernels on a CUDA device and launching them: arguments packed once as the driver takes them,
panel launches (cooperative where a matrix's blocks wait for each other), large clusters, and the kernels that are
the same for every schedule (T, tf32x3) for the functions that have no Factorizer."""
from __future__ import annotations

import ctypes
import warnings

import numpy as np

from ..compile import index
from ..compile.cache import CacheWarning
from ..compile.nvrtc import compile_many, compile_source, install_hint, supported_archs
from ..plan import tf32x3, tmat
from ..plan.family import PANEL_BATCH_ARG, family, panel_grid
from ..targets import Target
from ..targets.cuda import ARCHS

# Launch parameters by signature code (plan/family.SIGNATURE_CODES).
CTYPES = {"P": ctypes.c_uint64, "I": ctypes.c_int32, "L": ctypes.c_int64, "U": ctypes.c_uint32, "F": ctypes.c_float}


class PackedArgs:
    """A kernel's arguments packed once as the driver takes them (an array of pointers to the values), so that a
    launch costs one driver call; per call only the pointers that change (src, h, tau) are rewritten. The driver
    copies the values when the launch is queued, so rewriting them for the next call is safe."""

    def __init__(self, signature: str, values):
        self._pack([CTYPES[code](v) for code, v in zip(signature, values)])

    def _pack(self, values: list) -> None:
        self.values = values
        self.pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.address = ctypes.addressof(self.pointers)

    def set(self, index: int, value) -> None:
        self.values[index].value = value

    def copy(self) -> "PackedArgs":
        """Packed arguments of their own with the same values now."""
        out = PackedArgs.__new__(PackedArgs)
        out._pack([type(v)(v.value) for v in self.values])
        return out


def driver_launch(cooperative: bool, driver=None) -> tuple:
    """(the driver's launch call, its arguments after the packed address) of a kernel launch in stream order
    (docs/decisions.md#stream-order-launches); cooperative: all its blocks resident at once. driver: CuPy's."""
    if driver is None:
        import cupy

        driver = cupy.cuda.driver
    return (driver.launchCooperativeKernel, ()) if cooperative else (driver.launchKernel, (0,))


def queue_kernel(func_ptr: int, grid: tuple, threads: int, shared: int, stream: int, args: PackedArgs,
                 cooperative: bool = False) -> None:
    """One kernel launch on `stream` (driver_launch)."""
    launch, extra = driver_launch(cooperative)
    launch(func_ptr, *grid, threads, 1, 1, shared, stream, args.address, *extra)


def launch_panel(func, L, batch: int, stream: int, args: PackedArgs, sink=None) -> None:
    """A panel kernel's launch for `batch` matrices (its argument nb set here): L.blocks blocks each (or a block for
    L.pack of them), cooperative where the blocks of a matrix wait for each other (all must then be resident);
    queued now, or by `sink` (run/recorded.py)."""
    args.set(PANEL_BATCH_ARG, batch)
    (queue_kernel if sink is None else sink.kernel)(func.ptr, (panel_grid(L, batch), 1, 1), L.threads,
                                                     L.shared_bytes, stream, args, L.cooperative)


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


def load_function(binary, shared_bytes: int, kernel=None, rebuild=None) -> tuple:
    """(module, function) of a compiled kernel on the current device, allowed its dynamic shared memory (past
    48 KiB with its static shared memory a kernel must ask for it) and, for a cluster of more blocks than the arch's
    portable most, the non-portable cluster size; a GPU that cannot hold one such cluster is an error that says so.
    A binary the driver refuses (a cache entry that verifies but does not load) is compiled again once by
    `rebuild()`, which replaces the cache entry, with a CacheWarning."""
    import cupy

    portable = device_target(cupy.cuda.Device().id).limits.cluster_portable

    module = cupy.cuda.function.Module()
    try:
        module.load(binary.cubin)
    except cupy.cuda.driver.CUDADriverError as exc:
        if rebuild is None or not binary.cached:
            raise
        warnings.warn(f"the driver refused the cached binary of {binary.name} ({exc}): compiling it again",
                      CacheWarning, stacklevel=2)
        binary = rebuild()
        module = cupy.cuda.function.Module()
        module.load(binary.cubin)
    func = module.get_function(binary.name)
    driver = cupy.cuda.driver
    # past 48 KiB of static and dynamic shared memory together (a "whole" kernel's panel state beside its matrix)
    static = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, func.ptr) if shared_bytes else 0
    if shared_bytes and shared_bytes + static > 48 * 1024:
        driver.funcSetAttribute(func.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
    if kernel is not None and kernel.cluster and kernel.blocks > portable:
        driver.funcSetAttribute(func.ptr, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        if max_active_clusters(func.ptr, kernel.blocks, kernel.threads, shared_bytes) < 1:
            raise RuntimeError(
                f"kernel {binary.name} runs on clusters of {kernel.blocks} blocks, more than this GPU can hold at "
                f"once (the portable most is {portable}); use a schedule whose panels have clusters of at most "
                f"{portable} blocks (qrgen tune, or the default schedule)")
    return module, func


_TARGETS: dict[int, Target] = {}


def target_for_capability(capability: int, nvrtc_archs: tuple[str, ...]) -> Target:
    """A device of compute capability `capability` (90 for 9.0): Target('cuda', 'sm_90') for an architecture qrgen
    knows (an NVRTC that cannot compile for it is an error naming the extra to install); for a GPU newer than qrgen
    knows, PTX (Target.ptx) for the newest architecture below it that qrgen and the NVRTC both know, with that
    architecture's limits, which the driver compiles for the device."""
    name = f"sm_{capability}"
    if name in ARCHS:
        if name not in nvrtc_archs:
            raise RuntimeError(f"this GPU is {name}, which the installed NVRTC does not compile for (it knows "
                               f"{', '.join(nvrtc_archs)}): {install_hint()}")
        return Target("cuda", name)
    older = [a for a in ARCHS if a in nvrtc_archs and a[3:].isdigit() and int(a[3:]) <= capability]
    if not older:
        raise RuntimeError(f"this GPU is {name}: qrgen supports sm_80 and newer (with this NVRTC: "
                           f"{', '.join(a for a in ARCHS if a in nvrtc_archs) or 'none'})")
    return Target("cuda", max(older, key=lambda a: int(a[3:])), ptx=True)


def current_target() -> Target | None:
    """The current CUDA device's target (device_target), or None where there is no GPU (no driver, no device, no
    CuPy)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
        return device_target(cupy.cuda.Device().id)
    except Exception:
        return None


def known_target(device_id: int) -> Target | None:
    """The device's target where device_target has asked for it already (no driver call), else None."""
    return _TARGETS.get(device_id)


def device_target(device_id: int) -> Target:
    """The CUDA target of a device: its compute capability as sm_XY where qrgen and the installed NVRTC both know
    it, else PTX for the newest architecture below it that both know (target_for_capability)."""
    target = _TARGETS.get(device_id)
    if target is None:
        import cupy

        capability = int(cupy.cuda.Device(device_id).compute_capability)
        target = _TARGETS[device_id] = target_for_capability(capability, supported_archs())
    return target


_SM_COUNTS: dict[int, int] = {}


def sm_count(device_id: int) -> int:
    """The device's number of SMs, asked once per device (one attribute: getDeviceProperties asks for all)."""
    count = _SM_COUNTS.get(device_id)
    if count is None:
        import cupy

        runtime = cupy.cuda.runtime
        count = _SM_COUNTS[device_id] = runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device_id)
    return count


_COMMON_FUNCTIONS: dict[tuple, tuple] = {}  # (device, kernel name) -> (module, function)


def common_kernel(spec, device: int):
    """A kernel that is the same for every schedule (the T kernel, the tf32x3 kernels), rendered, built or taken
    from the cache and loaded once per device, for the Q functions, which have no Factorizer."""
    key = (device, spec.name)
    if key not in _COMMON_FUNCTIONS:
        target = device_target(device)

        def source() -> str:
            rendered = family(spec).render(spec, None, target)
            index.record([(spec, rendered.source)], None, target)
            return rendered.source

        (binary,) = index.lookup([spec], None, target)  # without rendering where the render index has it
        if binary is None:
            (binary,) = compile_many([(spec.name, source())], target)
        _COMMON_FUNCTIONS[key] = load_function(
            binary, spec.shared_bytes,
            rebuild=lambda: compile_source(spec.name, source(), target.arch, ptx=target.ptx, refresh=True))
    return _COMMON_FUNCTIONS[key][1]


def tf32x3_matmul(a, b, c, alpha: float, beta: float) -> bool:
    """c = alpha a @ b + beta c by the tf32x3 kernels, on the current device and stream, for CuPy float32
    arrays a (batch, M, K) with K contiguous (the "project" kernel) or M contiguous (a transposed view: "update"),
    b (batch, K, N) and c (batch, M, N) with row-major last two axes, any batch strides; False (nothing launched)
    where the kernels do not take the product: a dimension under tf32x3.MIN, a leading dimension, batch
    stride or address not a multiple of 4 floats, another layout."""
    import cupy

    batch, rows, depth = a.shape
    cols = b.shape[2]
    (sa, a1, a2), (sb, ldb, b2), (sc, ldc, c2) = ((v // 4 for v in x.strides) for x in (a, b, c))
    sms = sm_count(cupy.cuda.Device().id)
    kind, lda = ((tf32x3.project_kind(rows, cols, batch, sms), a1) if a2 == 1 else ("update", a2) if a1 == 1
                 else (None, 0))
    if kind is None or b2 != 1 or c2 != 1 or b.shape[0] != batch or c.shape[0] != batch:
        return False
    if min(rows, cols, depth) < tf32x3.MIN or any(x.dtype != cupy.float32 or x.data.ptr % 16 for x in (a, b, c)):
        return False
    if any(v % 4 for v in (rows, cols, depth, lda, ldb, ldc, sa, sb, sc)):
        return False
    grid = tf32x3.grid(kind, rows, cols, batch)
    if grid is None:
        return False
    kernel = tf32x3.kernel(kind)
    func = common_kernel(kernel, cupy.cuda.Device().id)
    func(grid, (kernel.threads,),
         (a, np.int32(lda), np.int64(sa), b, np.int32(ldb), np.int64(sb), c, np.int32(ldc), np.int64(sc),
          np.int32(rows), np.int32(cols), np.int32(depth), np.float32(alpha), np.float32(beta), np.int32(1),
          np.int64(0)), shared_mem=kernel.shared_bytes)
    return True


def t_max_gpu() -> int:
    """The most reflectors tmatrix_gpu takes on the current device."""
    import cupy

    return tmat.max_reflectors(device_target(cupy.cuda.Device().id))


def tmatrix_gpu(gram, tau):
    """T (batch, w, w) of compact WY forms from G = V^T V (batch, w, w) and tau (batch, w), CuPy float32 arrays on
    the current device and stream; w up to plan/tmat.MAX."""
    import cupy

    batch, w = tau.shape
    device = cupy.cuda.Device().id
    target = device_target(device)
    if w > tmat.max_reflectors(target):
        raise ValueError(f"blocks of at most {tmat.max_reflectors(target)} reflectors on this GPU; got {w}")
    func = common_kernel(tmat.kernel(target), device)
    g = cupy.ascontiguousarray(gram, dtype=cupy.float32)
    ts = cupy.ascontiguousarray(tau, dtype=cupy.float32)
    t = cupy.empty((batch, w, w), dtype=cupy.float32)
    if batch and w:
        func((batch,), (tmat.threads(w),), (g, ts, t, np.int32(w), np.int64(w * w), np.int32(w)),
             shared_mem=tmat.shared_bytes(w))
    return t
