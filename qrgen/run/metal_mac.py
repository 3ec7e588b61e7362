"""The lines only a Mac runs: Metal through PyObjC (pyobjc-framework-Metal). NEVER RUN in this project, which has
no Apple GPU; everything around it (the engine, the runtime, the kernels) runs here on the translation layers of
run/msl_devices.py, which stand in for this device with the same methods.

Why PyObjC: it gives what the runtime needs and MLX's and torch.mps's shader APIs do not both give: the whole
kernel source with its own signature and [[threadgroup(0)]] memory argument, the compile options (no fast math) and
pipelines kept in a binary archive on disk. Arrays live in shared-storage MTLBuffers (unified memory); `wrap` makes
one over memory the caller already holds (an MLX array's, seen through the buffer protocol) without a copy:
newBufferWithBytesNoCopy over the whole pages around it, the array at an offset into them."""
from __future__ import annotations

import ctypes
import functools
import mmap
import platform
import sys
from typing import NamedTuple

import numpy as np

from ..compile import cache, msl
from ..paths import cache_dir

# MTLCompileOptions: IEEE float (fast math changes the reflectors' square roots and divisions), MSL 3.0 (macOS 13);
# MSL 3.1 (macOS 14) for kernels with bfloat (its first version).
OPTIONS = ("fastMathEnabled=NO", "languageVersion=3.0")
BFLOAT_OPTIONS = ("fastMathEnabled=NO", "languageVersion=3.1")
FAMILIES = (("apple10", 1010), ("apple9", 1009), ("apple8", 1008), ("apple7", 1007))  # MTLGPUFamilyAppleN values


def available() -> bool:
    """On macOS with PyObjC's Metal bindings and a Metal device."""
    if sys.platform != "darwin":
        return False
    try:
        import Metal

        return Metal.MTLCreateSystemDefaultDevice() is not None
    except Exception:
        return False


@functools.cache
def shared_device() -> "MacDevice":
    return MacDevice()


class Array(NamedTuple):
    """A device array: `count` elements of `dtype` at byte `offset` of an MTLBuffer; `owner` keeps wrapped memory
    alive."""

    buf: object
    count: int
    dtype: np.dtype
    offset: int = 0
    owner: object = None


class MacDevice:
    def __init__(self):
        import Metal

        self.mtl = Metal
        self.dev = Metal.MTLCreateSystemDefaultDevice()
        self.queue = self.dev.newCommandQueue()
        self.family = next((f for f, code in FAMILIES if self.dev.supportsFamily_(code)), "apple7")
        self.name = f"{self.dev.name()} ({self.family})"
        self.compiler = (platform.mac_ver()[0], "metal")
        self.kernels: dict[str, tuple] = {}
        self.command = None

    # Arrays: shared-storage MTLBuffers with a NumPy view of their contents.
    def _buffer(self, nbytes: int):
        buf = self.dev.newBufferWithLength_options_(max(16, nbytes), self.mtl.MTLResourceStorageModeShared)
        return buf

    def _view(self, x: Array) -> np.ndarray:
        size = x.count * np.dtype(x.dtype).itemsize
        return np.frombuffer(x.buf.contents().as_buffer(x.offset + size), dtype=x.dtype, count=x.count,
                             offset=x.offset)

    def array(self, host: np.ndarray) -> Array:
        host = np.ascontiguousarray(host)
        x = Array(self._buffer(host.nbytes), host.size, host.dtype)
        self._view(x)[...] = host.reshape(-1)
        return x

    def empty(self, count: int, dtype=np.float32) -> Array:
        x = Array(self._buffer(max(1, count) * np.dtype(dtype).itemsize), max(1, count), np.dtype(dtype))
        self.fill(x, np.nan if dtype == np.float32 else 0)
        return x

    def wrap(self, view: np.ndarray) -> Array | None:
        """The memory of a C-contiguous, writable NumPy view of unified memory as a device array, without a copy
        (its pages wrapped by newBufferWithBytesNoCopy, which takes page-aligned memory); None where Metal refuses."""
        if not (view.flags.c_contiguous and view.flags.writeable) or view.size == 0:
            return None
        ptr = view.ctypes.data
        base = ptr - ptr % mmap.PAGESIZE
        length = -(-(ptr - base + view.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        pages = (ctypes.c_char * length).from_address(base)
        buf = self.dev.newBufferWithBytesNoCopy_length_options_deallocator_(
            pages, length, self.mtl.MTLResourceStorageModeShared, None)
        return None if buf is None else Array(buf, view.size, view.dtype, ptr - base, (view, pages))

    def copy(self, src: Array, dst: Array) -> None:
        """dst's first elements = src, on the GPU, in order with the dispatches."""
        if self.command is None:
            self.command = self.queue.commandBuffer()
        enc = self.command.blitCommandEncoder()
        enc.copyFromBuffer_sourceOffset_toBuffer_destinationOffset_size_(
            src.buf, src.offset, dst.buf, dst.offset, src.count * np.dtype(src.dtype).itemsize)
        enc.endEncoding()

    def to_host(self, x: Array) -> np.ndarray:
        self.synchronize()
        return self._view(x).copy()

    def fill(self, x: Array, value: float) -> None:
        self.synchronize()
        self._view(x)[...] = value

    def load(self, name: str, source: str):
        bfloat = "bfloat" in source
        key = cache.key(source, self.family, BFLOAT_OPTIONS if bfloat else OPTIONS, self.compiler)  # all that
        if key in self.kernels:  # changes the binary
            return self.kernels[key]
        sig = msl.signature(source, name)
        options = self.mtl.MTLCompileOptions.new()
        options.setFastMathEnabled_(False)
        options.setLanguageVersion_(self.mtl.MTLLanguageVersion3_1 if bfloat else self.mtl.MTLLanguageVersion3_0)
        library, error = self.dev.newLibraryWithSource_options_error_(source, options, None)
        if library is None:
            raise RuntimeError(f"{name}: the Metal compiler refused it: {error}")
        archive_path = cache_dir() / self.family / f"{name}-{key[:32]}.metalarchive"
        archive_path.parent.mkdir(parents=True, exist_ok=True)
        desc = self.mtl.MTLBinaryArchiveDescriptor.new()
        if archive_path.exists():
            desc.setUrl_(self.mtl.NSURL.fileURLWithPath_(str(archive_path)))
        archive, _ = self.dev.newBinaryArchiveWithDescriptor_error_(desc, None)
        pipe_desc = self.mtl.MTLComputePipelineDescriptor.new()
        pipe_desc.setComputeFunction_(library.newFunctionWithName_(name))
        if archive is not None:
            pipe_desc.setBinaryArchives_([archive])
        pipeline, _, error = self.dev.newComputePipelineStateWithDescriptor_options_reflection_error_(
            pipe_desc, 0, None, None)
        if pipeline is None:
            raise RuntimeError(f"{name}: no compute pipeline: {error}")
        if archive is not None and not archive_path.exists():
            archive.addComputePipelineFunctionsWithDescriptor_error_(pipe_desc, None)
            archive.serializeToURL_error_(self.mtl.NSURL.fileURLWithPath_(str(archive_path)), None)
        kernel = (name, pipeline, sig)
        self.kernels[key] = kernel
        return kernel

    def dispatch(self, kernel, grid, threads: int, buffers, args, tg_floats: int) -> None:
        name, pipeline, sig = kernel
        msl.check_launch(name, threads, tg_floats)
        if pipeline.maxTotalThreadsPerThreadgroup() < threads:
            raise RuntimeError(f"{name}: Metal grants {pipeline.maxTotalThreadsPerThreadgroup()} threads per "
                               f"threadgroup to this pipeline (its registers), the schedule needs {threads}")
        if self.command is None:
            self.command = self.queue.commandBuffer()
        enc = self.command.computeCommandEncoder()
        enc.setComputePipelineState_(pipeline)
        for i, x in enumerate(buffers):
            enc.setBuffer_offset_atIndex_(x.buf, x.offset, i)
        packed = np.asarray(args, dtype=np.int32).tobytes()
        enc.setBytes_length_atIndex_(packed, len(packed), len(buffers))
        enc.setThreadgroupMemoryLength_atIndex_(-(-4 * tg_floats // 16) * 16, 0)  # Metal takes multiples of 16 bytes
        enc.dispatchThreadgroups_threadsPerThreadgroup_(self.mtl.MTLSizeMake(*grid),
                                                        self.mtl.MTLSizeMake(threads, 1, 1))
        enc.endEncoding()

    def synchronize(self) -> None:
        if self.command is not None:
            command, self.command = self.command, None
            command.commit()
            command.waitUntilCompleted()
            if command.error() is not None:
                raise RuntimeError(f"a Metal command buffer failed: {command.error()}")
