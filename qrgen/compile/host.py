"""CUDA kernels on the CPU (every kernel a plan launches; mma.sync emulated): the same templates rendered over the
host layer (templates/cuda/host/: the dialect and the feature headers as C++ over threads as fibers,
templates/host/fibers.h), built with the host's C++ compiler into a shared library with a launcher, and run block
after block. So the kernel bodies qrgen ships for NVIDIA GPUs are run and checked where there is no GPU
(tests/cpu/test_host_layer.py); nothing of their speed is.

A launch takes the kernel's arguments as the CUDA driver does (an array of pointers to the values, run/launch.
PackedArgs) and runs the grid's groups in turn: a group is one block, or a matrix's blocks where they wait for
each other (a cluster's, a cooperative panel's), their threads fibers of one host thread."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..paths import cache_dir, template_dir

CXX_FLAGS = ("-O1", "-std=c++17", "-shared", "-fPIC", "-w")


@lru_cache(maxsize=None)
def compiler() -> tuple[str, str]:
    """(path, version text) of the host's C++ compiler ($CXX, else c++ or g++); RuntimeError where there is none."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise RuntimeError("running GPU kernels on the CPU needs a C++ compiler (c++, g++ or $CXX)")
    return cxx, subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout


def shared_library(name: str, code: str, folder: str, flags: tuple[str, ...]) -> ctypes.CDLL:
    """`code` built by the host's C++ compiler with `flags` into the kernel cache's `folder`, keyed by the code, the
    compiler's version and the flags; loaded. A RuntimeError shows the compiler's first errors."""
    cxx, version = compiler()
    key = hashlib.sha256((code + version + " ".join(flags)).encode()).hexdigest()[:24]
    path = cache_dir() / folder / f"{name}-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / f"{name}.cpp", Path(tmp) / f"{name}.so"
            src.write_text(code)
            run = subprocess.run([cxx, *flags, "-o", str(out), str(src)], capture_output=True, text=True)
            if run.returncode:
                raise RuntimeError(f"{name}: the CPU layer's C++ does not compile:\n{run.stderr[:3000]}")
            os.replace(out, path)
    return ctypes.CDLL(str(path))


MAX_THREADS = 16384  # a group's fibers (templates/host/fibers.h): 16 blocks of 1024 threads
MAX_BLOCKS = 16  # a group's blocks (templates/cuda/host/dialect.cuh)


def refusal(spec) -> str | None:
    """Why the CPU layer cannot run a panel kernel, or None where it can."""
    if spec.blocks > MAX_BLOCKS or spec.blocks * spec.threads > MAX_THREADS:
        return (f"its {spec.blocks} blocks of {spec.threads} threads a matrix run together, and the CPU layer runs "
                f"at most {MAX_BLOCKS} blocks and {MAX_THREADS} threads together")
    return None


def cluster(spec) -> tuple[int, int, int]:
    """The blocks of a group (the kernel's cluster, or a cooperative panel's blocks of a matrix) along x, y, z: the
    fused products' clusters split the rows along z, the panels' blocks lie along x."""
    return (1, 1, spec.blocks) if spec.variant == "fused" else (spec.blocks, 1, 1)


def source(spec, schedule, target) -> str:
    """The kernel's source over the host layer, with its launcher `<name>__host`."""
    from ..render.environment import layer
    from ..render.sources import render

    with layer("host"):
        text = render(spec, schedule, target).source
    group = ", ".join(map(str, cluster(spec)))
    return (template_dir() / "host" / "fibers.h").read_text() + text + f"""
extern "C" int {spec.name}__host(void** args, unsigned gx, unsigned gy, unsigned gz, unsigned threads,
                                 float* shared, long floats) {{
  return qrh::launch({spec.name}, args, dim3{{gx, gy, gz}}, dim3{{threads, 1, 1}}, dim3{{{group}}}, shared, floats);
}}
"""


class HostKernel:
    """A kernel built for the CPU layer; call(args, grid, threads, shared_bytes) runs a launch of a grid of blocks
    (x, or a tuple of up to three dimensions)."""

    def __init__(self, spec, schedule, target, code: str | None = None):
        """`code`: the source to build in place of source(spec, schedule, target) (a variant of it)."""
        why = refusal(spec)
        if why:
            raise ValueError(f"{spec.name}: {why}")
        self.name, self.blocks = spec.name, spec.blocks
        code = source(spec, schedule, target) if code is None else code
        library = shared_library(spec.name, code, "cuda-host", CXX_FLAGS)
        self.fn = getattr(library, f"{spec.name}__host")
        self.set_order = library.qrl_set_order
        self.set_order.argtypes = [ctypes.c_uint]
        self.set_straggler = library.qrl_set_straggler
        self.set_straggler.argtypes = [ctypes.c_int]
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 4 + [ctypes.c_void_p, ctypes.c_long]

    def __call__(self, args, grid: int | tuple[int, ...], threads: int, shared_bytes: int, order: int = 0,
                 straggler: int = -1) -> None:
        """order: 0, the threads of a group take turns in index order; else in an order drawn afresh each round
        from this seed. straggler: a warp of each group (its index among the group's warps, the blocks of a cluster
        in turn) that takes its turns only when no other thread can progress; -1, none (templates/host/fibers.h)."""
        dims = (grid,) if isinstance(grid, int) else tuple(grid)
        gx, gy, gz = dims + (1,) * (3 - len(dims))
        self.set_order(order)
        self.set_straggler(straggler)
        # a group's blocks' own, NaN until written (a kernel reading shared memory it never wrote fails the gates)
        shared = np.full(max(1, self.blocks * shared_bytes // 4), np.nan, dtype=np.float32)
        if self.fn(args.address, gx, gy, gz, threads, shared.ctypes.data, shared_bytes // 4):
            raise RuntimeError(f"{self.name}: a block deadlocked (a barrier, warp exchange, mbarrier wait or polled "
                               f"flag that the threads it waits for never reached or set)")
