"""The CPU backend: the launch sequence run by NumPy (qrgen.run.numpy_engine), every kernel family emulated.

It has the budgets of the H200 it stands in for, so that a schedule runs here exactly as it would there, and every
feature (it emulates each kernel's result, not its instructions)."""
from __future__ import annotations

from .records import FEATURES, Arch, Backend
from .cuda import ARCHS

BACKEND = Backend(name="cpu", archs={"numpy": Arch("numpy", ARCHS["sm_90"].limits, frozenset(FEATURES))},
                  default_arch="numpy", template_dir="cuda", suffix=".cu", compiler="", engine="qrgen.run.numpy_engine",
                  describe_arch="'numpy'")
