import os

import pytest


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU = _gpu_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped where there is none)")
    config.addinivalue_line("markers", "slow: large shapes (GPU)")


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _own_user_schedule_folder(tmp_path_factory):
    """The user's schedule folder (searched before the shipped schedules, written by qrgen tune) is an empty one
    of the test run's, so no test reads or writes the real one."""
    os.environ["QRGEN_SCHEDULE_DIR"] = str(tmp_path_factory.mktemp("user-schedules"))
    # One kernel cache for the compile tests of a run (set QRGEN_TEST_CACHE_DIR to keep it between runs): a kernel
    # that several tests compile, such as sm_90's in the per-arch and per-family tests, is compiled once.
    os.environ.setdefault("QRGEN_TEST_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
    # First calls compile the optimized kernels before they run, so that tests comparing calls see one binary;
    # the quick tier has tests of its own (tests/cpu/test_first_calls.py, tests/gpu/test_first_calls_gpu.py).
    os.environ.setdefault("QRGEN_FIRST_CALL", "wait")
    yield


@pytest.fixture(scope="session")
def cpu_device():
    """The Metal kernels' CPU translation layer (run/msl_devices.CpuDevice), standing in for a Mac's GPU."""
    from qrgen.run.msl_devices import CpuDevice

    try:
        return CpuDevice()
    except RuntimeError as exc:
        pytest.skip(str(exc))
