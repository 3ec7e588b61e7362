"""What a generated module (generated/qr_<m>x<n>_b<batch>.py) runs on: its schedule, its target and its kernel
sources beside it. On a GPU of another architecture than the module's, the same schedule is rendered and compiled
for that GPU where it fits there (a module for sm_80 runs on an H100), else the call says to rebuild."""
from __future__ import annotations

from pathlib import Path

from . import api
from .run import fastpath
from .plan.planner import check
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

    def _get(self):
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
            sources = {}
            for k in Factorizer(self.m, self.n, self.schedule, target).kernels:
                path = self.kernel_dir / f"{k.name}.cu"
                if not path.exists():
                    raise FileNotFoundError(f"{path} is missing: rebuild with qrgen build --shape {self.m}x{self.n} "
                                            f"--batch {self.batch} --arch {self.arch}")
                sources[k.name] = path.read_text()
            self._factorizer = Factorizer(self.m, self.n, self.schedule, target, sources=sources)
        return self._factorizer

    def build(self):
        return self._get().build()

    def geqrf(self, a):
        fac = self._get()
        out = fastpath.fast_geqrf(fac, a)
        return out if out is not None else fac(a)

    def qr(self, a, mode: str = "reduced"):
        return api.qr(a, mode, factorizer=self._get())

    def lstsq(self, a, b):
        return api.lstsq(a, b, factorizer=self._get())

    def householder_product(self, h, tau, complete: bool = False):
        return api.householder_product(h, tau, complete, factorizer=self._get())

    def ormqr(self, h, tau, c, side: str = "L", transpose: bool = False):
        return api.ormqr(h, tau, c, side, transpose, factorizer=self._get())

