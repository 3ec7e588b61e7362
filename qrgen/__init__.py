"""qrgen: batched QR factorization with GPU kernels generated for each shape."""
__version__ = "0.1.0"

from .check import check  # noqa: E402
from .linalg import householder_product, lstsq, ormqr, qr  # noqa: E402
from .problem import Problem, Target  # noqa: E402
from .runtime import geqrf  # noqa: E402
from .schedule import Panel, Precision, Schedule  # noqa: E402

__all__ = ["geqrf", "householder_product", "ormqr", "qr", "lstsq", "check", "Problem", "Target", "Schedule",
           "Panel", "Precision", "__version__"]
