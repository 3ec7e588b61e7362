"""`qrgen build`: schedule -> rendered kernels -> compiled binaries -> an importable module under generated/."""
from __future__ import annotations

import importlib
import os
import pprint
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .paths import generated_dir, schedule_dir
from .problem import Problem
from .render.environment import environment
from .render.sources import render_all
from .schedule.files import find
from .schedule.model import Schedule
from .targets import Target
from .version import __version__


@dataclass(frozen=True)
class Generated:
    name: str
    module_path: Path
    kernel_paths: tuple[Path, ...]
    schedule: Schedule
    origin: str


def compiler(target: Target):
    """The target's compile module (compile/nvrtc.py, compile/metal.py): check_arch, compile_many, describe."""
    if not target.record.compiler:
        raise ValueError(f"qrgen build writes modules for GPU targets; {target.backend} has no kernels to compile")
    return importlib.import_module(target.record.compiler)


def module_name(problem: Problem, target: Target) -> str:
    suffix = "" if target.arch == "sm_90" else f"_{target.arch}"
    return f"qr_{problem.m}x{problem.n}_b{problem.batch}{suffix}"


def write_if_changed(path: Path, text: str) -> None:
    """Atomic write, skipped when the file already holds exactly this text."""
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def render_module(problem: Problem, target: Target, schedule_root: Path | None = None):
    """(module name, module text, {kernel name: source}, schedule, origin) without touching the disk."""
    schedule, origin = find(problem, target, schedule_root)
    if origin != "default (heuristic)":  # a shipped file by its place in the repository, any other by its path
        path, shipped = Path(origin).resolve(), schedule_dir().resolve()
        origin = f"schedules/{path.relative_to(shipped).as_posix()}" if path.is_relative_to(shipped) else str(path)
    name = module_name(problem, target)
    sources = {r.name: r.source for r in render_all(schedule, target)}
    text = environment().get_template("python/module.py.j2").render(
        version=__version__, m=problem.m, n=problem.n, batch=problem.batch, arch=target.arch, backend=target.backend,
        name=name,
        origin=origin, describe=schedule.describe(),
        schedule_literal=pprint.pformat(schedule.to_json(), sort_dicts=False))
    return name, text, sources, schedule, origin


def write_module(name: str, text: str, sources: dict, target: Target, out_dir: Path) -> tuple[Path, tuple]:
    """The module and its kernel sources under out_dir (kernels a previous schedule needed and this one does not
    removed); returns (module path, kernel paths)."""
    kernel_dir = out_dir / name
    kernel_paths = []
    for kernel, source in sources.items():
        path = kernel_dir / f"{kernel}{target.record.suffix}"
        write_if_changed(path, source)
        kernel_paths.append(path)
    if kernel_dir.exists():
        for stale in kernel_dir.glob(f"*{target.record.suffix}"):
            if stale not in kernel_paths:
                stale.unlink()
    module_path = out_dir / f"{name}.py"
    write_if_changed(module_path, text)
    init = out_dir / "__init__.py"
    if not init.exists():
        write_if_changed(init, '"""Modules written by `qrgen build`."""\n')
    return module_path, tuple(kernel_paths)


def generate(problem: Problem, target: Target, out_dir: Path | None = None,
             schedule_root: Path | None = None) -> Generated:
    """Render and write a module and its kernel sources (nothing compiled)."""
    name, text, sources, schedule, origin = render_module(problem, target, schedule_root)
    module_path, kernel_paths = write_module(name, text, sources, target, Path(out_dir or generated_dir()))
    return Generated(name, module_path, kernel_paths, schedule, origin)


def build(problem: Problem, target: Target, out_dir: Path | None = None, schedule_root: Path | None = None,
          compile_kernels: bool = True, jobs: int | None = None, log=print) -> tuple[Generated, list]:
    """Render, compile every kernel, and only then write the module and its sources: a kernel that does not compile
    leaves nothing written (the error names it, with the compiler's first errors)."""
    start = time.perf_counter()
    name, text, sources, schedule, origin = render_module(problem, target, schedule_root)
    log(f"schedule for {problem.m}x{problem.n}, batch {problem.batch}, {target.arch}: {origin}")
    log(f"  {schedule.describe()}")
    binaries: list = []
    if compile_kernels:
        comp = compiler(target)
        log(f"compiling {len(sources)} kernel(s) with {comp.TOOL} for {target.arch}")
        binaries = comp.compile_many(list(sources.items()), target, jobs=jobs,
                                     progress=lambda b: log(f"  {b.name}: {comp.describe(b)}"))
    module_path, kernel_paths = write_module(name, text, sources, target, Path(out_dir or generated_dir()))
    log(f"wrote {module_path} and {len(kernel_paths)} kernel source(s) in "
        f"{module_path.with_suffix('')}/ ({time.perf_counter() - start:.1f} s)")
    return Generated(name, module_path, kernel_paths, schedule, origin), binaries
