"""Family "scale": the power-of-two scale per matrix of Schedule.scaled (templates/cuda/scale.cu.j2), one kernel
for every schedule in three phases: the input's largest magnitude, the scaled copy into h, R scaled back."""
from __future__ import annotations

from ..render.environment import environment
from ..version import __version__
from .specs import KernelSpec, Rendered

NAME = "qr_scale"
THREADS = 256
SIGNATURE = "PPPIII"  # src, h, amax, phase, m, n


def kernel() -> KernelSpec:
    return KernelSpec(NAME, "scale", 0, THREADS, 1, 0, 4, False, 0, 0, ())


def signature(spec: KernelSpec) -> str:
    return SIGNATURE


def features(spec: KernelSpec) -> tuple[str, ...]:
    return ()


def render(spec: KernelSpec, schedule, target) -> Rendered:
    template = environment().get_template(f"{target.record.template_dir}/scale.cu.j2")
    return Rendered(spec.name, template.render(version=__version__, arch=target.arch, k=spec))
