"""The decisions that turn a Problem into kernels: panel widths, panel kernel variants, stage precisions.

A Schedule holds decisions only (TVM's tuning records do the same): code is always regenerated from it.
Schedules live as JSON under schedules/<arch>/<m>x<n>_b<batch>.json, with provenance beside the decisions.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .problem import Problem, Target

VARIANTS = ("warp", "rows", "cols", "lanes", "tsqr", "whole")
LOOP_VARIANTS = ("warp", "rows", "tsqr", "whole")  # Panel.loop
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The trailing update's two products may also take "tf32x3": fp32-class accuracy from three tf32 tensor-core products
# over each input's tf32 high part and remainder (templates/cuda/gemm3.cu.j2), where the GEMM's operands are
# 16-byte aligned; elsewhere those products run in fp32 through cuBLAS.
PRODUCT_PRECISIONS = PRECISIONS + ("tf32x3",)
STAGES = ("gram", "project", "update")
THREADS = (32, 64, 128, 256, 512, 1024)
SLICES = (2, 4, 8)
WHOLE_SLICES = (4, 8, 16, 32)  # columns per panel inside a "whole" kernel
# Blocks per thread-block cluster: 8 is the portable most (sm_90); 16 is the H100/H200's non-portable most, which
# qrgen asks the driver for where a kernel needs it (runtime.load_function). A GPU that cannot hold such a cluster
# (too few SMs in one GPC) gets a clear error at the first call. What 16 gains: default_cluster.
PORTABLE_CLUSTER = 8
MAX_CLUSTER = 16
CLUSTER_SLOTS = 4  # the default's most rows per thread on a cluster (cluster_panel)
PANEL_UPDATES = ("cublas", "split", "fused")

# sm_90 budgets (per block): the compiler's register cap comes from __launch_bounds__(threads, 1).
MAX_REGS_PER_THREAD = 255
REGS_PER_SM = 65536
MAX_SMEM = 232448  # 227 KiB of dynamic shared memory
# Registers beside the register tile (addresses, loop state, scalars), per variant; from ptxas reports on sm_90
# (rows: 108 used where the tile is 32; cols: 80 where the model gives 70 without overhead) and checked in tests.
REG_OVERHEAD = {"warp": 40, "rows": 40, "cols": 32, "lanes": 24, "tsqr": 60, "whole": 48}
TSQR_SLOTS = 8  # the most rows per thread of a tsqr panel's tiles

MAX_AGGREGATE = 256  # the widest T the T kernel builds (codegen.TMAT_MAX)

SCHEDULE_DIR = Path(__file__).resolve().parent.parent / "schedules"


@dataclass(frozen=True)
class Panel:
    """One panel of `width` columns and the kernel that factors it.

    variant "warp": one warp per matrix, the panel's rows spread over its lanes, all columns in registers.
    variant "rows": `threads` threads in each of `blocks` blocks per matrix share the rows; each thread holds
                    its rows' columns in registers; blocks > 1 exchange partial sums through global memory, or
                    with cluster=True (2 to MAX_CLUSTER blocks) through each other's shared memory as one
                    thread-block cluster (a hardware barrier per column instead of flags in global memory).
    variant "cols": one block per matrix; warp w owns columns [w*slice, (w+1)*slice) in registers and takes its
                    turn as producer of those reflectors (published to shared memory, one mbarrier each).
    variant "lanes": one block per matrix; lane c of every warp owns column c, the warps own consecutive row
                    ranges (threads a multiple of 32); the loop over columns is not unrolled, except on one warp
                    (threads=32, blocks=1), where every row is a constant. With cluster=True (2 to MAX_CLUSTER
                    blocks) the blocks of one cluster share the rows.
    variant "tsqr": for tall panels of few matrices: a tree of QRs over tiles of `tile` rows (a multiple of
                    `threads`, at least twice the width), each on one block as "rows" factors a panel, then Q's
                    columns down the tree and Householder reflectors rebuilt from Q (templates/cuda/tsqr.cuh.j2).
    variant "whole": the whole factorization in one kernel, one block of `threads` per matrix holding the matrix in
                    shared memory (width = min(m, n), the schedule's only panel): panels of `slice` columns
                    (WHOLE_SLICES) factor as "rows" panels on the block, each followed by its fp32 update of
                    the columns right of it from shared memory (templates/cuda/whole.cuh.j2). For matrices whose
                    m x (n + 1) floats fit in shared memory beside the panels' state (whole_shared_bytes).
    loop (warp, rows, tsqr, whole): the loop over columns is not unrolled either (registers rotate by one column
                    per step: small code at about 1.6x the arithmetic; pays where several blocks share an SM's
                    instruction cache, measured on the H200 at 640 x 512²).
    """

    width: int
    variant: str = "rows"
    threads: int = 32
    blocks: int = 1
    slice: int = 0
    cluster: bool = False
    loop: bool = False
    tile: int = 0

    def __post_init__(self):
        if not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"Panel.width must be a positive integer, got {self.width!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"Panel.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant == "lanes":
            if not isinstance(self.threads, int) or self.threads % 32 or not 32 <= self.threads <= 1024:
                raise ValueError(f"Panel.threads must be a multiple of 32 from 32 to 1024 for variant 'lanes', "
                                 f"got {self.threads!r}")
            if self.blocks != 1 and not self.cluster:
                raise ValueError(f"Panel variant 'lanes' takes blocks=1, or 2 to {MAX_CLUSTER} blocks with "
                                 f"cluster=True; got blocks={self.blocks!r} with cluster={self.cluster!r}")
        elif self.variant == "whole":
            if self.threads not in THREADS:
                raise ValueError(f"Panel.threads must be one of {THREADS} for variant 'whole', got {self.threads!r}")
            if self.slice not in WHOLE_SLICES:
                raise ValueError(f"Panel.slice (columns per panel inside the kernel) must be one of {WHOLE_SLICES} "
                                 f"for variant 'whole', got {self.slice!r}")
            if self.blocks != 1 or self.cluster:
                raise ValueError("Panel variant 'whole' takes blocks=1 and no cluster")
        elif self.variant != "cols" and self.threads not in THREADS:
            raise ValueError(f"Panel.threads must be one of {THREADS}, got {self.threads!r}")
        if not isinstance(self.blocks, int) or self.blocks < 1:
            raise ValueError(f"Panel.blocks must be a positive integer, got {self.blocks!r}")
        if self.variant == "tsqr":
            if self.blocks != 1:
                raise ValueError("Panel variant 'tsqr' takes blocks=1 (its tiles are its blocks)")
            if self.threads < self.width:
                raise ValueError(f"Panel variant 'tsqr' needs threads >= width; got {self.threads} threads for "
                                 f"width {self.width}")
            if (not isinstance(self.tile, int) or self.tile < 2 * self.width or self.tile % self.threads
                    or self.tile // self.threads > TSQR_SLOTS):
                raise ValueError(f"Panel.tile (rows per tile of variant 'tsqr') must be a multiple of threads "
                                 f"({self.threads}), at least twice the width ({2 * self.width}) and at most "
                                 f"{TSQR_SLOTS} x threads; got {self.tile!r}")
        elif self.tile != 0:
            raise ValueError(f"Panel.tile applies to variant 'tsqr' only; got tile={self.tile} for {self.variant!r}")
        if self.variant in ("warp", "rows", "lanes", "tsqr") and self.width > 32:
            raise ValueError(f"Panel.width must be at most 32 for variant {self.variant!r}, got {self.width}")
        if self.variant == "warp" and (self.threads != 32 or self.blocks != 1):
            raise ValueError("Panel variant 'warp' takes threads=32 and blocks=1")
        if self.variant == "cols":
            if self.slice not in SLICES:
                raise ValueError(f"Panel.slice must be one of {SLICES} for variant 'cols', got {self.slice!r}")
            if self.blocks != 1:
                raise ValueError("Panel variant 'cols' takes blocks=1")
            if self.threads != 32 * math.ceil(self.width / self.slice) or self.threads > 1024:
                raise ValueError(
                    f"Panel.threads must be 32 * ceil(width / slice) = {32 * math.ceil(self.width / self.slice)} "
                    f"(at most 1024) for variant 'cols', got {self.threads}")
        elif self.slice != 0 and self.variant != "whole":
            raise ValueError(f"Panel.slice applies to variants 'cols' and 'whole' only; got slice={self.slice} "
                             f"for {self.variant!r}")
        if not isinstance(self.cluster, bool):
            raise ValueError(f"Panel.cluster must be a bool, got {self.cluster!r}")
        if self.cluster and (self.variant not in ("rows", "lanes") or not 2 <= self.blocks <= MAX_CLUSTER):
            raise ValueError(f"Panel.cluster takes variant 'rows' or 'lanes' with 2 to {MAX_CLUSTER} blocks; got "
                             f"variant {self.variant!r} with {self.blocks} block(s)")
        if not isinstance(self.loop, bool):
            raise ValueError(f"Panel.loop must be a bool, got {self.loop!r}")
        if self.loop and self.variant not in LOOP_VARIANTS:
            raise ValueError(f"Panel.loop applies to variants {LOOP_VARIANTS} only; got {self.variant!r}")


@dataclass(frozen=True)
class Precision:
    """Precision of the inputs of each trailing-update stage (accumulation is always fp32).

    gram: V^T V inside the panel kernel (and an aggregate's G); project: W = (V T)^T C; update: C -= V W. project
    and update may also be "tf32x3" (PRODUCT_PRECISIONS); an update in tf32x3 also runs the aggregates' merge
    products in it ((VT)^T, and G where gram is fp32). An fp32 G of few matrices runs in tf32x3 too, its rows of V
    split over more blocks (runtime.gram_splits).
    """

    gram: str = "fp32"
    project: str = "fp32"
    update: str = "fp32"

    def __post_init__(self):
        for stage in STAGES:
            allowed = PRECISIONS if stage == "gram" else PRODUCT_PRECISIONS
            if getattr(self, stage) not in allowed:
                raise ValueError(f"Precision.{stage} must be one of {allowed}, got {getattr(self, stage)!r}")


@dataclass(frozen=True)
class PanelResources:
    rows: int  # rows of the panel (m - first column)
    slots: int  # rows each thread holds
    registers: int  # estimate of registers per thread
    register_cap: int
    shared_bytes: int


@dataclass(frozen=True)
class Schedule:
    m: int
    n: int
    panels: tuple[Panel, ...]
    precision: Precision = field(default_factory=Precision)
    # Columns per aggregate: 0, every panel updates all the columns right of it; A > 0, a panel updates the columns
    # of its aggregate (A columns from a multiple of A) and each aggregate's compact WY form, merged from its
    # panels', updates the rest at once (rank-A updates instead of rank-width ones).
    aggregate: int = 0
    # How each panel's own two products (W = (V T)^T C, C -= V W) run: "cublas", strided-batched GEMMs at the
    # precisions above; "split", generated fp32 kernels that also split the rows over blocks (templates/cuda/
    # split.cu.j2), for small batches whose GEMMs would leave most SMs idle; "fused", one generated fp32 kernel for
    # both (templates/cuda/fused.cu.j2: W stays in shared memory, a block per 32 columns of C per matrix), for
    # batches that fill the GPU by themselves. The aggregates' products use cuBLAS or the tf32x3 kernels.
    panel_update: str = "cublas"
    # With aggregates, L > 0: each aggregate's update of the columns past the next aggregate runs on a second stream
    # while the next aggregate's panels factor (their chain on a high-priority stream; the next aggregate's own
    # columns are updated first), in pieces of about L waves of 128 x 128 tiles (runtime.side_pieces; a large L:
    # one piece), so that its GEMMs fill the SMs the panels leave idle. 0: off.
    lookahead: int = 0
    # With lookahead: each panel's own products reach through the next aggregate's columns too, so that nothing of
    # an aggregate's merge (G, T, (VT)^T) or of its products (the columns past the next aggregate) is left on the
    # panels' chain: all of it runs on the side lane (runtime.drive; codegen.aggregates' c1).
    reach: bool = False

    def __post_init__(self):
        object.__setattr__(self, "panels", tuple(self.panels))
        k = min(self.m, self.n)
        widths = [p.width for p in self.panels]
        if sum(widths) != k:
            raise ValueError(f"Schedule.panels widths {widths} sum to {sum(widths)}, must sum to min(m, n) = {k}")
        if not isinstance(self.aggregate, int) or self.aggregate < 0 or self.aggregate > MAX_AGGREGATE:
            raise ValueError(f"Schedule.aggregate must be 0 (off) or a column count up to {MAX_AGGREGATE}, "
                             f"got {self.aggregate!r}")
        if self.panel_update not in PANEL_UPDATES:
            raise ValueError(f"Schedule.panel_update must be one of {PANEL_UPDATES}, got {self.panel_update!r}")
        if self.panel_update in ("split", "fused") and max(widths) > 32:
            raise ValueError(f"Schedule.panel_update {self.panel_update!r} takes panels of at most 32 columns; got "
                             f"widths up to {max(widths)}")
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or self.lookahead < 0:
            raise ValueError(f"Schedule.lookahead must be 0 (off) or the waves per side-stream piece (> 0), got "
                             f"{self.lookahead!r}")
        if self.lookahead and not self.aggregate:
            raise ValueError("Schedule.lookahead needs aggregates (Schedule.aggregate > 0): it overlaps an "
                             "aggregate's update with the next aggregate's panels")
        if not isinstance(self.reach, bool):
            raise ValueError(f"Schedule.reach must be True or False, got {self.reach!r}")
        if self.reach and not self.lookahead:
            raise ValueError("Schedule.reach needs lookahead (Schedule.lookahead > 0): it moves an aggregate's merge "
                             "and products to the side lane")
        if any(p.variant == "whole" for p in self.panels):
            if len(self.panels) != 1:
                raise ValueError("a Panel of variant 'whole' factors the whole matrix: it must be the schedule's "
                                 f"only panel (width min(m, n) = {k}); got {len(self.panels)} panels")
            if self.precision != Precision() or self.aggregate or self.panel_update != "cublas":
                raise ValueError("a schedule of variant 'whole' updates in fp32 inside its kernel: it takes fp32 "
                                 "precisions, no aggregates and panel_update 'cublas' (the defaults)")
        if self.aggregate:
            starts = set(self.starts())
            cut = next((c for c in range(self.aggregate, k, self.aggregate) if c not in starts), None)
            if cut is not None:
                raise ValueError(f"Schedule.aggregate {self.aggregate}: column {cut} starts an aggregate but no "
                                 f"panel; panels must not straddle aggregates (panel starts: {sorted(starts)})")
        for index, panel in enumerate(self.panels):
            res = self.resources(index)
            if res.registers > res.register_cap:
                raise ValueError(
                    f"Schedule.panels[{index}] ({panel.variant}, width {panel.width}, threads {panel.threads}, "
                    f"blocks {panel.blocks}) needs about {res.registers} registers per thread for its "
                    f"{res.rows} rows; the cap is {res.register_cap}: use more threads or blocks, or a narrower panel")
            if res.shared_bytes > MAX_SMEM:
                raise ValueError(
                    f"Schedule.panels[{index}] needs {res.shared_bytes} bytes of shared memory; "
                    f"the budget is {MAX_SMEM}")

    def starts(self) -> list[int]:
        """First column (and row) of each panel."""
        out, c = [], 0
        for p in self.panels:
            out.append(c)
            c += p.width
        return out

    def resources(self, index: int) -> PanelResources:
        panel = self.panels[index]
        rows = self.m - self.starts()[index]
        slots, regs, cap = _registers(panel, rows)
        warps = panel.threads // 32
        if panel.variant == "cols":
            from .codegen import cols_shared_bytes

            smem = cols_shared_bytes(panel.width, slots, self.starts()[index] + panel.width < self.n)
        elif panel.variant == "lanes":
            smem = 4 * (2 * warps * 32 + 64 + 2 * panel.width * (panel.width + 1) + panel.width
                        + (64 * (panel.blocks + 1) + 4 if panel.cluster else 1))
        elif panel.variant == "whole":
            smem = (whole_shared_bytes(self.m, self.n, panel.threads, panel.slice)
                    + rows_shared_bytes(warps, panel.slice))
        elif panel.variant == "tsqr":  # tsqr.cuh.j2's Shared: the rows panel's, five NB x PITCH blocks, 2 NB
            smem = 4 * (warps * 32 + 2 * panel.width * panel.width + 5 * panel.width + 96
                        + 5 * panel.width * ((panel.width + 3) // 4 * 4 + 4) + 2 * panel.width)
        else:
            cluster_words = 64 * (panel.blocks + 1) + 4 if panel.cluster else 0  # receive buffers, mbarriers
            smem = rows_shared_bytes(warps, panel.width) + 4 * cluster_words
        return PanelResources(rows, slots, regs, cap, smem)

    @property
    def scaled(self) -> bool:
        """Each matrix is scaled by a power of two before it is factored and R by the inverse after
        (templates/cuda/scale.cu.j2): where a product takes fp16 inputs (6e-8 ... 65504) that see the trailing
        columns, whose scale is the matrix's. Gram's inputs (V, entries at most 1 in magnitude) need none."""
        return "fp16" in (self.precision.project, self.precision.update)

    def panel_gram(self, index: int) -> str:
        """Input precision of panel `index`'s own G = V^T V: lanes panels form G exactly (fp32) from the dots
        they compute anyway; the others round as precision.gram says (which also applies to the aggregates)."""
        return "fp32" if self.panels[index].variant in ("lanes", "tsqr") else self.precision.gram

    def to_json(self) -> dict:
        data = {"m": self.m, "n": self.n,
                "panels": [_panel_json(p) for p in self.panels],
                "precision": asdict(self.precision)}
        if self.aggregate:
            data["aggregate"] = self.aggregate
        if self.panel_update != "cublas":
            data["panel_update"] = self.panel_update
        if self.lookahead:
            data["lookahead"] = self.lookahead
        if self.reach:
            data["reach"] = True
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Schedule":
        try:
            panels = tuple(Panel(**p) for p in data["panels"])
            return cls(m=data["m"], n=data["n"], panels=panels, precision=Precision(**data.get("precision", {})),
                       aggregate=data.get("aggregate", 0), panel_update=data.get("panel_update", "cublas"),
                       lookahead=data.get("lookahead", 0), reach=data.get("reach", False))
        except KeyError as exc:
            raise ValueError(f"schedule JSON lacks the field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"schedule JSON has an unknown or missing field: {exc}") from None

    def describe(self) -> str:
        groups: list[list] = []
        for p in self.panels:
            key = (p.width, p.variant, p.threads, p.blocks, p.slice, p.cluster, p.loop, p.tile)
            if groups and groups[-1][0] == key:
                groups[-1][1] += 1
            else:
                groups.append([key, 1])
        parts = []
        for (w, v, t, b, s, c, loop, tile), count in groups:
            if v == "cols":
                extra = f" slice {s}"
            elif v == "whole":
                extra = f", panels of {s} columns"
            else:
                extra = f" x{b} blocks" + (" (cluster)" if c else "") if b > 1 else ""
            extra += f", tiles of {tile} rows" if v == "tsqr" else ""
            extra += ", column loop" if loop else ""
            parts.append(f"{count}x{w} {v}({t} threads{extra})")
        prec = self.precision
        text = " + ".join(parts) + f"; precision gram={prec.gram} project={prec.project} update={prec.update}"
        text += f"; aggregates of {self.aggregate} columns" if self.aggregate else ""
        text += f" (lookahead, pieces of {self.lookahead} waves)" if self.lookahead else ""
        text += "; panel products reach through the next aggregate (merges on the side lane)" if self.reach else ""
        return text + {"split": "; panel products split over blocks", "fused": "; panel products fused (one launch)"
                       }.get(self.panel_update, "")


def rows_shared_bytes(warps: int, width: int) -> int:
    """panel_rows.cuh.j2's Shared, in bytes: red, tot, piv and the coefficients cf by parity, G and T (rows padded),
    tau, one block's receive buffer and the mbarriers (a cluster's receive buffers aside)."""
    return 4 * (warps * 32 + 2 * width * width + 5 * width + 166)


def whole_shared_bytes(m: int, n: int, threads: int, slice_: int) -> int:
    """A "whole" kernel's dynamic shared memory (templates/cuda/whole.cuh.j2's layout): the matrix (rows n | 1
    floats apart, rounded to 16 bytes), V (m rows of slice + 4), W's partial sums (threads x slice) and W'
    (slice x n)."""
    return 4 * ((m * (n | 1) + 3) // 4 * 4 + m * (slice_ + 4) + threads * slice_ + slice_ * n)


def _panel_json(p: Panel) -> dict:
    data = asdict(p)
    if p.variant not in ("cols", "whole"):
        data.pop("slice")
    if not p.cluster:
        data.pop("cluster")
    if not p.loop:
        data.pop("loop")
    if p.variant != "tsqr":
        data.pop("tile")
    return data


# ---------------------------------------------------------------------------------------------------------------
# Files


def schedule_path(problem: Problem, target: Target, root: Path | None = None) -> Path:
    return Path(root or SCHEDULE_DIR) / target.arch / f"{problem.m}x{problem.n}_b{problem.batch}.json"


def save(schedule: Schedule, problem: Problem, target: Target, provenance: dict | None = None,
         root: Path | None = None) -> Path:
    path = schedule_path(problem, target, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = schedule.to_json()
    data["batch"] = problem.batch
    data["arch"] = target.arch
    data["provenance"] = provenance or {}
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def load(path: Path) -> tuple[Schedule, dict]:
    data = json.loads(Path(path).read_text())
    return Schedule.from_json(data), data.get("provenance", {})


PRECISION_CHOICES = (None, "fp32")


def check_precision(precision) -> None:
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be None (the schedule's own: tuned and default schedules may give the "
                         f"trailing update's products tf32 inputs where that passes the accuracy gates) or 'fp32' "
                         f"(every product from fp32 inputs); got {precision!r}")


def find(problem: Problem, target: Target, root: Path | None = None,
         precision: str | None = None) -> tuple[Schedule, str]:
    """The tuned schedule for this problem if a file exists, else the default. Returns (schedule, origin).
    precision="fp32": the same schedule with every stage in fp32 (a lookahead then in pieces, as default_lookahead
    takes it for fp32 products)."""
    check_precision(precision)
    path = schedule_path(problem, target, root)
    if path.exists():
        schedule, _ = load(path)
        if (schedule.m, schedule.n) != (problem.m, problem.n):
            raise ValueError(f"{path} is for {schedule.m}x{schedule.n}, not {problem.m}x{problem.n}")
        origin = str(path)
    else:
        schedule, origin = default_schedule(problem, target), "default (heuristic)"
    if precision == "fp32" and schedule.precision != Precision():
        lookahead = LOOKAHEAD_PIECES if schedule.lookahead else 0
        schedule = replace(schedule, precision=Precision(), lookahead=lookahead)
        origin = f"{origin}, every stage in fp32"
    return schedule, origin


# ---------------------------------------------------------------------------------------------------------------
# Default schedule: a simple heuristic over the resource model, used where no tuned file exists.


def _panel_for(rows: int, width: int) -> Panel | None:
    """The cheapest one-block kernel that holds `rows` x `width` in registers, or None: up to ONE_WARP_ROWS rows
    a lanes panel on one warp at any batch (lanes_panel: 20,000 x 32² 388 -> 130 µs against warp panels)."""
    if rows <= ONE_WARP_ROWS and width <= 32:
        return Panel(width, "lanes", 32)
    if rows <= 32 * 4:
        warp = Panel(width, "warp", 32)
        if _fits(rows, warp):
            return warp
    for threads in THREADS[1:]:
        # Aim for at most four rows per thread: fewer threads means shorter reductions.
        if math.ceil(rows / threads) > 4 and threads < 512:
            continue
        panel = Panel(width, "rows", threads)
        if _fits(rows, panel):
            return panel
    return None


def _multi_block_panel(rows: int, width: int) -> Panel:
    """Blocks exchanging partial sums through global memory: only for panels no block can hold
    (measured on the H200: the flag exchange costs far more per column than a narrower one-block panel)."""
    for blocks in range(2, 1 << 20):
        panel = Panel(width, "rows", 512, blocks)
        if _fits(rows, panel):
            return panel
    raise ValueError(f"no panel kernel fits {rows} rows")  # pragma: no cover


def cluster_panel(rows: int, width: int, blocks: int, slots: int = CLUSTER_SLOTS) -> Panel | None:
    """A rows panel over a cluster of `blocks` blocks (blocks=1: on one block, no cluster): the fewest threads per
    block that hold `rows` x `width` with at most `slots` rows per thread (more where registers demand), or None.
    Fewer rows per thread shorten the chain of dependent instructions that each column costs a thread."""
    for threads in THREADS[1:]:
        if math.ceil(math.ceil(rows / blocks) / threads) > slots and threads < 1024:
            continue
        panel = Panel(width, "rows", threads, blocks, cluster=blocks > 1)
        if _fits(rows, panel):
            return panel
    return None


CLUSTER_LANE_SLOTS = 16  # rows per warp of the default's lanes panels on clusters (cluster_lanes_panel)


def cluster_lanes_panel(rows: int, width: int, blocks: int, slots: int = CLUSTER_LANE_SLOTS) -> Panel | None:
    """The default's panel on a cluster of `blocks` blocks: lanes panels of about `slots` rows per warp where they
    fit, else rows panels (cluster_panel). Measured on the H200 against rows panels on the same clusters
    (BENCHMARKS.md, eighth session; graph replay): 1 x 2048² 4,104 -> 3,602 µs, 1 x 4096x1024 3,125 -> 2,963,
    1 x 4096² 12,779 -> 12,412, 2 x 4096² 14,115 -> 11,224; 32 rows per warp was slower at each."""
    return lanes_panel(rows, width, slots, blocks) or cluster_panel(rows, width, blocks)


def lanes_panel(rows: int, width: int, slots: int | str = "auto", blocks: int = 1) -> Panel | None:
    """A lanes panel for `rows` x `width` with about `slots` rows per warp (more warps where registers demand),
    or None where even 32 warps cannot hold the rows. "auto": one warp up to 32 rows (its loop over columns
    unrolled), 8 rows per warp up to 256 rows, else 16 (the better of those measured at 176 and 352 rows). Measured
    on the H200 (BENCHMARKS.md, eighteenth session; graph replay): one warp against 8 rows per warp at 20 x 32²
    17.8 -> 11.3 µs, 20,000 x 32² 629 -> 130, 1,000 x 16² 16.4 -> 8.6; at 64 rows one warp lost (40 x 64x32: 23.1 ->
    38.9). blocks > 1: the rows shared by a cluster of that many blocks."""
    if slots == "auto":
        slots = rows if rows <= ONE_WARP_ROWS and blocks == 1 else 8 if rows <= 256 else 16
    for warps in range(min(32, max(1, math.ceil(rows / (blocks * slots)))), 33):
        panel = Panel(width, "lanes", 32 * warps, blocks, cluster=blocks > 1)
        if _fits(rows, panel):
            return panel
    return None


def _registers(panel: Panel, rows: int) -> tuple[int, int, int]:
    """(rows each thread holds, estimated registers per thread, the cap __launch_bounds__(threads, 1) allows)."""
    cap = min(MAX_REGS_PER_THREAD, (REGS_PER_SM // panel.threads) // 8 * 8)
    if panel.variant == "cols":
        slots = math.ceil(rows / 32)
        return slots, slots * (panel.slice + 1) + panel.slice + REG_OVERHEAD["cols"], cap
    if panel.variant == "tsqr":  # the tile in registers, and a row of V and of Q beside it (products, final)
        slots = panel.tile // panel.threads
        return slots, slots * panel.width + 3 * panel.width + REG_OVERHEAD["tsqr"], cap
    if panel.variant == "whole":  # a panel's rows in registers; in the updates a column of W (acc) and a row of V
        slots = math.ceil(rows / panel.threads)
        return slots, max(slots * panel.slice + panel.slice, 3 * panel.slice) + REG_OVERHEAD["whole"], cap
    if panel.variant == "lanes":
        slots = math.ceil(rows / (panel.blocks * panel.threads // 32))
        # the column's entries, the broadcast column j (the product (V T)^T: a third array)
        return slots, 3 * slots + REG_OVERHEAD["lanes"], cap
    slots = math.ceil(math.ceil(rows / panel.blocks) / panel.threads)
    return slots, slots * panel.width + panel.width + REG_OVERHEAD[panel.variant], cap


def _fits(rows: int, panel: Panel) -> bool:
    _, regs, cap = _registers(panel, rows)
    return regs <= cap


def default_precision(problem: Problem, aggregate: int = 0, panel_update: str = "cublas") -> Precision:
    """fp32 everywhere, except the aggregates' products (long sums over many columns) in tf32 from TF32_FROM
    columns where the panels' own products stay fp32 (split or fused). Measured on the H200 over a mixed batch of every
    stress family (BENCHMARKS.md, 2026-11-30): worst factor 4.66 at 8 x 2048² and 2.29 at 2 x 4096² (gate 20,
    tuning margin 10); graph replay 11.07 -> 9.62 ms and 25.8 -> 21.9 ms. Other aggregates' products in tf32x3
    (fp32-class: three tf32 products over high parts and remainders): 60 x 1024² graph replay 5,594 -> 4,900 us,
    640 x 512² 7,858 -> 7,528 (BENCHMARKS.md, twelfth session)."""
    if aggregate and panel_update in ("split", "fused") and problem.k >= TF32_FROM:
        return Precision(project="tf32", update="tf32")
    if aggregate:
        return Precision(project="tf32x3", update="tf32x3")
    return Precision()


def with_loop(panel: Panel, loop: bool) -> Panel:
    """`panel` with Panel.loop set where its variant has the choice."""
    return replace(panel, loop=loop) if panel.variant in LOOP_VARIANTS else panel


def one_warp_tail(schedule: "Schedule") -> "Schedule":
    """`schedule` with every panel of at most ONE_WARP_ROWS rows (and 32 columns) on a lanes panel of one warp, the
    kernel the default gives such a panel (_panel_for): a schedule tuned before that kernel existed may hold such a
    panel on several warps or a cluster."""
    panels, col = [], 0
    for p in schedule.panels:
        rows = schedule.m - col
        one = rows <= ONE_WARP_ROWS and p.width <= 32 and p.variant != "tsqr"
        panels.append(Panel(p.width, "lanes", 32) if one else p)
        col += p.width
    return replace(schedule, panels=tuple(panels))


def with_cluster(schedule: "Schedule", blocks: int, min_rows: int = 0,
                 slots: int = CLUSTER_LANE_SLOTS, every: bool = False) -> "Schedule":
    """`schedule` with every cluster panel (every=True: also every lanes or rows panel on one block) of at least
    `min_rows` rows on clusters of `blocks` blocks instead (a lanes panel of about `slots` rows per warp where it
    fits, else a rows panel: cluster_lanes_panel); panels that fit neither, and the others, stay as they are."""
    panels, col = [], 0
    for p in schedule.panels:
        rows = schedule.m - col
        chosen = p.cluster or (every and p.blocks == 1 and p.variant in ("lanes", "rows"))
        q = cluster_lanes_panel(rows, p.width, blocks, slots) if chosen and rows >= min_rows else None
        panels.append(with_loop(q, p.loop) if q is not None else p)
        col += p.width
    return replace(schedule, panels=tuple(panels))


def default_panel(rows: int, remaining: int, widths=(32, 16, 8)) -> Panel:
    """The heuristic's panel for `rows` rows with `remaining` columns left: the widest of `widths` that one block
    holds, else several blocks (8 columns wide)."""
    for width in widths:
        panel = _panel_for(rows, min(width, remaining))
        if panel is not None:
            return panel
    return _multi_block_panel(rows, min(8, remaining))


# Measured on the H200 (BENCHMARKS.md, 2026-11-30, CUDA-graph replay): lanes panels beat the warp/rows ones
# where the batch leaves SMs free (40 x 176²: 342 against 593 µs; 40 x 352²: 1,001 against 1,241; 20 x 32²: 17.7
# against 23.1) and lose where it does not (640 x 512²: 12.3 against 11.4 ms). Aggregates of 128 columns pay from
# about 1024 columns on when several matrices share the work or the panels are only 8 wide (2 x 4096²: 44.8
# against 59.7 ms; 8 x 2048²: 14.6 against 16.8; 1 x 4096x1024: 7.0 against 8.9) and cost where one matrix has
# 16-wide panels (1 x 2048²: 9.1 against 6.8 ms) or the matrix is small (40 x 352²: 1.86 against 1.36 ms).
# The split panel products (scripts/skinny_bench.py, H200): 5.9x faster than cuBLAS for 2 matrices of 4096 rows
# with 8-wide panels, 2.4x for 8 of 2048 rows, slower from about 60 matrices on and even at one (cuBLAS splits K
# itself there). The default for 2 to 8 aggregated matrices until the fused kernel split its rows over clusters
# (fifteenth session: faster at 2 x 1024², 4 and 8 x 2048², 2 x 4096²; default_panel_update); the tuner keeps it.
LANES_MAX_BATCH = 264  # two blocks per SM of the H200's 132 (lanes panels on one warp whatever the batch)
ONE_WARP_ROWS = 32  # the most rows of the default's lanes panels on one warp (lanes_panel)
DEFAULT_AGGREGATE = 128
AGGREGATE_FROM = 1024  # min(m, n) from which the heuristic aggregates
DEFAULT_CLUSTER = MAX_CLUSTER
CLUSTER_FROM = 512  # rows from which the default's panels run on clusters (default_cluster) ...
# ... except a one-panel matrix (n <= 32), below this many rows or in a batch: its one block keeps qr's fused Q kernel
# (codegen.fused_q_kernel, one launch), and clusters there have not been measured
ONE_PANEL_CLUSTER_FROM = 2048
TF32_FROM = 2048  # min(m, n) from which aggregates' products are tf32 by default (default_precision)


# Many matrices of 384 to 512 rows: the tuned 640 x 512² file's recipe, 16-wide rows panels (warp panels below
# 129 rows) with column loops, aggregates of 64 in tf32x3 with lookahead 2. Measured on the H200 against the former
# default (BENCHMARKS.md, twenty-third session; graph replay, µs, same run): 256 x 512² 3,782 -> 2,788 (its lanes
# panels without aggregates), 64 x 512² 1,488 -> 1,260, 300 x 384² 2,103 -> 1,867 (its 32-wide looped rows panels),
# 100 x 448² 1,271 -> 1,205, 100 x 512x1024 3,294 -> 2,382; 80 x 400² 969 -> 989 (+2%).
MANY_FROM = 64
MANY_ROWS = (384, 512)  # min(m, n) from the first, m up to the second
MANY_WIDTH = 16
MANY_AGGREGATE = 64


def default_many(problem: Problem) -> bool:
    """Whether the problem takes the default for many matrices of 384 to 512 rows (MANY_FROM, MANY_ROWS)."""
    return problem.batch >= MANY_FROM and problem.k >= MANY_ROWS[0] and problem.m <= MANY_ROWS[1]


def default_aggregate(problem: Problem) -> int:
    if default_many(problem):
        return MANY_AGGREGATE
    if problem.k < AGGREGATE_FROM:
        return 0
    if problem.batch >= 2 or default_panel(problem.m, problem.k).width < 16:
        return DEFAULT_AGGREGATE
    return 0


FUSED_MAX_ROWS = 4096  # rows up to which the panels' own products default to the fused kernel ...
FUSED_MAX_SINGLE = 4096 * 1024  # ... except one matrix of more elements than this (cuBLAS there)


def default_panel_update(problem: Problem) -> str:
    """"fused" (its launches split the rows over clusters where the 32-column blocks leave SMs idle) up to
    FUSED_MAX_ROWS rows, else cuBLAS. Measured on the H200 against cuBLAS's pair and the split kernels (graph
    replay, default or committed schedules, same run; BENCHMARKS.md, fifteenth session): 1 x 1000² 2,384 -> 2,283
    us, 3 x 1000² 2,682 -> 2,453, 2 x 512² 965 -> 878, 1 x 2048² 3,600 -> 3,320, 1 x 4096x1024 2,973 -> 2,890,
    16 x 2048² 13,700 -> 12,325; against split: 2 x 1024² 3,027 -> 2,882, 4 x 2048² 6,820 -> 6,428, 8 x 2048²
    5,330 -> 4,933, 2 x 4096² 11,258 -> 10,645 (fourteenth session, one block per 32 columns, from 4 matrices of up
    to 1,024 rows: 60 x 1024² 4,695 -> 4,384, 40 x 176² 207 -> 192). Slower: 1 x 4096² (9,546 -> 9,676, hence
    FUSED_MAX_SINGLE), 1 x 8192x512 (1,617 -> 1,705) and tsqr's 1 x 40000x256 (1,885 -> 2,900)."""
    if problem.m > FUSED_MAX_ROWS or (problem.batch == 1 and problem.m * problem.n > FUSED_MAX_SINGLE):
        return "cublas"
    return "fused"


# Several matrices: clusters of 256 to 512 rows a block (16 to 32 warps of 16 rows, as the tuned 8 x 2048² and
# 2 x 4096² files have them), the most blocks such that the batch's clusters take at most CLUSTER_BLOCKS_MAX blocks
# (past 64 the clusters of 16 no longer all run at once, and more blocks leave the side lane's GEMMs fewer SMs).
# Measured on the H200 against the former default's one-block panels (BENCHMARKS.md, twenty-second session; graph
# replay, µs): 2 x 2048² 5,358 -> 3,264, 4 x 2048² 5,882 -> 3,637, 16 x 2048² 8,325 -> 6,713 (8 blocks; 4:
# 6,465), 3 x 4096² 17,159 -> 9,791, 4 x 4096² 18,618 -> 10,902 (16 blocks; 8: 11,661), 8 x 4096² 21,854 ->
# 19,710 (16 blocks; 8: 15,881), 2 x 4096x1024 5,680 -> 3,408; the tuned 8 x 2048² with 4, 8 and 16 blocks
# 5,264, 4,415 and 4,862; from 1024 rows: 2 x 1024² 2,406 -> 1,619, 4 x 1024² 2,452 -> 1,659, 8 x 1024² 2,927 ->
# 1,968, 16 x 1024² 3,312 -> 2,307, 32 x 1024² 4,022 -> 3,224 (2 blocks), 2 x 1536² 3,896 -> 2,844; from 512 rows
# (and without aggregates): 4 x 512² 890 -> 677, 16 x 512² 980 -> 785, 32 x 512² 1,196 -> 935, 8 x 768² 1,755 ->
# 1,368, 4 x 4096x512 2,949 -> 1,366.
CLUSTER_ROWS_PER_BLOCK = (256, 512)
CLUSTER_BLOCKS_MAX = 64


def default_cluster(problem: Problem) -> int:
    """Blocks per cluster of the default's panels (0: none). One matrix leaves all but a few SMs idle; a
    cluster of 8 blocks per panel (no aggregates) measured on the H200, graph replay: 1 x 8192x512 4.54 -> 2.18 ms,
    1 x 4096x1024 5.87 -> 3.99, 1 x 2048² 6.82 -> 6.40 (BENCHMARKS.md, 2026-11-30); clusters of 16 against 8 on
    the committed (tuned) schedules: 1 x 4096² 9,260 -> 8,045 µs, 1 x 4096x1024 2,885 -> 2,268, 1 x 8192x512 1,621
    -> 1,297, 1 x 2048² 3,316 -> 3,160 (twentieth session); from 512 rows (CLUSTER_FROM, 2048 before), against
    one-block panels: 1 x 512² 879 -> 559 µs, 1 x 768² 1,535 -> 878, 1 x 1024² 2,321 -> 1,231 (twenty-second
    session). Where the rows are too many for a cluster's registers, the default's multi-block panels. Several
    matrices: see CLUSTER_BLOCKS_MAX."""
    if problem.m < CLUSTER_FROM:
        return 0
    if problem.n <= 32 and not (problem.batch == 1 and problem.m >= ONE_PANEL_CLUSTER_FROM):
        return 0
    if problem.batch == 1:
        return DEFAULT_CLUSTER
    most_rows, fewest_rows = CLUSTER_ROWS_PER_BLOCK[1], CLUSTER_ROWS_PER_BLOCK[0]
    fewest = max(2, 1 << (math.ceil(problem.m / most_rows) - 1).bit_length())  # power of two >= m / 512
    blocks = min(MAX_CLUSTER, 1 << (problem.m // fewest_rows).bit_length() - 1)  # power of two <= m / 256
    while blocks >= fewest and problem.batch * blocks > CLUSTER_BLOCKS_MAX:
        blocks //= 2
    return blocks if blocks >= fewest else 0


@dataclass(frozen=True)
class DefaultChoices:
    """What the heuristic picks beside the panels (default_schedule; tune.default_params states the same point)."""
    cluster: int
    aggregate: int
    panel_update: str
    precision: Precision
    loop: bool  # Panel.loop for the warp and rows panels
    lookahead: int  # Schedule.lookahead
    reach: bool = False  # Schedule.reach


# tsqr panels (TSQR_PANEL, where a panel has two tiles of rows or more) for up to TSQR_MAX_BATCH matrices of
# TSQR_FROM rows or more and at least TSQR_ASPECT rows a column, with aggregates of TSQR_AGGREGATE from twice that
# many columns. Measured on the H200 against
# the multi-block rows panels the heuristic gives there (BENCHMARKS.md, thirteenth session; graph replay): 1 x
# 100000x32 386 -> 290 us, 1 x 40000x256 2,952 -> 2,082 (aggregates of 64; none 2,357 at 128 threads); at 8,192 rows
# and below they were slower (1 x 8192x512 1,618 -> 2,779 against rows clusters).
TSQR_FROM = 32768
TSQR_ASPECT = 64
TSQR_MAX_BATCH = 4
TSQR_PANEL = {"width": 16, "threads": 256, "tile": 512, "loop": True}
TSQR_AGGREGATE = 64


def default_tsqr(problem: Problem) -> bool:
    """Whether the heuristic gives `problem` tsqr panels."""
    return problem.batch <= TSQR_MAX_BATCH and problem.m >= max(TSQR_FROM, TSQR_ASPECT * problem.n)


def tsqr_panel(rows: int, remaining: int, width: int = TSQR_PANEL["width"], threads: int = TSQR_PANEL["threads"],
               tile: int = TSQR_PANEL["tile"]) -> Panel | None:
    """A tsqr panel of at most `width` of the `remaining` columns, or None where `rows` are under two tiles."""
    return Panel(min(width, remaining), "tsqr", threads, tile=tile) if rows >= 2 * tile else None


def default_choices(problem: Problem, clustered: bool = True) -> DefaultChoices:
    """clustered=False: the heuristic as it would be without clusters."""
    if default_tsqr(problem):
        aggregate = TSQR_AGGREGATE if problem.k >= 2 * TSQR_AGGREGATE else 0
        return DefaultChoices(0, aggregate, "cublas", Precision(), TSQR_PANEL["loop"], 0)
    cluster = default_cluster(problem) if clustered and not default_many(problem) else 0
    aggregate = 0 if cluster and problem.batch == 1 else default_aggregate(problem)
    update = default_panel_update(problem)
    precision = default_precision(problem, aggregate, update)
    lookahead = default_lookahead(problem, aggregate, precision)
    return DefaultChoices(cluster, aggregate, update, precision, default_loop(problem) or default_many(problem),
                          lookahead, default_reach(problem, lookahead))


def default_loop(problem: Problem) -> bool:
    """Column loops (Panel.loop) for the warp and rows panels where more matrices than LANES_MAX_BATCH share the
    SMs: blocks at different columns then compete for the instruction cache. Measured on the H200 (BENCHMARKS.md,
    fifth session, `qrgen bench --profile`): 640 x 512² panel kernels 5.76 -> 4.06 ms; with fewer matrices a loss
    or a small gain (8-block clusters 2.75 -> 2.89 µs per column, 8 x 2048² 5.12 -> 6.09 ms; 60 x 1024² 3.35 ->
    3.19, which its tuned schedule takes)."""
    return problem.batch > LANES_MAX_BATCH


LOOKAHEAD_PIECES = 2  # default Schedule.lookahead where the side GEMMs are fp32
LOOKAHEAD_WHOLE = 32  # ... and where they run on tensor cores (one piece at every shape measured)


def default_lookahead(problem: Problem, aggregate: int, precision: Precision) -> int:
    """Lookahead for aggregated batches of 2 or more. Measured on the H200 against the same schedules without it
    (BENCHMARKS.md, eighth session; graph replay, eager in brackets): 60 x 1024² (fp32 products) 6,055 -> 5,625 µs
    (6,288 -> 5,718) in pieces of 2 waves, 5,877 (5,660) in one piece; 8 x 2048² (tf32) 5,540 -> 5,355 in one
    piece, 5,490 in pieces of 2 waves; 2 x 4096² (fp16/bf16) 14,430 -> 14,240 in one piece, 14,417 in pieces;
    1 x 40000x256 unchanged (within 1%), so single matrices keep it off."""
    if not aggregate or problem.batch < 2:
        return 0
    return LOOKAHEAD_PIECES if precision.update in ("fp32", "tf32x3") else LOOKAHEAD_WHOLE


REACH_MAX_BATCH = 4  # Schedule.reach by default for lookahead schedules of at most this many matrices


def default_reach(problem: Problem, lookahead: int) -> bool:
    """Schedule.reach for lookahead schedules of few matrices, whose panels and their own products leave most SMs
    to the side lane. Measured on the H200 against the same schedules without it (BENCHMARKS.md, twenty-first
    session; graph replay): committed 2 x 4096² 9,367 -> 8,773 µs, 1 x 4096² 7,981 -> 7,479; default 2 x 1024²
    2,755 -> 2,375, 2 x 2048² 5,720 -> 5,375, 4 x 2048² 6,075 -> 5,884, 3 x 4096² 16,958 -> 17,171 (+1%); slower
    with more matrices (their panels' products, through the next aggregate, take more of the SMs): committed
    8 x 2048² 4,570 -> 4,715, 60 x 1024² 4,270 -> 4,575, 640 x 512² 6,902 -> 7,308, 1 x 40000x256 (tsqr) 1,884 ->
    1,955."""
    return bool(lookahead) and problem.batch <= REACH_MAX_BATCH


# Many small matrices: the whole factorization in one kernel per matrix (Panel variant "whole"), the matrix in shared
# memory. Measured on the H200 against the default it replaces (BENCHMARKS.md, twenty-fourth session; graph replay,
# µs, same run): 4000 x 48² 315 -> 144 (32 threads, panels of 4), 2000 x 64x32 73 -> 47 (32, 4), 2000 x 64² 200 ->
# 182 (64 threads, panels of 8); fewer matrices lose (500 x 64² 70 -> 87, 100 x 48² 41 -> 56), and so do 80 rows and
# more (1000 x 80² 219 -> 217, 1000 x 96² 244 -> 291, 40 x 176² 187 -> 271) and 32 rows (20,000 x 32² 102 -> 209).
WHOLE_FROM = 1000  # matrices at least
WHOLE_ROWS = (33, 64)  # m from the first to the second, 32 <= n <= m
WHOLE_SMALL = 48 * 48  # up to this many entries: 32 threads and panels of 4; above, 64 threads and panels of 8


def default_whole(problem: Problem) -> Panel | None:
    """The default's "whole" panel for the problem (WHOLE_FROM, WHOLE_ROWS), or None where it takes panels."""
    m, n = problem.m, problem.n
    if problem.batch < WHOLE_FROM or not WHOLE_ROWS[0] <= m <= WHOLE_ROWS[1] or not 32 <= n <= m:
        return None
    threads, slice_ = (32, 4) if m * n <= WHOLE_SMALL else (64, 8)
    return Panel(problem.k, "whole", threads, slice=slice_)


def default_schedule(problem: Problem, target: Target | None = None) -> Schedule:
    whole = default_whole(problem)
    if whole is not None:
        return Schedule(problem.m, problem.n, (whole,))
    choices = default_choices(problem)
    cluster, aggregate = choices.cluster, choices.aggregate
    many = default_many(problem)
    lanes = problem.batch <= LANES_MAX_BATCH and not cluster and not many
    panels: list[Panel] = []
    col = 0
    while col < problem.k:
        end = problem.k if not aggregate else min(problem.k, (col // aggregate + 1) * aggregate)
        rows = problem.m - col
        panel = tsqr_panel(rows, end - col) if default_tsqr(problem) else None
        panel = panel or (cluster_lanes_panel(rows, min(32, end - col), cluster) if cluster else None)
        panel = panel or (lanes_panel(rows, min(32, end - col), "auto") if lanes else None)
        panel = panel or default_panel(rows, end - col, (MANY_WIDTH,) if many else (32, 16, 8))
        panels.append(with_loop(panel, choices.loop))
        col += panel.width
    return Schedule(problem.m, problem.n, tuple(panels), choices.precision, aggregate, choices.panel_update,
                    choices.lookahead, choices.reach)
