"""The render index: where a process finds a kernel's cache entry without rendering its source.

The binary cache is keyed by the rendered source (compile/cache.py), so finding an entry needs the source, and a
warm process would render every kernel with Jinja only to learn its key. The index maps a key of everything that
determines a kernel's source and binary (index_key: qrgen's version, the digest of every template file and every
Python file of qrgen and of Jinja, Python's version, the target, the schedule and the kernel spec, and what else the
cache key holds: the compiler's version and options) to the cache key that rendering gave; an index entry is a small
file beside the binaries, written after rendering. A look-up that finds no index entry, or whose cache entry is
missing or does not verify, is a miss: the caller renders and compiles as before (which warns about, and replaces, a
damaged entry) and writes the index entry again."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

from ..paths import cache_dir, template_dir
from ..version import __version__
from . import cache, nvrtc

FORMAT = 1  # of the index entries and their keys
_PACKAGE = Path(__file__).resolve().parent.parent


def _tree_digest(h, root: Path, suffix: str) -> None:
    """Every file under root whose name ends with suffix, by relative path, in a fixed order (__pycache__ left out)."""
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(suffix)):
            path = os.path.join(folder, name)
            with open(path, "rb") as fh:
                data = fh.read()
            h.update(f"{Path(os.path.relpath(path, root)).as_posix()}\0{len(data)}\0".encode())
            h.update(data)


@functools.cache
def code_digest() -> str:
    """A digest of what renders a source: every template file, every Python file of qrgen (the families' template
    arguments, the dialect tables, the schedule and spec types) and of Jinja, and Python's version; once per
    process."""
    h = hashlib.sha256(f"{sys.version}\0".encode())
    for root, suffix in ((template_dir(), ""), (_PACKAGE, ".py")):
        h.update(f"{root.name}\0".encode())
        _tree_digest(h, root, suffix)
    jinja = importlib.util.find_spec("jinja2")
    for location in (jinja.submodule_search_locations or []) if jinja else []:
        h.update(b"jinja2\0")
        _tree_digest(h, Path(location), ".py")
    return h.hexdigest()


def context_key(schedule, target, opts: tuple[str, ...], compiler: tuple[int, ...], version: str = __version__,
                code: str | None = None) -> str:
    """What the index keys of one schedule's kernels share: the code, the schedule, the target (schedules and
    targets are frozen dataclasses whose repr spells every field) and what else a binary's cache key holds
    (options, compiler version, qrgen's version)."""
    payload = json.dumps({"format": FORMAT, "code": code_digest() if code is None else code,
                          "schedule": repr(schedule), "target": repr(target), "options": list(opts),
                          "nvrtc": list(compiler), "qrgen": version}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def index_key(spec, context: str) -> str:
    """The key of a kernel's index entry: its spec (a frozen dataclass) under a context_key."""
    return hashlib.sha256(f"{context}\0{spec!r}".encode()).hexdigest()


def _context(schedule, target) -> str:
    return context_key(schedule, target, nvrtc.options(target.arch, target.ptx), nvrtc.version())


def index_path(key: str, arch: str) -> Path:
    return cache_dir() / arch / "index" / key[:40]


def _lookup(spec, context: str, arch: str) -> nvrtc.Binary | None:
    try:
        record = json.loads(index_path(index_key(spec, context), arch).read_text())
        name, digest = record["name"], record["cache_key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if name != spec.name:
        return None
    entry = cache.read_entry(cache.entry_path(name, arch, digest), warn=False)
    if entry is None:
        return None
    binary, log = entry
    return nvrtc.Binary(name, binary, *nvrtc.parse_report(log), seconds=0.0, cached=True, log=log)


def lookup(specs, schedule, target) -> list[nvrtc.Binary | None]:
    """The optimized binary of each kernel (specs of one schedule, for a target) from the cache entry its index
    entry names, without rendering; None for one that has no index entry or no cache entry that verifies (the
    caller renders it)."""
    context = _context(schedule, target)
    return [_lookup(spec, context, target.arch) for spec in specs]


def record(rendered, schedule, target) -> None:
    """Write the index entries of kernels just rendered ((spec, source) pairs of one schedule), each to a temporary
    file renamed into place; a cache folder that cannot be written costs the next process a render, never an
    error."""
    context = _context(schedule, target)
    for spec, source in rendered:
        text = json.dumps({"name": spec.name, "cache_key": nvrtc.cache_key(source, target.arch, ptx=target.ptx)})
        if not _write(index_path(index_key(spec, context), target.arch), text):
            return


def _write(path: Path, text: str) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not isinstance(exc, OSError):
            raise
        return False
    return True
