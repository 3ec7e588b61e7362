"""CPU layer: a call's operations recorded against symbolic addresses and replayed with a call's own
(qrgen.run.recorded), through a stand-in driver that reads the packed arguments as the CUDA driver would; no GPU
needed (recorded calls against queued ones, bit for bit: tests/gpu/test_factorizer.py)."""
import ctypes

import pytest

from qrgen.run import recorded
from qrgen.run.launch import PackedArgs
from qrgen.run.recorded import Recorder, symbolic

CODES = {"P": ctypes.c_uint64, "I": ctypes.c_int32, "L": ctypes.c_int64, "F": ctypes.c_float}


class _Driver:
    """Reads each launch's arguments through its packed address (kernelParams) at the moment it is queued."""

    def __init__(self, signature):
        self.signature, self.launches = signature, []

    def _read(self, address):
        pointers = (ctypes.c_void_p * len(self.signature)).from_address(address)
        return [CODES[c].from_address(p).value for c, p in zip(self.signature, pointers)]

    def launchKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, address, extra):
        assert extra == 0
        self.launches.append(("kernel", func, (gx, gy, gz), bx, shared, stream, self._read(address)))

    def launchCooperativeKernel(self, func, gx, gy, gz, bx, by, bz, shared, stream, address):
        self.launches.append(("cooperative", func, (gx, gy, gz), bx, shared, stream, self._read(address)))


class _Runtime:
    def __init__(self):
        self.calls = []

    def memsetAsync(self, ptr, value, nbytes, stream):
        self.calls.append(("memset", ptr, value, nbytes, stream))

    def eventRecord(self, event, stream):
        self.calls.append(("record", event, stream))

    def streamWaitEvent(self, stream, event, flags):
        self.calls.append(("wait", stream, event, flags))


def _recorder(signature):
    rec = Recorder()
    rec.driver, rec.runtime = _Driver(signature), _Runtime()
    return rec


def test_replay_patches_each_calls_addresses_and_nothing_else(monkeypatch):
    """Symbolic addresses (h, tau, src, Q plus offsets) become the call's; workspace addresses, integers and floats
    stay as recorded; the engine's own packed values may change after recording without changing the list; a second
    call with other addresses leaves none of the first's."""
    signature = "PPPIFLP"
    workspace = 0x7F00_1234_5600
    args = PackedArgs(signature, (symbolic("h") + 4 * 300, symbolic("tau") + 8, workspace, -7, 1.5, 1 << 40,
                                  symbolic("q")))
    rec = _recorder(signature)
    rec.kernel(11, (3, 5, 1), 128, 1024, 99, args)
    args.set(0, 0)  # the engine's next launch rewrites its packed values: the record has its own
    rec.kernel(12, (8, 1, 1), 256, 0, 99, args, cooperative=True)
    rec.memset(symbolic("src") + 64, 400, 99)
    rec.memset(workspace, 16, 99)
    rec.record(501, 99)
    rec.wait(98, 501)
    gemms = []
    monkeypatch.setattr(recorded.cublas, "gemm", lambda *a, **k: gemms.append((a, k)))
    rec.gemm(0, 98, True, False, 4, 5, 6, -1.0, symbolic("h") + 40, 6, 24, workspace, 5, 30, 1.0,
             symbolic("tau"), 5, 20, 3, "fp32", slot=1, sm_target=33)
    ops = rec.finish()
    assert len(ops) == 7 and ops.waits

    for bases in [(0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000), (0x5000_0000, 0x6000_0000, 0, 0x7000_0000)]:
        h, tau, src, q = bases
        rec.driver.launches.clear()
        rec.runtime.calls.clear()
        gemms.clear()
        ops.run(bases)
        first, second = rec.driver.launches
        assert first == ("kernel", 11, (3, 5, 1), 128, 1024, 99, [h + 1200, tau + 8, workspace, -7, 1.5, 1 << 40, q])
        assert second == ("cooperative", 12, (8, 1, 1), 256, 0, 99, [0, tau + 8, workspace, -7, 1.5, 1 << 40, q])
        assert rec.runtime.calls == [("memset", src + 64, 0, 400, 99), ("memset", workspace, 0, 16, 99),
                                     ("record", 501, 99), ("wait", 98, 501, 0)]
        (a, k), = gemms
        assert a[8] == h + 40 and a[11] == workspace and a[15] == tau and a[:8] == (0, 98, True, False, 4, 5, 6, -1.0)
        assert k == {"slot": 1, "sm_target": 33}


def test_symbols_stay_clear_of_device_addresses():
    """A symbolic address is never a device address (those fit 49 bits) and splits back into its symbol and offset;
    other values do not split."""
    for j, name in enumerate(recorded.SYMBOLS):
        assert symbolic(name) >= 1 << 49
        assert recorded.symbol_of(symbolic(name) + 12345) == (j, 12345)
    assert recorded.symbol_of((1 << 49) - 1) is None
    assert recorded.symbol_of(0) is None
    with pytest.raises(ValueError):
        symbolic("workspace")
