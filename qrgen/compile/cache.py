"""The on-disk cache of compiled kernels, content-addressed: the key hashes everything that changes the binary
(the rendered source, the compiler's version, the arch, the options and qrgen's version). Each entry holds the
binary (cubin, or PTX), the compiler's log and a SHA-256 digest of the binary, and is written to a temporary file
renamed into place. An entry that is cut short, altered or of an older format fails verification: read_entry warns
and returns None, and the caller compiles again and replaces it."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

from ..paths import cache_dir
from ..version import __version__

MAGIC = b"QRGENBIN2\n"


class CacheWarning(UserWarning):
    """A kernel cache entry was damaged or refused, and is rebuilt."""


def key(source: str, arch: str, options: tuple[str, ...], compiler: tuple[int, ...], version: str = __version__) -> str:
    payload = json.dumps({"source": source, "arch": arch, "options": list(options), "nvrtc": list(compiler),
                          "qrgen": version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def entry_path(name: str, arch: str, digest: str) -> Path:
    return cache_dir() / arch / f"{name}-{digest[:32]}.bin"


def _verified(data: bytes) -> tuple[bytes, str]:
    """(binary, log) of an entry's bytes; ValueError naming what does not verify."""
    if not data.startswith(MAGIC):
        raise ValueError("not a qrgen kernel cache entry of this format")
    start = len(MAGIC) + 8
    header_len = int.from_bytes(data[len(MAGIC):start], "little")
    header = json.loads(data[start:start + header_len].decode())
    binary = data[start + header_len:]
    if len(binary) != header["size"]:
        raise ValueError(f"{len(binary)} bytes of binary where {header['size']} were written")
    if hashlib.sha256(binary).hexdigest() != header["sha256"]:
        raise ValueError("the binary's digest does not match the one written with it")
    return binary, header["log"]


def read_entry(path: Path, warn: bool = True) -> tuple[bytes, str] | None:
    """(binary, compile log) of an entry that verifies; None where it is missing, or (with a CacheWarning unless
    warn=False) where it does not verify."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return _verified(data)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        if not warn:
            return None
        warnings.warn(f"kernel cache entry {path} is damaged ({exc}): compiling it again", CacheWarning, stacklevel=3)
        return None


def write_entry(path: Path, binary: bytes, log: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"log": log, "size": len(binary), "sha256": hashlib.sha256(binary).hexdigest()}).encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + len(header).to_bytes(8, "little") + header + binary)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
