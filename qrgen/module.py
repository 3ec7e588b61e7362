"""What a generated module (generated/qr_<m>x<n>_b<batch>.py) runs on: its schedule and kernel sources."""
from __future__ import annotations

from pathlib import Path

from .schedule import Schedule


class GeneratedModule:
    def __init__(self, m: int, n: int, batch: int, arch: str, schedule_json: dict, kernel_dir: Path):
        self.m, self.n, self.batch, self.arch = m, n, batch, arch
        self.schedule = Schedule.from_json(schedule_json)
        self.kernel_dir = Path(kernel_dir)
        self._factorizer = None

    def _get(self):
        if self._factorizer is None:
            from .codegen import plan
            from .runtime import Factorizer

            kernels, _ = plan(self.schedule)
            sources = {}
            for k in kernels:
                path = self.kernel_dir / f"{k.name}.cu"
                if not path.exists():
                    raise FileNotFoundError(f"{path} is missing: rebuild with qrgen build --shape {self.m}x{self.n} "
                                            f"--batch {self.batch} --arch {self.arch}")
                sources[k.name] = path.read_text()
            self._factorizer = Factorizer(self.m, self.n, self.schedule, self.arch, sources=sources)
        return self._factorizer

    def build(self):
        return self._get().build()

    def geqrf(self, a):
        return self._get()(a)

    def qr(self, a, mode: str = "reduced"):
        from . import linalg

        return linalg.qr(a, mode, factorizer=self._get())

    def lstsq(self, a, b):
        from . import linalg

        return linalg.lstsq(a, b, factorizer=self._get())

    def householder_product(self, h, tau, complete: bool = False):
        from . import linalg

        return linalg.householder_product(h, tau, complete, factorizer=self._get())

    def ormqr(self, h, tau, c, side: str = "L", transpose: bool = False):
        from . import linalg

        return linalg.ormqr(h, tau, c, side, transpose, factorizer=self._get())
