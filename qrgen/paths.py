"""Where qrgen's files live: package data (templates, shipped schedules) and the user's data (kernel cache).

Every path qrgen reads or writes is decided here. QRGEN_CACHE_DIR overrides the kernel cache's folder,
QRGEN_SCHEDULE_DIR the folder `qrgen tune` writes schedules to (searched before the shipped ones)."""
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


def user_schedule_dir() -> Path:
    """The user's tuned schedules: QRGEN_SCHEDULE_DIR, else the user's data folder. `qrgen tune` writes here unless
    told otherwise; lookups search it before the shipped schedules."""
    env = os.environ.get("QRGEN_SCHEDULE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "qrgen" / "schedules"


def schedule_roots(root: Path | None = None) -> tuple[Path, ...]:
    """The schedule folders a lookup searches, in order: `root` alone where one is named, else the user's folder
    and then the shipped one."""
    return (Path(root),) if root is not None else (user_schedule_dir(), schedule_dir())


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
