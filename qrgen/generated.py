"""What a generated module (generated/qr_<m>x<n>_b<batch>.py) runs on: its schedule, its target and its kernel
sources beside it."""
from __future__ import annotations

from pathlib import Path

from . import api
from .run import fastpath
from .run.factorizer import Factorizer
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
