"""Compiling rendered sources to cubin with NVRTC (through CuPy), and the on-disk cache of binaries.

The cache key hashes everything that changes the binary: the rendered source, NVRTC's version, the arch, the
options and qrgen's version. Entries are written to a temporary file and renamed into place; an entry that
does not parse is rebuilt. QRGEN_CACHE_DIR overrides the directory (default: the user's cache directory).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import __version__

OPTIONS = ("-std=c++17", "--ptxas-options=-v")
_MAGIC = b"QRGENCUBIN1\n"


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


def cache_dir() -> Path:
    env = os.environ.get("QRGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qrgen"


def nvrtc_version() -> tuple[int, int]:
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getVersion())


def options(arch: str) -> tuple[str, ...]:
    return (f"--gpu-architecture={arch}",) + OPTIONS


def cache_key(source: str, arch: str, opts: tuple[str, ...] | None = None,
              nvrtc: tuple[int, int] | None = None, version: str = __version__) -> str:
    opts = options(arch) if opts is None else opts
    nvrtc = nvrtc_version() if nvrtc is None else nvrtc
    payload = json.dumps({"source": source, "arch": arch, "options": list(opts), "nvrtc": list(nvrtc),
                          "qrgen": version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _parse_report(log: str, name: str) -> tuple[int, int, int]:
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return (int(regs.group(1)) if regs else -1,
            sum(int(a) + int(b) for a, b in spill),
            int(stack.group(1)) if stack else 0)


def _read_entry(path: Path) -> tuple[bytes, str] | None:
    try:
        data = path.read_bytes()
        if not data.startswith(_MAGIC):
            return None
        header_len = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 8], "little")
        start = len(_MAGIC) + 8
        log = data[start:start + header_len].decode()
        cubin = data[start + header_len:]
        if not cubin.startswith(b"\x7fELF"):
            return None
        return cubin, log
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _write_entry(path: Path, cubin: bytes, log: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = log.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_MAGIC + len(blob).to_bytes(8, "little") + blob + cubin)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def nvrtc_compile(source: str, name: str, arch: str) -> tuple[bytes, str]:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options(arch)))
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC failed to compile {name} for {arch}:\n{nvrtc.getProgramLog(prog)}") from exc
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def compile_source(name: str, source: str, arch: str, use_cache: bool = True) -> Binary:
    key = cache_key(source, arch)
    path = cache_dir() / arch / f"{name}-{key[:32]}.cubin"
    if use_cache:
        entry = _read_entry(path)
        if entry is not None:
            cubin, log = entry
            return Binary(name, cubin, *_parse_report(log, name), seconds=0.0, cached=True, log=log)
    start = time.perf_counter()
    cubin, log = nvrtc_compile(source, name, arch)
    seconds = time.perf_counter() - start
    if use_cache:
        _write_entry(path, cubin, log)
    return Binary(name, cubin, *_parse_report(log, name), seconds=seconds, cached=False, log=log)


def compile_many(items: list[tuple[str, str]], arch: str, use_cache: bool = True, jobs: int | None = None,
                 progress=None) -> list[Binary]:
    """Compile (name, source) pairs, several at once (NVRTC releases the GIL while it compiles)."""
    jobs = jobs or max(1, min(len(items), os.cpu_count() or 1))
    results: dict[str, Binary] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(compile_source, name, src, arch, use_cache): name for name, src in items}
        for future in futures:
            binary = future.result()
            results[binary.name] = binary
            if progress is not None:
                progress(binary)
    return [results[name] for name, _ in items]
