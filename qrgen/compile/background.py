"""First calls in two tiers: a shape's kernels that are not in the cache are compiled quickly first (NVRTC's
--Ofast-compile at the level plan/family.quick_level gives each family: the same sources, a fraction of the
optimizer's time, slower code), and the call runs on
them, while a process of its own compiles the optimized binaries into the disk cache; the Factorizer changes to
those when they are in (run/factorizer.py). The process goes on if the caller exits, so the next process finds the
cache filled.

The quick binaries run several times slower, so only a call of at most QUICK_MAX_FLOPS takes them
(docs/decisions.md#first-call-tiers): above it a quick call would cost about what compiling the optimized binaries
does. QRGEN_FIRST_CALL=wait in the environment (or first_calls("wait")) compiles the optimized binaries before the
first call instead, as qrgen.warmup, `qrgen build` and the benchmarks always do. With no writable disk cache there
is no second tier either."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import paths

QUICK_MAX_FLOPS = 1e12  # a first call's work (Problem.flops) up to which it runs on quick binaries
_ENV = "QRGEN_FIRST_CALL"
MODES = ("quick", "wait")
_mode: str | None = None  # set by first_calls(); None: the environment's (default "quick")


def mode() -> str:
    """'quick' (first calls run quickly compiled kernels until the optimized ones are in) or 'wait'."""
    if _mode is not None:
        return _mode
    value = os.environ.get(_ENV, "quick")
    if value not in MODES:
        raise ValueError(f"{_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


@contextlib.contextmanager
def first_calls(value: str):
    """Within the block, first calls compile as `value` says ('quick' or 'wait'), whatever the environment says."""
    global _mode
    if value not in MODES:
        raise ValueError(f"first_calls({value!r}): expected one of {', '.join(MODES)}")
    before, _mode = _mode, value
    try:
        yield
    finally:
        _mode = before


def cache_writable() -> bool:
    """Whether the kernel cache's folder can be written (the second tier hands its binaries over through it)."""
    folder = paths.cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def tiered(flops: float) -> bool:
    """Whether a first call of `flops` operations that misses the cache compiles in two tiers."""
    return flops <= QUICK_MAX_FLOPS and mode() == "quick" and bool(sys.executable) and cache_writable()


class Job:
    """Optimized binaries of (name, source) pairs being compiled into the cache by a process of their own."""

    def __init__(self, items: list[tuple[str, str]], target):
        fd, self.path = tempfile.mkstemp(prefix="qrgen-job-", suffix=".json")
        with os.fdopen(fd, "w") as fh:  # a file, not a pipe: the caller does not wait for the child to read it
            json.dump({"arch": target.arch, "ptx": target.ptx, "items": items}, fh)
        # The caller's qrgen; NVRTC's own copy of what it compiles in the driver's compute cache left out (qrgen's
        # cache keeps the binaries, and the caller's process holds that cache too)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), CUDA_CACHE_DISABLE="1")
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "qrgen.compile.background", self.path], env=env,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.unlink(self.path)
            raise

    def done(self) -> bool:
        return self.process.poll() is not None

    def wait(self) -> None:
        self.process.wait()


def main(argv: list[str]) -> int:
    """The second tier's process: compile a job file's kernels into the cache, at a lower priority than the
    caller's work."""
    from ..targets import Target
    from .nvrtc import compile_many

    path = Path(argv[0])
    job = json.loads(path.read_text())
    path.unlink()
    with contextlib.suppress(OSError):
        os.nice(10)
    compile_many([tuple(item) for item in job["items"]], Target("cuda", job["arch"], job["ptx"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
