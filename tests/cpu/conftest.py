import pytest


@pytest.fixture(scope="session")
def cpu_device():
    """The Metal kernels' CPU translation layer (run/msl_devices.CpuDevice), standing in for a Mac's GPU."""
    from qrgen.run.msl_devices import CpuDevice

    try:
        return CpuDevice()
    except RuntimeError as exc:
        pytest.skip(str(exc))
