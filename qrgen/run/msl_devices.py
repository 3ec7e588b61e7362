"""Where the Metal kernels run away from a Mac: the CPU (compile/msl.to_cpu, built with the host's C++ compiler,
threadgroups run one after another with their threads as fibers) and an NVIDIA GPU (compile/msl.to_cuda through
NVRTC and CuPy). Both allow exactly Apple's limits on a dispatch (compile/msl.check_launch). A device holds float32
and int32 arrays and runs dispatches in order; the Metal engine (run/metal_engine.py) drives it. On macOS the
device is run/metal_mac.py's."""
from __future__ import annotations

import ctypes

import numpy as np

from ..compile import msl
from ..compile.host import compiler, shared_library

CXX_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-w")


class CpuDevice:
    """The CPU layer: NumPy arrays, kernels as shared libraries built by the host's C++ compiler ($CXX, else c++)
    into the kernel cache's msl-cpu folder (keyed by the translated source and the compiler's version)."""

    name = "cpu (MSL translation layer)"

    def __init__(self):
        compiler()  # a RuntimeError here where there is no C++ compiler

    def array(self, host: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(host).copy()

    def empty(self, count: int, dtype=np.float32) -> np.ndarray:
        return np.full(max(1, count), np.nan if dtype == np.float32 else 0, dtype=dtype)

    def to_host(self, x) -> np.ndarray:
        return np.array(x)

    def wrap(self, view: np.ndarray) -> np.ndarray | None:
        """Host memory is this device's: a C-contiguous, writable view is a device array as it is (no copy)."""
        return view.reshape(-1) if view.flags.c_contiguous and view.flags.writeable and view.size else None

    def copy(self, src, dst) -> None:
        dst[:src.size] = src

    def fill(self, x, value: float) -> None:
        x[...] = value

    def load(self, name: str, source: str):
        code, sig = msl.to_cpu(source, name)
        fn = getattr(shared_library(name, code, "msl-cpu", CXX_FLAGS), f"{name}__launch")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p] + [ctypes.c_int] * 5
        return name, fn, sig

    def dispatch(self, kernel, grid, threads: int, buffers, args, tg_floats: int) -> None:
        name, fn, sig = kernel
        msl.check_launch(name, threads, tg_floats)
        arg = np.ascontiguousarray(args, dtype=np.int32)
        arrays = list(buffers) + [arg]
        if len(arrays) != len(sig.buffers):
            raise ValueError(f"{name} takes {len(sig.buffers)} buffers, got {len(arrays)}")
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        tg = np.empty(tg_floats, dtype=np.float32)
        if fn(pointers, tg.ctypes.data, *grid, threads, tg_floats):
            raise RuntimeError(f"{name}: a threadgroup deadlocked (a barrier or SIMD-group exchange that not every "
                               f"thread reached)")

    def synchronize(self) -> None:
        pass


class CudaDevice:
    """The CUDA layer: CuPy arrays on the current GPU, kernels compiled by NVRTC (CuPy's RawModule, its cache)."""

    name = "cuda (MSL translation layer)"
    OPTIONS = ("-std=c++17", "-default-device")

    def __init__(self):
        import cupy

        self.cp = cupy

    def array(self, host: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(host))

    def empty(self, count: int, dtype=np.float32):
        return self.cp.full(max(1, count), np.nan if dtype == np.float32 else 0, dtype=dtype)

    def to_host(self, x) -> np.ndarray:
        return self.cp.asnumpy(x)

    def wrap(self, view: np.ndarray) -> None:
        """Host memory is not this GPU's: nothing is wrapped (the runtime copies)."""
        return None

    def copy(self, src, dst) -> None:
        dst[:src.size] = src

    def fill(self, x, value: float) -> None:
        x.fill(value)

    def load(self, name: str, source: str):
        code, sig = msl.to_cuda(source, name)
        fn = self.cp.RawModule(code=code, options=self.OPTIONS).get_function(f"{name}__msl")
        if fn.shared_size_bytes:
            raise ValueError(f"{name} declares {fn.shared_size_bytes} bytes of static shared memory: Metal kernels get "
                             f"threadgroup memory from their argument only")
        return name, fn, sig

    def dispatch(self, kernel, grid, threads: int, buffers, args, tg_floats: int) -> None:
        name, fn, sig = kernel
        msl.check_launch(name, threads, tg_floats)
        arrays = list(buffers) + [self.cp.asarray(np.asarray(args, dtype=np.int32))]
        if len(arrays) != len(sig.buffers):
            raise ValueError(f"{name} takes {len(sig.buffers)} buffers, got {len(arrays)}")
        fn(tuple(grid), (threads, 1, 1), tuple(arrays), shared_mem=4 * tg_floats)

    def synchronize(self) -> None:
        self.cp.cuda.Device().synchronize()
