"""Arrays in and out: torch tensors, CuPy arrays and any __dlpack__ array on a CUDA device, seen as CuPy arrays
without copies, and results handed back as the caller's kind, on the caller's device and stream."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import numpy as np

_KDLCUDA = 2


@dataclass
class DeviceArray:
    """The input seen as a CuPy array (no copy), and how to hand results back as the caller's kind."""

    data: object  # cupy.ndarray
    stream_ptr: int | None  # the caller's current stream (torch), None for CuPy's current stream
    wrap: object = field(default=None)
    allocator: object = None  # where the call's outputs and workspaces come from (torch's allocator for torch)


def describe(a) -> str:
    return f"{type(a).__module__}.{type(a).__qualname__}"


def as_device_array(a) -> DeviceArray:
    """Accept a torch.Tensor, cupy.ndarray or any object with __dlpack__ on a CUDA device, without copying."""
    try:
        import cupy
    except ImportError as exc:
        from ..compile.nvrtc import install_hint

        raise RuntimeError(f"qrgen's GPU functions need CuPy ({exc}): {install_hint()}; NumPy arrays go to "
                           f"qrgen.numerics.numpy_api") from None

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        if a.device.type != "cuda":
            raise TypeError(f"qrgen needs a CUDA tensor; got a torch.Tensor on {a.device}: move it with a.cuda()")
        check_dtype(str(a.dtype).replace("torch.", ""))
        if a.is_neg():  # a lazily negated view: its memory holds -a
            a = a.resolve_neg()
        device = a.get_device()
        return DeviceArray(cupy_view(cupy, a, device), torch_stream(torch, device), torch_result(torch),
                           torch_allocator(torch, device))
    if isinstance(a, cupy.ndarray):
        check_dtype(str(a.dtype))
        return DeviceArray(a, None, lambda x: x)
    if isinstance(a, np.ndarray) or not hasattr(a, "__dlpack__"):
        hint = " (a NumPy array lives on the host: use cupy.asarray(a))" if isinstance(a, np.ndarray) else ""
        raise TypeError(f"qrgen takes a float32 array on a CUDA device (torch.Tensor, cupy.ndarray or any "
                        f"__dlpack__ array); got a host or unknown array {describe(a)}{hint}")
    device_type, _ = a.__dlpack_device__()
    if int(device_type) != _KDLCUDA:
        raise TypeError(f"qrgen takes arrays on a CUDA device; {describe(a)} is on DLPack device type "
                        f"{int(device_type)} (1 is the host)")
    dtype = getattr(a, "dtype", None)
    if dtype is not None:
        check_dtype(str(dtype))
    data = cupy.from_dlpack(a)
    check_dtype(str(data.dtype))
    module = sys.modules.get(type(a).__module__.split(".")[0])
    back = getattr(module, "from_dlpack", None) if module is not None else None
    return DeviceArray(data, None, back or (lambda x: x))


def cupy_view(cupy, a, device: int):
    """A CuPy array over a CUDA float32 torch.Tensor's memory (its strides, the tensor kept alive as the owner): no
    DLPack exchange, whose stream handshake is not needed where the work runs on the tensor's current stream."""
    shape, strides = tuple(a.shape), tuple(4 * s for s in a.stride())
    if not a.numel():
        return cupy.empty(shape, cupy.float32)
    extent = 4 + sum((d - 1) * s for d, s in zip(shape, strides))
    memory = cupy.cuda.UnownedMemory(a.data_ptr(), extent, a, device)
    return cupy.ndarray(shape, cupy.float32, cupy.cuda.MemoryPointer(memory, 0), strides)


_TORCH_ALLOCATORS: dict[int, object] = {}


def torch_allocator(torch, device: int):
    """CuPy allocations from torch's caching allocator on a device, for calls on torch tensors: their outputs and
    workspaces are memory torch sees and accounts for, and inside a torch.cuda.graph capture they come from the
    graph's pool, as torch's own would (CuPy's pool would call cudaMalloc, which invalidates a capture)."""
    malloc = _TORCH_ALLOCATORS.get(device)
    if malloc is None:
        import cupy

        where = torch.device("cuda", device)

        def malloc(nbytes: int):
            block = torch.empty(-(-nbytes // 16) * 16, dtype=torch.uint8, device=where)
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.data_ptr(), nbytes, block, device), 0)

        _TORCH_ALLOCATORS[device] = malloc
    return malloc


def torch_result(torch):
    """Hands a CuPy result back as a torch.Tensor: a view of the torch block it was allocated in (torch_allocator),
    with no DLPack exchange, whose stream handshake would make the caller's stream wait on CuPy's (an event on
    uncaptured work, which a torch.cuda.graph capture refuses); DLPack for memory from elsewhere."""
    def wrap(x):
        owner = getattr(x.data.mem, "_owner", None)
        if not x.size:
            return torch.empty(x.shape, dtype=torch.float32, device=torch.device("cuda", x.device.id))
        if isinstance(owner, torch.Tensor):  # a tensor of its own on the block's storage (not a view of it)
            out = torch.empty(0, dtype=torch.float32, device=owner.device)
            return out.set_(owner.untyped_storage(), (x.data.ptr - owner.data_ptr()) // 4, x.shape,
                            tuple(s // 4 for s in x.strides))
        return torch.from_dlpack(x)
    return wrap


def torch_stream(torch, device: int) -> int:
    """The handle of torch's current stream on a device (torch's raw accessor where it has one: a Stream object
    costs host time, docs/decisions.md#torch-without-dlpack)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def check_dtype(name: str) -> None:
    if name != "float32":
        raise TypeError(f"qrgen factors float32 matrices; got dtype {name}: convert with .astype('float32') "
                        f"(CuPy) or .float() (torch)")


@contextlib.contextmanager
def on_caller_stream(arr: DeviceArray):
    """Make the array's device current and the caller's stream CuPy's current stream; yields that stream."""
    import cupy

    with contextlib.ExitStack() as scope:
        if cupy.cuda.runtime.getDevice() != arr.data.device.id:
            scope.enter_context(cupy.cuda.Device(arr.data.device.id))
        if arr.stream_ptr is None:
            stream = cupy.cuda.get_current_stream()
        else:
            stream = external_stream(arr.stream_ptr, arr.data.device.id)
            scope.enter_context(stream)
        if arr.allocator is not None:
            scope.enter_context(cupy.cuda.using_allocator(arr.allocator))
        yield stream


_EXTERNAL_STREAMS: dict[tuple[int, int], object] = {}


def external_stream(ptr: int, device: int):
    """CuPy's handle on another framework's stream of a device, made with that device current (kept per device and
    pointer: creating one per call costs host time, and pointer 0, the legacy default stream, is every device's)."""
    key = (device, ptr)
    stream = _EXTERNAL_STREAMS.get(key)
    if stream is None:
        import cupy

        class _Handle:  # the CUDA stream protocol, for Stream.from_external
            def __cuda_stream__(self):
                return (0, ptr)

        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        with cupy.cuda.Device(device):
            stream = from_external(_Handle()) if from_external else cupy.cuda.ExternalStream(ptr, device)
        _EXTERNAL_STREAMS[key] = stream
    return stream


def device_copy(src, stream, dst=None):
    """src into dst (a new C-contiguous array where dst is None), CuPy arrays, on `stream`: one driver copy where src
    is C-contiguous (CuPy's copy is an elementwise kernel: more host time per call, and a process's first one runs
    NVRTC for CuPy's own cache key: docs/decisions.md#render-index), else CuPy's copy."""
    import cupy

    if dst is None:
        dst = cupy.empty(src.shape, dtype=src.dtype)
    if src.flags.c_contiguous:
        if src.nbytes:
            runtime = cupy.cuda.runtime
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, runtime.memcpyDeviceToDevice, stream.ptr)
    else:
        dst[...] = src
    return dst
