"""CUDA sources compiled to cubin by NVRTC (through CuPy), several at once, through the kernel cache."""
from __future__ import annotations

import functools
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..version import __version__
from . import cache

TOOL = "NVRTC"
OPTIONS = ("-std=c++17", "--ptxas-options=-v")
# A first call's first tier (compile/background.py): the same sources at a quicker optimization level, by level name
# (each kernel family's is plan/family.quick_level; docs/decisions.md#first-call-tiers)
QUICK = {"mid": ("--Ofast-compile=mid",), "max": ("--Ofast-compile=max",)}
QUICK_DEFAULT = "mid"


@dataclass(frozen=True)
class Binary:
    name: str
    cubin: bytes
    registers: int
    spill_bytes: int
    stack_bytes: int
    seconds: float  # compile time (0 when it came from the cache)
    cached: bool
    log: str
    quick: bool = False  # compiled at a QUICK level: a first call's stand-in until the optimized binary is in


def describe(b: Binary) -> str:
    """A compiled kernel's line in qrgen build's report."""
    how = "cached" if b.cached else f"{b.seconds:.1f} s"
    return f"{b.registers} registers, {b.spill_bytes} bytes spilled, {b.stack_bytes} bytes stack ({how})"


def install_hint() -> str:
    """The pip command that brings a working CuPy, NVRTC and cuBLAS for the CUDA major already installed."""
    from importlib import metadata

    for major in (13, 12):
        try:
            metadata.version(f"cupy-cuda{major}x")
            return f"pip install 'qrgen[cuda{major}]'"
        except metadata.PackageNotFoundError:
            continue
    return "pip install 'qrgen[cuda]' (CUDA 13, driver 580 or newer) or 'qrgen[cuda12]' (driver 525 or newer)"


def _library():
    """CuPy's NVRTC binding with NVRTC loaded, or a RuntimeError naming what to install."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()  # loads libnvrtc: CuPy imports without it
    except Exception as exc:
        raise RuntimeError(f"compiling CUDA kernels needs CuPy and NVRTC, which did not load ({exc}): "
                           f"{install_hint()}") from None
    return nvrtc


def version() -> tuple[int, int]:
    return tuple(_library().getVersion())


@functools.cache
def supported_archs() -> tuple[str, ...]:
    """The architectures the installed NVRTC compiles for ('sm_80', ...), asked once per process."""
    return tuple(f"sm_{a}" for a in _library().getSupportedArchs())


def check_arch(target) -> None:
    """A ValueError, before anything is compiled or written, where the installed NVRTC cannot compile for the
    target's architecture."""
    number = target.arch.removeprefix("sm_").rstrip("a")
    if f"sm_{number}" not in supported_archs():
        raise ValueError(f"the installed NVRTC {'.'.join(map(str, version()))} does not compile for {target.arch} "
                         f"(it knows {', '.join(supported_archs())}); a newer CUDA's NVRTC does: {install_hint()}")


def options(arch: str, ptx: bool = False, quick: bool | str = False) -> tuple[str, ...]:
    """NVRTC's options: a cubin for the architecture, or with ptx=True PTX for its virtual architecture; quick:
    compiled for a first call, at QUICK's level of that name (True: QUICK_DEFAULT)."""
    level = QUICK_DEFAULT if quick is True else quick
    if level and level not in QUICK:
        raise ValueError(f"quick level {level!r}: one of {tuple(QUICK)}")
    return ((f"--gpu-architecture={arch.replace('sm_', 'compute_') if ptx else arch}",) + OPTIONS
            + (QUICK[level] if level else ()))


def cache_key(source: str, arch: str, opts: tuple[str, ...] | None = None, compiler: tuple[int, int] | None = None,
              version_: str = __version__, ptx: bool = False, quick: bool | str = False) -> str:
    return cache.key(source, arch, options(arch, ptx, quick) if opts is None else opts,
                     version() if compiler is None else compiler, version_)


def parse_report(log: str) -> tuple[int, int, int]:
    """(registers, spill bytes stored and loaded, stack frame bytes) from ptxas's report in the log."""
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return (int(regs.group(1)) if regs else -1,
            sum(int(a) + int(b) for a, b in spill),
            int(stack.group(1)) if stack else 0)


ERROR_LINES = 12  # of the compiler's log in the error of a kernel that does not compile


def nvrtc_compile(source: str, name: str, arch: str, ptx: bool = False, quick: bool | str = False) -> tuple[bytes, str]:
    """(cubin, or PTX with ptx=True, and the compiler's log)."""
    nvrtc = _library()
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options(arch, ptx, quick)))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog).splitlines()
            first = [line for line in log if "error" in line][:ERROR_LINES] or log[:ERROR_LINES]
            raise RuntimeError(f"NVRTC failed to compile {name} for {arch} ({sum('error' in x for x in log)} "
                               f"error line(s); the first):\n" + "\n".join(first)) from exc
        if ptx:  # the driver's loader reads PTX as a NUL-terminated string
            return nvrtc.getPTX(prog).rstrip(b"\0") + b"\0", nvrtc.getProgramLog(prog)
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _read(path, name: str, quick: bool | str) -> Binary | None:
    entry = cache.read_entry(path)
    if entry is None:
        return None
    cubin, log = entry
    return Binary(name, cubin, *parse_report(log), seconds=0.0, cached=True, log=log, quick=bool(quick))


def cached(name: str, source: str, arch: str, ptx: bool = False, quick: bool | str = False) -> Binary | None:
    """The kernel's binary from the cache, or None where it has no entry that verifies."""
    return _read(cache.entry_path(name, arch, cache_key(source, arch, ptx=ptx, quick=quick)), name, quick)


def compile_source(name: str, source: str, arch: str, use_cache: bool = True, ptx: bool = False,
                   refresh: bool = False, quick: bool | str = False) -> Binary:
    """One kernel through the cache; refresh: compile and replace the entry even where one verifies (the driver
    refused its binary); quick: with QUICK's options (an entry of its own)."""
    path = cache.entry_path(name, arch, cache_key(source, arch, ptx=ptx, quick=quick))
    if use_cache and not refresh:
        binary = _read(path, name, quick)
        if binary is not None:
            return binary
    start = time.perf_counter()
    cubin, log = nvrtc_compile(source, name, arch, ptx, quick)
    seconds = time.perf_counter() - start
    if use_cache:
        cache.write_entry(path, cubin, log)
    return Binary(name, cubin, *parse_report(log), seconds=seconds, cached=False, log=log, quick=bool(quick))


def compile_many(items: list[tuple[str, str]], target, use_cache: bool = True, jobs: int | None = None,
                 progress=None, quick: bool | str | dict = False) -> list[Binary]:
    """Compile (name, source) pairs for a CUDA target, several at once (NVRTC releases the GIL while it compiles);
    the binaries in the order of `items`. quick: a first call's level for all (options), or by kernel name."""
    check_arch(target)
    jobs = jobs or max(1, min(len(items), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compile_source, name, src, target.arch, use_cache, target.ptx, False,
                               quick.get(name, True) if isinstance(quick, dict) else quick)
                   for name, src in items]
        binaries = []
        for future in futures:
            binaries.append(future.result())
            if progress is not None:
                progress(binaries[-1])
    return binaries
