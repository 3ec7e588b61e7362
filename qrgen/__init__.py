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

    load_torch_face()

__all__ = ["geqrf", "householder_product", "ormqr", "qr", "lstsq", "check", "Problem", "Target", "Schedule",
           "Panel", "Precision", "warmup", "__version__"]
