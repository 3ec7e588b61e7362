"""What a generated module (generated/qr_<m>x<n>_b<batch>.py) runs on: its schedule, its target and its kernel
sources beside it. On a GPU of another architecture than the module's, the same schedule is rendered and compiled
for that GPU where it fits there (a module for sm_80 runs on an H100), else the call says to rebuild."""
from __future__ import annotations

from pathlib import Path

from . import api
from .run import fastpath
from .plan.planner import check
from .plan.planner import plan as check_plan
from .run.factorizer import Factorizer
from .run.launch import current_target
from .schedule.model import Schedule
from .targets import Target


class GeneratedModule:
    def __init__(self, m: int, n: int, batch: int, arch: str, schedule_json: dict, kernel_dir: Path):
        self.m, self.n, self.batch, self.arch = m, n, batch, arch
        self.schedule = Schedule.from_json(schedule_json)
        self.kernel_dir = Path(kernel_dir)
        self._factorizer = None

    def _sources(self, names) -> dict:
        sources = {}
        suffix = Target.parse(self.arch).record.suffix
        for name in names:
            path = self.kernel_dir / f"{name}{suffix}"
            if not path.exists():
                raise FileNotFoundError(f"{path} is missing: rebuild with qrgen build --shape {self.m}x{self.n} "
                                        f"--batch {self.batch} --arch {self.arch}")
            sources[name] = path.read_text()
        return sources

    def _metal(self):
        """A Metal module's factorizer, on the Mac's GPU, from the kernel sources beside the module."""
        if self._factorizer is None:
            from .run import metal_engine, metal_runtime

            target = Target.parse(self.arch)
            names = [k.name for k in check_plan(self.schedule, target).kernels]
            self._factorizer = metal_engine.MetalFactorizer(self.schedule, metal_runtime.metal_device(), target,
                                                            sources=self._sources(names))
        return self._factorizer

    def _get(self):
        if Target.parse(self.arch).backend == "metal":
            return self._metal()
        if self._factorizer is None:
            target = Target.parse(self.arch)
            here = current_target()
            if here is not None and here.arch != target.arch:
                try:
                    check(self.schedule, here)
                except ValueError as exc:
                    raise RuntimeError(f"this module was built for {self.arch}; this GPU is {here.arch}, which cannot "
                                       f"run its schedule ({exc}): qrgen build --shape {self.m}x{self.n} --batch "
                                       f"{self.batch} --arch {here.arch}") from None
                self._factorizer = Factorizer(self.m, self.n, self.schedule, here)
                return self._factorizer
            sources = self._sources(k.name for k in Factorizer(self.m, self.n, self.schedule, target).kernels)
            self._factorizer = Factorizer(self.m, self.n, self.schedule, target, sources=sources)
        return self._factorizer

    def build(self):
        return self._get().build()

    def geqrf(self, a):
        fac = self._get()
        if Target.parse(self.arch).backend == "metal":
            from .run import metal_runtime

            return metal_runtime.geqrf(a, fac=fac)
        out = fastpath.fast_geqrf(fac, a)
        return out if out is not None else fac(a)

    def qr(self, a, mode: str = "reduced"):
        if Target.parse(self.arch).backend == "metal":
            from .run import metal_runtime

            return metal_runtime.qr(a, mode, self._get().device, Target.parse(self.arch))
        return api.qr(a, mode, factorizer=self._get())

    def _metal_device(self):
        """A Metal module's device, where its target is Metal; else None."""
        return self._get().device if Target.parse(self.arch).backend == "metal" else None

    def lstsq(self, a, b):
        if self._metal_device() is not None:
            from .run import metal_runtime

            return metal_runtime.lstsq(a, b, self._metal_device(), Target.parse(self.arch))
        return api.lstsq(a, b, factorizer=self._get())

    def householder_product(self, h, tau, complete: bool = False):
        if self._metal_device() is not None:
            from .run import metal_runtime

            return metal_runtime.householder_product(h, tau, complete, self._metal_device(), Target.parse(self.arch))
        return api.householder_product(h, tau, complete, factorizer=self._get())

    def ormqr(self, h, tau, c, side: str = "L", transpose: bool = False):
        if self._metal_device() is not None:
            from .run import metal_runtime

            return metal_runtime.ormqr(h, tau, c, side, transpose, self._metal_device(), Target.parse(self.arch))
        return api.ormqr(h, tau, c, side, transpose, factorizer=self._get())

