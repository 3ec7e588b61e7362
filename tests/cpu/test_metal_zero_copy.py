"""CPU layer, Metal: geqrf without host copies (run/metal_runtime.py): the input's memory and the new outputs of its
kind wrapped as device arrays (device.wrap), the input copied into h on the device, h and tau written in place;
the copying path where the device wraps nothing; MLX's glue on a stand-in module; and the Mac device's page
arithmetic (run/metal_mac.MacDevice.wrap) on a stand-in for PyObjC's MTLDevice. No Mac has run any of it."""
import ctypes
import mmap
import sys
import types

import numpy as np

from qrgen.numerics.check import check
from qrgen.numerics.stress import stress
from qrgen.run import metal_mac, metal_runtime


class Refusing:
    """A device that wraps nothing (as the CUDA layer, or Metal refusing the memory): the runtime copies."""

    def __init__(self, device):
        self.device = device

    def __getattr__(self, name):
        return getattr(self.device, name)

    def wrap(self, view):
        return None


def test_geqrf_writes_into_new_arrays_of_the_inputs_kind_without_host_copies(cpu_device, monkeypatch):
    a = stress("nearrankdef", 90, 70, 6, seed=1).reshape(2, 3, 90, 70)
    before = a.copy()
    h_copied, tau_copied = metal_runtime.geqrf(a, Refusing(cpu_device))
    staged = []
    monkeypatch.setattr(type(cpu_device), "array", lambda self, host: staged.append(host) or host.copy())
    monkeypatch.setattr(type(cpu_device), "to_host", lambda self, x: staged.append(x) or np.array(x))
    h, tau = metal_runtime.geqrf(a, cpu_device)
    assert not staged  # nothing went through device.array or device.to_host
    assert np.array_equal(a, before) and h.shape == a.shape and tau.shape == (2, 3, 70)
    assert np.array_equal(h, h_copied) and np.array_equal(tau, tau_copied)
    assert check(a, h, tau).ok


def test_inputs_that_cannot_be_wrapped_are_copied(cpu_device):
    a = stress("random", 70, 90, 4, seed=2)
    transposed = np.swapaxes(stress("random", 90, 70, 4, seed=2), 1, 2)  # not C-contiguous: copied
    h, tau = metal_runtime.geqrf(transposed, cpu_device)
    assert check(transposed, h, tau).ok
    readonly = a.copy()
    readonly.flags.writeable = False
    assert check(a, *metal_runtime.geqrf(readonly, cpu_device)).ok


def test_mlx_arrays_are_wrapped_through_the_buffer_protocol(cpu_device, monkeypatch):
    """MLX's glue on a stand-in mlx.core: the input read through np.array(a, copy=False), outputs made by
    mx.zeros and written through their views."""
    core = types.ModuleType("mlx.core")

    class array:  # noqa: N801 (mlx.core.array)
        def __init__(self, data):
            self.data = np.array(data, dtype=np.float32)
            self.dtype = core.float32

        @property
        def __array_interface__(self):
            return self.data.__array_interface__

        @property
        def shape(self):
            return self.data.shape

    array.__module__ = "mlx.core"
    core.array, core.float32 = array, "float32"
    core.zeros = lambda shape, dtype: array(np.zeros(shape))
    core.eval = lambda *arrays: None
    mlx = types.ModuleType("mlx")
    mlx.core = core
    monkeypatch.setitem(sys.modules, "mlx", mlx)
    monkeypatch.setitem(sys.modules, "mlx.core", core)
    a = stress("colscaled", 64, 48, 3, seed=3)
    h, tau = metal_runtime.geqrf(array(a), cpu_device)
    assert isinstance(h, array) and isinstance(tau, array)
    assert check(a, h.data, tau.data).ok
    assert np.array_equal(h.data, metal_runtime.geqrf(a, Refusing(cpu_device))[0])


def test_the_mac_device_wraps_the_pages_around_an_array_and_sees_it_at_its_offset():
    made = []

    class Pages:  # an MTLBuffer over memory it does not own
        def __init__(self, pages, length):
            self.pages, self.length = pages, length

        def contents(self):
            return types.SimpleNamespace(as_buffer=lambda n: memoryview(self.pages).cast("B")[:n])

    class Device:
        def newBufferWithBytesNoCopy_length_options_deallocator_(self, pages, length, options, deallocator):
            made.append((ctypes.addressof(pages), length, options, deallocator))
            return Pages(pages, length)

    mac = object.__new__(metal_mac.MacDevice)
    mac.dev, mac.mtl, mac.command = Device(), types.SimpleNamespace(MTLResourceStorageModeShared=0), None
    memory = np.zeros(3 * mmap.PAGESIZE, dtype=np.uint8)
    view = memory[100:100 + 4 * 1000].view(np.float32)  # 1000 floats 100 bytes into memory
    x = mac.wrap(view)
    base, length, _, deallocator = made[0]
    assert base % mmap.PAGESIZE == 0 and length % mmap.PAGESIZE == 0 and deallocator is None
    assert base + x.offset == view.ctypes.data and base + length >= view.ctypes.data + view.nbytes
    mac.fill(x, 7.0)  # writes through the device's view of the wrapped pages
    assert (view == 7.0).all() and memory[:100].sum() == 0
    assert mac.wrap(view[::2]) is None and len(made) == 1  # not contiguous: not wrapped
