"""CPU layer (CuPy installed, no GPU needed): what the array contract refuses before any device work, and the fast
lane's refusals (it hands everything it does not take to the general path, which checks it)."""
import numpy as np
import pytest

import qrgen
from qrgen.run import fastpath

pytest.importorskip("cupy")


@pytest.mark.parametrize("call", [qrgen.geqrf, qrgen.qr, lambda a: qrgen.lstsq(a, a[..., 0])])
def test_host_arrays_are_refused_with_the_fix(call):
    with pytest.raises(TypeError, match=r"host .*cupy\.asarray"):
        call(np.ones((2, 4, 4), dtype=np.float32))


def test_unknown_objects_are_refused():
    with pytest.raises(TypeError, match="CUDA device"):
        qrgen.geqrf([[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("a", [np.ones((2, 4, 4), dtype=np.float32), [[1.0]], None, 3.0])
def test_fast_lane_declines_what_is_not_a_device_array(a):
    assert fastpath.fast_geqrf(None, a) is None
    assert fastpath.fast_qr(None, a) is None
