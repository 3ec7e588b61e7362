"""Compile layer, Metal: the CUDA translation of the Metal kernels (qrgen/compile/msl.to_cuda) compiles with NVRTC
for sm_90, declares no shared memory of its own, and its launcher takes the buffers of the launch contract; also the
GEMMs of half and bfloat inputs and the power-of-two scale."""
import dataclasses

import pytest

from qrgen.compile import msl
from qrgen.plan import msl as msl_families
from qrgen.plan.planner import plan
from qrgen.problem import Problem
from qrgen.render.sources import render
from qrgen.schedule import apple as apple_schedule
from qrgen.schedule.files import find
from qrgen.schedule.model import Precision
from qrgen.targets import Target

pytest.importorskip("cupy")


@pytest.mark.parametrize("batch,m,n,precision", [(8, 64, 64, None), (1, 4096, 32, None),
                                                  (2, 300, 300, Precision("bf16", "fp16", "fp16"))])
def test_the_cuda_translation_of_metal_kernels_compiles(batch, m, n, precision):
    from cupy_backends.cuda.libs import nvrtc

    apple = Target.parse("apple9")
    schedule, _ = find(Problem(m, n, batch), apple)
    if precision is not None:
        schedule = dataclasses.replace(schedule, precision=precision)
    rows = apple_schedule.panel_schedule(Problem(m, n, batch), apple)  # qr's keep plan (run/metal_runtime.py)
    kernels = ([(k, schedule) for k in plan(schedule, apple).kernels]
               + [(k, rows) for k in plan(rows, apple, True).kernels] + [(k, None) for k in msl_families.Q_KERNELS])
    for kernel, s in kernels:
        code, sig = msl.to_cuda(render(kernel, s, apple).source, kernel.name)
        assert f"{kernel.name}__msl(" in code and len(sig.buffers) >= 3
        prog = nvrtc.createProgram(code, f"{kernel.name}.cu", [], [])
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=sm_90", "-std=c++17", "-default-device"])
        except nvrtc.NVRTCError:
            pytest.fail(f"{kernel.name}: {nvrtc.getProgramLog(prog)[:2000]}")
        finally:
            nvrtc.destroyProgram(prog)
