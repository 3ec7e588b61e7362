"""What the planner hands on: kernel specs (compile-time constants), launches, aggregates, kept blocks, sources."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpec:
    """One compiled kernel: everything here is a compile-time constant of its source."""

    name: str
    variant: str  # its family (plan/family.py)
    width: int
    threads: int
    blocks: int  # blocks per matrix (the fused products: per cluster)
    slots: int  # rows each thread holds
    vec: int  # floats per global load
    trail: bool  # columns right of the panel exist: write V^T and (VT)^T for the trailing update
    slice: int  # columns per warp (cols), columns per inner panel (whole), 0 otherwise
    shared_bytes: int  # dynamic shared memory it is launched with
    columns: tuple[int, ...]  # first columns of the panels that use it
    cluster: bool = False  # the blocks of a matrix form one thread-block cluster
    loop: bool = False  # the loop over columns is not unrolled (Panel.loop)
    formq: bool = False  # lanes: writes Q and R (qrgen.qr, mode "reduced") instead of h and tau (fused_q_kernel)
    kind: str = ""  # a product family's member (tf32x3: "project", "project64", "update", "gram")
    vt_only: bool = False  # trail, but no (VT)^T: no products of its own follow (plan.planner.panel_outputs)
    pack: int = 1  # matrices per block (lanes: a narrow one-warp panel, a segment of the warp a matrix)
    t_out: bool = False  # vt_only, and the panel is its aggregate, whose T it writes (planner.panel_outputs)


@dataclass(frozen=True)
class Launch:
    """One panel of the schedule: which kernel, where, how many flag arrivals per block it makes, which columns
    its own trailing update covers and where its reflectors go in its aggregate's V^T buffer."""

    kernel: str
    c0: int
    width: int
    rows: int
    threads: int
    blocks: int
    barriers: int
    trail: bool  # the kernel writes V^T and (VT)^T
    shared_bytes: int
    nc: int  # columns right of the panel that its own two products update (to the end of its aggregate, or reach's)
    v_row: int  # the panel's first row (and column) inside its aggregate's V^T buffer
    v_ld: int  # rows of that buffer (its leading dimension)
    v_bs: int  # floats per matrix in that buffer
    cluster: bool = False  # blocks > 1 as one cluster: no flags, no cooperative launch
    levels: tuple[tuple[int, int], ...] = ()  # a tsqr panel's tree (layout.tsqr_levels): one launch per phase
    tile: int = 0  # a tsqr panel's rows per tile
    inner: int = 0  # a "whole" kernel's columns per panel: the launch factors and updates everything itself
    vt_only: bool = False  # the kernel writes V^T but no (VT)^T (KernelSpec.vt_only)
    pack: int = 1  # matrices per block (KernelSpec.pack): plan/family.panel_grid
    t_out: bool = False  # the kernel writes its aggregate's T (KernelSpec.t_out): the merge forms neither G nor T

    @property
    def cooperative(self) -> bool:
        """Several blocks of a matrix that wait for each other through global memory: all must be resident."""
        return self.blocks > 1 and not self.cluster


@dataclass(frozen=True)
class Aggregate:
    """Columns [a0, a1) whose merged compact WY form updates columns [c1, n) after its last panel (nc = n - c1 of
    them): c1 is a1, or with Schedule.reach the next aggregate's end (its panels' own products update up to there)."""

    a0: int
    a1: int
    rows: int
    nc: int
    first: int  # panel indices first..last
    last: int
    c1: int


@dataclass(frozen=True)
class Kept:
    """A block reflector a keep plan keeps for Q: a panel, or an aggregate of panels. Its V^T (in buffer
    "reflectors") and (VT)^T (in `wy`: "panel_wy" for a panel, "aggregate_wy" for an aggregate) are width x rows,
    from row c0, the chunk's matrices width * rows floats apart from nb * offset floats on."""

    c0: int
    width: int
    rows: int
    offset: int
    wy: str


@dataclass(frozen=True)
class Plan:
    """The distinct kernels a schedule needs and the launch of each panel in order."""

    kernels: tuple[KernelSpec, ...]
    launches: tuple[Launch, ...]
    aggregates: tuple[Aggregate, ...]
    kept: tuple[Kept, ...]
    keep: bool
    t_fused: tuple[int, ...] = ()  # the aggregates (indices) whose projections may apply T (tf32x3.t_fused, t_fills;
    # never a t_late one)
    t_late: tuple[int, ...] = ()  # the aggregates whose T is applied after their projection, beside G and T (t_late)

    def kernel(self, name: str) -> KernelSpec:
        return next(k for k in self.kernels if k.name == name)


@dataclass(frozen=True)
class Rendered:
    name: str
    source: str
