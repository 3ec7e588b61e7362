"""Metal kernels compiled. On macOS the Metal compiler builds each rendered source at run time (run/metal_mac.py),
kept in memory per process and its pipelines in a binary archive on disk, under a key of everything that changes
the binary: the source, the OS and Metal compiler's version, the GPU family, the options and qrgen's version.
Elsewhere (qrgen build --arch apple9 on Linux) there is no Metal compiler: compile/msl.check stands in for it (the
launch contract, the lint, and clang parsing the source as MSL where libclang is installed) and says so."""
from __future__ import annotations

import time
from dataclasses import dataclass

from . import msl

TOOL = "the Metal compiler (on macOS; elsewhere the checks of compile/msl.py)"


@dataclass(frozen=True)
class Compiled:
    name: str
    seconds: float
    cached: bool
    how: str  # what was done: compiled by Metal, or which checks stood in


def check_arch(target) -> None:
    if target.backend != "metal":
        raise ValueError(f"compile/metal.py compiles for Metal targets, not {target.backend} {target.arch}")


def check_one(name: str, source: str) -> Compiled:
    """The checks that stand in for the Metal compiler here; clang's only where libclang is installed."""
    start = time.perf_counter()
    msl.signature(source, name)
    msl.lint(source, name)
    try:
        msl.clang_check(source, name)
        how = "checked (launch contract, lint, clang as MSL; no Metal compiler here)"
    except RuntimeError as exc:
        if "needs libclang" not in str(exc):
            raise
        how = "checked (launch contract, lint; clang skipped: pip install libclang; no Metal compiler here)"
    return Compiled(name, time.perf_counter() - start, False, how)


def compile_many(items: list[tuple[str, str]], target, use_cache: bool = True, jobs: int | None = None,
                 progress=None, quick: bool = False) -> list[Compiled]:
    """Compile (name, source) pairs for a Metal target: with the Metal compiler on a Mac, else the checks."""
    from ..run import metal_mac

    check_arch(target)
    out = []
    device = metal_mac.shared_device() if metal_mac.available() else None
    for name, source in items:
        if device is not None:
            start = time.perf_counter()
            device.load(name, source)
            out.append(Compiled(name, time.perf_counter() - start, False, "compiled by Metal"))
        else:
            out.append(check_one(name, source))
        if progress is not None:
            progress(out[-1])
    return out


def describe(result: Compiled) -> str:
    return f"{result.how} ({result.seconds:.2f} s)"
