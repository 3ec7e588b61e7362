"""qrgen: batched QR factorization with GPU kernels generated for each shape."""
from .functions import geqrf, householder_product, lstsq, ormqr, qr
from .numerics.check import check
from .problem import Problem
from .schedule.model import Panel, Precision, Schedule
from .targets import Target
from .version import __version__
from .warmup import warmup

if "torch" in __import__("sys").modules:  # torch is in use: register qrgen's custom ops now (qrgen.torch)
    from .functions import load_torch_face

    try:
        load_torch_face()
    except ImportError:  # a torch before 2.4 has no custom ops: the functions run without them
        pass

__all__ = ["geqrf", "householder_product", "ormqr", "qr", "lstsq", "check", "Problem", "Target", "Schedule",
           "Panel", "Precision", "warmup", "__version__"]
