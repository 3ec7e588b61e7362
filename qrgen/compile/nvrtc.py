"""CUDA sources compiled to cubin by NVRTC (through CuPy), several at once, through the kernel cache."""
from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..version import __version__
from . import cache

OPTIONS = ("-std=c++17", "--ptxas-options=-v")


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


def _library():
    """CuPy's NVRTC binding, or a RuntimeError naming what to install."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:
        raise RuntimeError(f"compiling CUDA kernels needs CuPy and NVRTC ({exc}): pip install 'qrgen[cuda]'") from None
    return nvrtc


def version() -> tuple[int, int]:
    return tuple(_library().getVersion())


def options(arch: str) -> tuple[str, ...]:
    return (f"--gpu-architecture={arch}",) + OPTIONS


def cache_key(source: str, arch: str, opts: tuple[str, ...] | None = None, compiler: tuple[int, int] | None = None,
              version_: str = __version__) -> str:
    return cache.key(source, arch, options(arch) if opts is None else opts,
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


def nvrtc_compile(source: str, name: str, arch: str) -> tuple[bytes, str]:
    nvrtc = _library()
    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options(arch)))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog).splitlines()
            first = [line for line in log if "error" in line][:ERROR_LINES] or log[:ERROR_LINES]
            raise RuntimeError(f"NVRTC failed to compile {name} for {arch} ({sum('error' in x for x in log)} "
                               f"error line(s); the first):\n" + "\n".join(first)) from exc
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def compile_source(name: str, source: str, arch: str, use_cache: bool = True) -> Binary:
    path = cache.entry_path(name, arch, cache_key(source, arch))
    if use_cache:
        entry = cache.read_entry(path)
        if entry is not None:
            cubin, log = entry
            return Binary(name, cubin, *parse_report(log), seconds=0.0, cached=True, log=log)
    start = time.perf_counter()
    cubin, log = nvrtc_compile(source, name, arch)
    seconds = time.perf_counter() - start
    if use_cache:
        cache.write_entry(path, cubin, log)
    return Binary(name, cubin, *parse_report(log), seconds=seconds, cached=False, log=log)


def compile_many(items: list[tuple[str, str]], target, use_cache: bool = True, jobs: int | None = None,
                 progress=None) -> list[Binary]:
    """Compile (name, source) pairs for a CUDA target, several at once (NVRTC releases the GIL while it compiles)."""
    jobs = jobs or max(1, min(len(items), os.cpu_count() or 1))
    results: dict[str, Binary] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(compile_source, name, src, target.arch, use_cache): name for name, src in items}
        for future in futures:
            binary = future.result()
            results[binary.name] = binary
            if progress is not None:
                progress(binary)
    return [results[name] for name, _ in items]
