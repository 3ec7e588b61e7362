"""Every NVIDIA architecture qrgen lists that the installed NVRTC compiles for: the kernels of the schedules
qrgen picks there (the tuned file where one is shipped, else the default heuristic's) for the reference batches, the
single and tall shapes and two many-small ones (lanes panels past 32 columns, on one warp and on a block), for geqrf
and for qr (which keeps V and T), render and compile with NVRTC without spills (SPILL_BUDGET states the
exceptions)."""
import os

import pytest

from qrgen.bench import REFERENCE_CASES, SINGLE_TALL_CASES, SMALL_CASES, UNTUNED_CASES
from qrgen.compile.nvrtc import compile_many, supported_archs
from qrgen.problem import Problem
from qrgen.render.sources import render_all
from qrgen.schedule.files import find
from qrgen.targets import CLUSTERS, Target
from qrgen.targets.cuda import ARCHS

from kernel_cases import cupy_installed, needs_nvrtc

# Bytes of spill stores and loads allowed per kernel family (its name's prefix) and arch, where ptxas spills: the T
# kernel (1024 threads, so 64 registers; once per aggregate) one register pair on sm_86, sm_87 and sm_89; lanes
# panels of 672 threads or more (88 registers or fewer) up to two pairs on sm_120 and sm_121, whose ptxas needs a
# few more registers than sm_90's for the same source. Every other kernel: none.
SPILL_BUDGET = {("qr_tmat", "sm_86"): 16, ("qr_tmat", "sm_87"): 16, ("qr_tmat", "sm_89"): 16,
                ("qr_lanes", "sm_120"): 16, ("qr_lanes", "sm_121"): 16}


def budget(name: str, arch: str) -> int:
    return max([b for (prefix, a), b in SPILL_BUDGET.items() if a == arch and name.startswith(prefix)], default=0)


GPUS = [a for a in ARCHS if not a.endswith("a")]  # sm_90a is sm_90 with its arch-specific instructions
EVERY_ARCH_CASES = REFERENCE_CASES + SINGLE_TALL_CASES + ((1000, 64, 64), (500, 128, 128))


def kernels(target, cases=REFERENCE_CASES + SINGLE_TALL_CASES):
    """{source: name} of every kernel the picked schedules of the cases (default: the reference, single and tall
    ones) need, for geqrf and for qr's keep plans where the schedule has one."""
    found = {}
    for batch, m, n in cases:
        schedule, _ = find(Problem(m, n, batch), target)
        for keep in (False, True):
            try:
                rendered = render_all(schedule, target, keep=keep)
            except ValueError:  # no keep plan for this schedule (a "whole" one): qr forms Q from h and tau
                if not keep:
                    raise
                continue
            for r in rendered:
                found[r.source] = r.name
    return found


@needs_nvrtc
@pytest.mark.parametrize("arch", GPUS)
def test_picked_schedules_compile_for_every_arch(arch, monkeypatch):
    if arch not in supported_archs():
        pytest.skip(f"the installed NVRTC does not compile for {arch}")
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ["QRGEN_TEST_CACHE_DIR"])
    target = Target("cuda", arch)
    items = [(name, source) for source, name in kernels(target, EVERY_ARCH_CASES).items()]
    if not target.has(CLUSTERS):
        assert not any("cluster" in source and "__cluster_dims__" in source for _, source in items)
    binaries = compile_many(items, target)
    over = [(b.name, b.spill_bytes, b.stack_bytes) for b in binaries
            if max(b.spill_bytes, b.stack_bytes) > budget(b.name, arch)]
    assert len(binaries) == len(items) and not over, over


@needs_nvrtc
def test_the_many_small_and_untuned_sets_compile_without_spills_for_sm_90(monkeypatch):
    """qrgen bench's --small and --untuned sets (the default heuristic's schedules), on the one arch they are timed
    on here."""
    monkeypatch.setenv("QRGEN_CACHE_DIR", os.environ["QRGEN_TEST_CACHE_DIR"])
    target = Target("cuda", "sm_90")
    items = [(name, source) for source, name in kernels(target, SMALL_CASES + UNTUNED_CASES).items()]
    binaries = compile_many(items, target)
    assert [(b.name, b.spill_bytes, b.stack_bytes) for b in binaries if b.spill_bytes or b.stack_bytes] == []


def test_the_listed_archs_are_the_ones_asked_for():
    assert GPUS == ["sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120", "sm_121"]
    if cupy_installed():
        from qrgen.compile.nvrtc import version

        if version() >= (12, 9):  # NVRTC 12.9 and 13.x know every one of them
            assert set(GPUS) <= set(supported_archs())


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_archs_without_clusters_get_schedules_without_clusters(arch):
    target = Target("cuda", arch)
    for batch, m, n in REFERENCE_CASES + SINGLE_TALL_CASES:
        schedule, origin = find(Problem(m, n, batch), target)
        assert origin.startswith("default") and not any(p.cluster for p in schedule.panels)
