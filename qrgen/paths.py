"""Where qrgen's files live: package data (templates, shipped schedules) and the user's data (kernel cache).

Every path qrgen reads or writes is decided here. QRGEN_CACHE_DIR overrides the kernel cache's folder."""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data(name: str) -> Path:
    """A top-level folder of the checkout qrgen runs from, else the copy an installed wheel carries."""
    checkout = _PACKAGE.parent / name
    if checkout.is_dir() and (_PACKAGE.parent / "pyproject.toml").is_file():
        return checkout
    return _PACKAGE / "data" / name


def template_dir() -> Path:
    """The kernel and module templates (templates/<backend>/...)."""
    return _data("templates")


def schedule_dir() -> Path:
    """The shipped schedules (schedules/<arch>/<m>x<n>_b<batch>.json)."""
    return _data("schedules")


def generated_dir() -> Path:
    """Where `qrgen build` writes modules by default: ./generated."""
    return Path.cwd() / "generated"


def cache_dir() -> Path:
    """The compiled-kernel cache: QRGEN_CACHE_DIR, else the user's cache folder."""
    env = os.environ.get("QRGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qrgen"
