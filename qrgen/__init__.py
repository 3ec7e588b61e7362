"""qrgen: batched QR factorization with GPU kernels generated for each shape."""
from .version import __version__  # noqa: F401
