"""A schedule turned into its plan for a target: the distinct kernels it needs and the launch of each panel, after
checking that the target can run every kernel (registers, shared memory, cluster sizes, features)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

from ..targets import Target
from . import apply3, fused, rowsplit, scale, tf32x3, tmat
from .family import panel_family, panel_pack, register_cap
from .layout import aggregates, kept_blocks
from .lanes import fused_q_kernel
from .specs import KernelSpec, Launch, Plan
from .tsqr import tsqr_levels


@dataclass(frozen=True)
class PanelResources:
    rows: int  # rows of the panel (m - first column)
    slots: int  # rows each thread holds
    registers: int  # estimate of registers per thread
    register_cap: int
    shared_bytes: int


@dataclass(frozen=True)
class PanelOutputs:
    agg: object  # the panel's aggregate (layout.Aggregate), or None
    nc: int  # columns right of the panel that its own two products update
    trail: bool  # it writes V^T
    vt_only: bool  # and no (VT)^T: no products of its own follow and its family can leave (VT)^T out
    t_out: bool = False  # vt_only, and it writes its aggregate's T: the merge forms neither G nor T


def panel_outputs(schedule, index: int, aggs: tuple, keep: bool = False, target: Target = Target()) -> PanelOutputs:
    """What panel `index` hands on. Its own products reach the end of its aggregate (or reach's), else the end of the
    matrix; it writes V^T where columns follow it or its aggregate (or for Q: keep), and (VT)^T only for products
    of its own or, in a keep plan without aggregates, for Q (an aggregate's merge computes its own (VT)^T). A panel
    that is its aggregate, merged, also writes T where its family can (t_out) on the target: not with reach, whose
    merges run beside the next aggregate's panels, which would overwrite T."""
    panel, c0 = schedule.panels[index], schedule.starts()[index]
    agg = next((a for a in aggs if a.first <= index <= a.last), None)
    nc = 0 if panel.variant == "whole" else (agg.c1 if agg else schedule.n) - c0 - panel.width
    trail = keep or nc > 0 or (agg is not None and agg.nc > 0)
    wy = nc > 0 or (keep and not aggs)
    fam = panel_family(panel.variant)
    vt_only = trail and not wy and fam.VT_ONLY
    alone = agg is not None and agg.first == agg.last == index and (agg.nc > 0 or keep) and not schedule.reach
    t_out = vt_only and alone and getattr(fam, "t_out", None) is not None and fam.t_out(panel, schedule.m - c0, target)
    return PanelOutputs(agg, nc, trail, vt_only, t_out)


def resources(schedule, index: int, target: Target) -> PanelResources:
    """What panel `index` of the schedule needs of a block, and the register cap the target allows it."""
    panel = schedule.panels[index]
    rows = schedule.m - schedule.starts()[index]
    fam = panel_family(panel.variant)
    out = panel_outputs(schedule, index, aggregates(schedule), target=target)
    return PanelResources(rows, fam.slots(panel, rows), fam.registers(panel, rows),
                          register_cap(panel.threads, target.limits),
                          shared(fam.shared_bytes, panel, rows, out, schedule))


def prepares(out: PanelOutputs) -> bool:
    """Whether a panel forms G and T in its kernel (their shared memory): for products of its own, or t_out."""
    return (out.trail and not out.vt_only) or out.t_out


def shared(fn, panel, rows: int, out: PanelOutputs, schedule) -> int:
    """A family's shared_bytes or spec_shared for the panel's outputs: t_out (which cols alone forms) as a keyword
    where it is set (plan/family)."""
    return fn(panel, rows, prepares(out), schedule.m, schedule.n, **({"t_out": True} if out.t_out else {}))


def check_place(schedule, index: int, trail: bool) -> None:
    """What panel `index`'s family needs of its place in the schedule (its check_plan, where it has one)."""
    family_check = getattr(panel_family(schedule.panels[index].variant), "check_plan", None)
    if family_check is not None:
        family_check(schedule, index, trail)


def check(schedule, target: Target) -> None:
    """ValueError naming the panel and what it lacks where the target cannot run a kernel of the schedule."""
    limits = target.limits
    if target.record.families:
        importlib.import_module(target.record.families).check(schedule, target)
    elif schedule.widest_aggregate > tmat.max_reflectors(target):
        raise ValueError(f"Schedule.aggregate has {schedule.widest_aggregate} columns; the T kernel takes at most "
                         f"{tmat.max_reflectors(target)} on {target.arch} (its shared memory)")
    aggs = aggregates(schedule)
    for index, panel in enumerate(schedule.panels):
        check_place(schedule, index, panel_outputs(schedule, index, aggs, target=target).trail)
        res = resources(schedule, index, target)
        if res.registers > res.register_cap:
            raise ValueError(
                f"Schedule.panels[{index}] ({panel.variant}, width {panel.width}, threads {panel.threads}, "
                f"blocks {panel.blocks}) needs about {res.registers} registers per thread for its "
                f"{res.rows} rows; the cap is {res.register_cap}: use more threads or blocks, or a narrower panel")
        if res.shared_bytes > limits.shared_bytes and not target.record.families:  # (those check their own)
            raise ValueError(f"Schedule.panels[{index}] needs {res.shared_bytes} bytes of shared memory; "
                             f"the budget is {limits.shared_bytes}")
        missing = [f for f in panel_family(panel.variant).features(panel) if not target.has(f)]
        if missing:
            raise ValueError(f"Schedule.panels[{index}] ({panel.variant}{', cluster' if panel.cluster else ''}) "
                             f"needs {', '.join(missing)}, which {target.backend} {target.arch} lacks")
        if panel.cluster and panel.blocks > limits.cluster_max:
            raise ValueError(f"Schedule.panels[{index}] runs on clusters of {panel.blocks} blocks; {target.arch} "
                             f"allows at most {limits.cluster_max}")


def plan(schedule, target: Target = Target(), keep: bool = False) -> Plan:
    """The distinct kernels a schedule needs, and the launch of each panel in order. keep: every panel writes its
    V^T and (VT)^T, the last ones too, and every aggregate is merged, the last one too, for qr's Q
    (run/sequence.drive_q), whose products for kept blocks of tf32x3.MIN columns or more take the tf32x3 kernels."""
    check(schedule, target)
    keys: dict[KernelSpec, list[int]] = {}
    launches = []
    aggs = aggregates(schedule)
    for index, (panel, c0) in enumerate(zip(schedule.panels, schedule.starts())):
        rows = schedule.m - c0
        fam = panel_family(panel.variant)
        whole = panel.variant == "whole"  # its kernel updates every column itself
        if whole and keep:
            raise ValueError("a 'whole' schedule keeps no reflectors for Q (its panels never leave shared memory): "
                             "no keep plan")
        out = panel_outputs(schedule, index, aggs, keep, target)
        agg, nc, trail = out.agg, out.nc, out.trail
        check_place(schedule, index, trail)
        if agg is None:
            v_row, v_ld, v_bs = 0, rows, panel.width * rows
        else:  # in its aggregate's V^T, whose merged form begins at the aggregate's end (or with reach the next one's)
            v_row, v_ld, v_bs = c0 - agg.a0, agg.rows, (agg.a1 - agg.a0) * agg.rows
        spec = KernelSpec("", panel.variant, panel.width, panel.threads, panel.blocks, fam.slots(panel, rows),
                          fam.vec(panel, schedule.n, c0), trail, panel.slice,
                          shared(fam.spec_shared, panel, rows, out, schedule), (),
                          panel.cluster, panel.loop, vt_only=out.vt_only,
                          pack=panel_pack(panel, trail, target), t_out=out.t_out)
        if keep and spec.shared_bytes > target.limits.shared_bytes and not target.record.families:
            raise ValueError(f"Schedule.panels[{index}] keeps its reflectors for Q with {spec.shared_bytes} bytes of "
                             f"shared memory; the budget is {target.limits.shared_bytes}: no keep plan")
        keys.setdefault(spec, []).append(c0)
        # flag arrivals per block (multi-block panels without a cluster): one per column, one more for G
        barriers = 0 if panel.cluster or whole else panel.width + (1 if panel.width >= 2 and trail else 0)
        launches.append(Launch(kernel=fam.name(spec), c0=c0, width=panel.width, rows=rows, threads=panel.threads,
                               blocks=panel.blocks, barriers=barriers, trail=trail, shared_bytes=spec.shared_bytes,
                               nc=nc, v_row=v_row, v_ld=v_ld, v_bs=v_bs, cluster=panel.cluster,
                               levels=tsqr_levels(rows, panel.width, panel.tile) if panel.variant == "tsqr" else (),
                               tile=panel.tile, inner=panel.slice if whole else 0, vt_only=out.vt_only,
                               pack=spec.pack, t_out=out.t_out))
    kernels = [_named(spec, cols) for spec, cols in keys.items()]
    if target.record.families:  # the backend's own product kernels (Metal: plan/msl.py)
        kernels += importlib.import_module(target.record.families).product_kernels(schedule, launches, aggs, keep)
        return Plan(tuple(kernels), tuple(launches), aggs, kept_blocks(launches, aggs) if keep else (), keep)
    fused_q = None if keep else fused_q_kernel(kernels, launches)
    if fused_q is not None:
        kernels.append(fused_q)
    widths = sorted({L.width for L in launches if L.nc > 0})
    if schedule.panel_update == "rowsplit":
        kernels += [rowsplit.kernel(kind, w) for w in widths for kind in rowsplit.KINDS]
    elif schedule.panel_update == "fused":
        kernels += [fused.kernel(w, cl) for w in widths for cl in fused.cluster_sizes(target)]
    # the merges that form G and T: those of aggregates whose panel does not write T (Launch.t_out)
    merges = any((a.nc > 0 or keep) and not launches[a.last].t_out for a in aggs)
    if merges:
        kernels.append(tmat.kernel(target))
    if schedule.scaled:
        kernels.append(scale.kernel())
    late = tuple(i for i, a in enumerate(aggs) if t_late(schedule, a, launches[a.last].t_out, keep))
    fused_t = tuple(i for i, a in enumerate(aggs) if a.nc > 0 and i not in late and tf32x3.t_fused(schedule, a, keep))
    kinds = set(tf32x3.kinds(schedule, keep, fused_t)) - (set() if merges else {"gram"})
    kept = kept_blocks(launches, aggs) if keep else ()
    for block in kept:
        if tf32x3.q_precision(block.width) == "tf32x3":
            kinds |= tf32x3.project_kinds(block.width) | {"update"}  # Q's W = V^T P and P -= (V T) W
    kernels += [tf32x3.kernel(kind) for kind in tf32x3.CONFIGS if kind in kinds]
    kernels += apply3.kernels(schedule, aggs, target)
    return Plan(tuple(kernels), tuple(launches), aggs, kept, keep, fused_t, late)


def t_late(schedule, agg, t_out: bool, keep: bool = False) -> bool:
    """Whether an aggregate's projection runs before its T exists, on a second stream beside G and T, and T is
    applied to its result, W = T^T (V^T C), so that the merge forms no (VT)^T (docs/decisions.md#t-late): an
    aggregate with columns right of it whose merge forms G and T (its last panel does not write T: t_out), on one
    stream otherwise (no lookahead, nor reach, which needs it), through the two products (apply3 reads (VT)^T), not in
    qr's keep plans (Q's products read (VT)^T). A tf32x3 projection, which can apply T in its epilogue instead
    (Plan.t_fused), only where fewer columns than rows lie right of the aggregate: W = T^T Y then costs less than G,
    beside which the projection runs (a wide matrix's T^T Y costs as much as its projection)."""
    return (not keep and agg.nc > 0 and not t_out and not schedule.lookahead and schedule.aggregate_update == "gemm"
            and (schedule.precision.project != "tf32x3" or agg.nc < agg.rows))


def _named(spec: KernelSpec, columns: list[int]) -> KernelSpec:
    return replace(spec, name=panel_family(spec.variant).name(spec), columns=tuple(columns))
