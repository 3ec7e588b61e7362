"""The on-disk cache of compiled kernels, content-addressed: the key hashes everything that changes the binary
(the rendered source, the compiler's version, the arch, the options and qrgen's version). Entries are written to a
temporary file and renamed into place; an entry that does not parse is rebuilt."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..paths import cache_dir
from ..version import __version__

MAGIC = b"QRGENCUBIN1\n"


def key(source: str, arch: str, options: tuple[str, ...], compiler: tuple[int, ...], version: str = __version__) -> str:
    payload = json.dumps({"source": source, "arch": arch, "options": list(options), "nvrtc": list(compiler),
                          "qrgen": version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def entry_path(name: str, arch: str, digest: str) -> Path:
    return cache_dir() / arch / f"{name}-{digest[:32]}.cubin"


def read_entry(path: Path) -> tuple[bytes, str] | None:
    """(binary, compile log) of an entry, or None where it is missing or does not parse."""
    try:
        data = path.read_bytes()
        if not data.startswith(MAGIC):
            return None
        header_len = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
        start = len(MAGIC) + 8
        log = data[start:start + header_len].decode()
        binary = data[start + header_len:]
        if not binary.startswith(b"\x7fELF"):
            return None
        return binary, log
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def write_entry(path: Path, binary: bytes, log: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = log.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + len(blob).to_bytes(8, "little") + blob + binary)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
