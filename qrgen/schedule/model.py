"""The decisions that turn a Problem into kernels: panel widths, panel kernel variants, stage precisions.

A Schedule holds decisions only (as TVM's tuning records do): code is always regenerated from it. Each panel
variant's own field checks live with its kernel family (qrgen/plan/<variant>.py); whether a target can run a
schedule is the planner's check (plan/planner.check)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ..plan.family import PANEL_VARIANTS, panel_family

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The trailing update's two products may also take "tf32x3": fp32-class accuracy from three tf32 tensor-core products
# over each input's tf32 high part and remainder (plan/tf32x3.py), where the GEMM's operands are 16-byte aligned;
# elsewhere those products run in fp32 through cuBLAS.
PRODUCT_PRECISIONS = PRECISIONS + ("tf32x3",)
STAGES = ("gram", "project", "update")
PANEL_UPDATES = ("cublas", "rowsplit", "fused")
AGGREGATE_UPDATES = ("gemm", "fused")
MAX_AGGREGATE = 256  # the widest T the T kernel builds (plan/tmat.MAX)


@dataclass(frozen=True)
class Panel:
    """One panel of `width` columns and the kernel family (`variant`) that factors it: "warp", "rows", "lanes",
    "cols", "tsqr" or "whole" (each described in its module, qrgen/plan/<variant>.py).

    threads, blocks: threads per block and blocks per matrix; cluster: the blocks form one thread-block cluster;
    slice: columns per warp (cols; tsqr, whose tiles it factors as cols panels) or per inner panel (whole); tile:
    rows per tile (tsqr); loop (warp, rows, tsqr, whole): the loop over columns is not unrolled (registers rotate by
    one column per step: small code at about 1.6x the arithmetic, which pays where several blocks share an SM's
    instruction cache); (lanes, past 32 columns on one warp): that kernel's column loop is rolled rather than
    unrolled by two (a shorter chain for a warp alone on its scheduler, more instructions).
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
        if not isinstance(self.width, int) or isinstance(self.width, bool) or self.width < 1:
            raise ValueError(f"Panel.width must be a positive integer, got {self.width!r}")
        if self.variant not in PANEL_VARIANTS:
            raise ValueError(f"Panel.variant must be one of {PANEL_VARIANTS}, got {self.variant!r}")
        if not isinstance(self.blocks, int) or isinstance(self.blocks, bool) or self.blocks < 1:
            raise ValueError(f"Panel.blocks must be a positive integer, got {self.blocks!r}")
        if not isinstance(self.cluster, bool):
            raise ValueError(f"Panel.cluster must be a bool, got {self.cluster!r}")
        if not isinstance(self.loop, bool):
            raise ValueError(f"Panel.loop must be a bool, got {self.loop!r}")
        fam = panel_family(self.variant)
        fam.check(self)
        if self.cluster and (not fam.CLUSTER or self.blocks < 2):
            raise ValueError(f"Panel.cluster takes variants {CLUSTER_VARIANTS} with 2 or more blocks; got "
                             f"variant {self.variant!r} with {self.blocks} block(s)")
        if self.loop and not fam.LOOP:
            raise ValueError(f"Panel.loop applies to variants {LOOP_VARIANTS} only; got {self.variant!r}")

    def to_json(self) -> dict:
        """The fields that apply to its variant."""
        data = asdict(self)
        for name, applies in (("slice", self.variant in ("cols", "whole") or bool(self.slice)),
                              ("cluster", self.cluster), ("loop", self.loop), ("tile", self.variant == "tsqr")):
            if not applies:
                data.pop(name)
        return data


LOOP_VARIANTS = tuple(v for v in PANEL_VARIANTS if panel_family(v).LOOP)
CLUSTER_VARIANTS = tuple(v for v in PANEL_VARIANTS if panel_family(v).CLUSTER)


def loop_applies(panel: Panel) -> bool:
    """Whether Panel.loop is a choice for `panel`: its variant takes it (LOOP) and its family's check accepts it
    there (lanes: only on one warp past 32 columns)."""
    if not panel_family(panel.variant).LOOP:
        return False
    try:
        replace(panel, loop=True)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Precision:
    """Precision of the inputs of each trailing-update stage (accumulation is always fp32).

    gram: V^T V inside the panel kernel (and an aggregate's G); project: W = (V T)^T C; update: C -= V W. project
    and update may also be "tf32x3" (PRODUCT_PRECISIONS); an update in tf32x3 also runs the aggregates' merge
    products in it ((VT)^T, and G where gram is fp32). An fp32 G of few matrices runs in tf32x3 too, its rows of V
    split over more blocks (run/buffers.gram_parts).
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
class Schedule:
    m: int
    n: int
    panels: tuple[Panel, ...]
    precision: Precision = field(default_factory=Precision)
    # Columns per aggregate: 0, every panel updates all the columns right of it; A > 0, a panel updates the columns
    # of its aggregate (A columns from a multiple of A) and each aggregate's compact WY form, merged from its
    # panels', updates the rest at once (rank-A updates instead of rank-width ones). A tuple: each aggregate's
    # width in turn (summing to min(m, n)), such as narrower aggregates where the columns are tallest.
    aggregate: int | tuple[int, ...] = 0
    # How each panel's own two products (W = (V T)^T C, C -= V W) run: "cublas", strided-batched GEMMs at the
    # precisions above; "rowsplit", generated fp32 kernels that also split the rows over blocks (plan/rowsplit.py), for small batches whose GEMMs would leave most SMs idle; "fused", one generated fp32 kernel for
    # both (plan/fused.py: W stays in shared memory, a block per 32 columns of C per matrix), for
    # batches that fill the GPU by themselves. The aggregates' products use cuBLAS or the tf32x3 kernels.
    panel_update: str = "cublas"
    # With aggregates, L > 0: each aggregate's update of the columns past the next aggregate runs on a second stream
    # while the next aggregate's panels factor (their chain on a high-priority stream; the next aggregate's own
    # columns are updated first), in pieces of about L waves of 128 x 128 tiles (run/sequence.side_pieces; a large L:
    # one piece), so that its GEMMs fill the SMs the panels leave idle. 0: off.
    lookahead: int = 0
    # With lookahead: each panel's own products reach through the next aggregate's columns too, so that nothing of
    # an aggregate's merge (G, T, (VT)^T) or of its products (the columns past the next aggregate) is left on the
    # panels' chain: all of it runs on the side lane (run/sequence.drive; plan/layout.aggregates' c1).
    reach: bool = False
    # How each aggregate's two products run: "gemm", two GEMMs (cuBLAS or the tf32x3 kernels, as the precisions
    # say); "fused", where both are tf32x3, one kernel (plan/apply3.py: C's columns stay in shared memory for both
    # products, W never leaves the block) for the aggregates it takes, the GEMMs for the others.
    aggregate_update: str = "gemm"

    def __post_init__(self):
        object.__setattr__(self, "panels", tuple(self.panels))
        k = min(self.m, self.n)
        widths = [p.width for p in self.panels]
        if sum(widths) != k:
            raise ValueError(f"Schedule.panels widths {widths} sum to {sum(widths)}, must sum to min(m, n) = {k}")
        if isinstance(self.aggregate, list):
            object.__setattr__(self, "aggregate", tuple(self.aggregate))
        if isinstance(self.aggregate, tuple):
            if (not self.aggregate or any(isinstance(a, bool) or not isinstance(a, int) or not 0 < a <= MAX_AGGREGATE
                                          for a in self.aggregate) or sum(self.aggregate) != k):
                raise ValueError(f"Schedule.aggregate as a tuple is each aggregate's width, from 1 to {MAX_AGGREGATE} "
                                 f"columns, summing to min(m, n) = {k}; got {self.aggregate!r}")
        elif (isinstance(self.aggregate, bool) or not isinstance(self.aggregate, int) or self.aggregate < 0
              or self.aggregate > MAX_AGGREGATE):
            raise ValueError(f"Schedule.aggregate must be 0 (off), a column count up to {MAX_AGGREGATE}, or a tuple "
                             f"of such counts (each aggregate's) summing to min(m, n) = {k}; got {self.aggregate!r}")
        if self.panel_update not in PANEL_UPDATES:
            raise ValueError(f"Schedule.panel_update must be one of {PANEL_UPDATES}, got {self.panel_update!r}")
        if self.panel_update in ("rowsplit", "fused") and max(widths) > 32:
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
        if self.aggregate_update not in AGGREGATE_UPDATES:
            raise ValueError(f"Schedule.aggregate_update must be one of {AGGREGATE_UPDATES}, got "
                             f"{self.aggregate_update!r}")
        if self.aggregate_update == "fused" and not (self.aggregate and self.precision.project == "tf32x3"
                                                     and self.precision.update == "tf32x3"):
            raise ValueError("Schedule.aggregate_update 'fused' needs aggregates (Schedule.aggregate > 0) and "
                             "tf32x3 projections and updates (Precision.project and .update 'tf32x3'); got "
                             f"aggregate {self.aggregate}, project {self.precision.project!r}, update "
                             f"{self.precision.update!r}")
        if any(p.variant == "whole" for p in self.panels):
            if len(self.panels) != 1:
                raise ValueError("a Panel of variant 'whole' factors the whole matrix: it must be the schedule's "
                                 f"only panel (width min(m, n) = {k}); got {len(self.panels)} panels")
            if self.precision != Precision() or self.aggregate or self.panel_update != "cublas":
                raise ValueError("a schedule of variant 'whole' updates in fp32 inside its kernel: it takes fp32 "
                                 "precisions, no aggregates and panel_update 'cublas' (the defaults)")
        if self.aggregate:
            starts = set(self.starts())
            cut = next((a0 for a0, _ in self.windows() if a0 not in starts), None)
            if cut is not None:
                raise ValueError(f"Schedule.aggregate {self.aggregate}: column {cut} starts an aggregate but no "
                                 f"panel; panels must not straddle aggregates (panel starts: {sorted(starts)})")

    def windows(self) -> list[tuple[int, int]]:
        """Each aggregate's columns [a0, a1), in order (none without aggregates)."""
        k = min(self.m, self.n)
        if not self.aggregate:
            return []
        widths = self.aggregate if isinstance(self.aggregate, tuple) else [self.aggregate] * -(-k // self.aggregate)
        out, a0 = [], 0
        for w in widths:
            out.append((a0, min(a0 + w, k)))
            a0 += w
        return out

    @property
    def widest_aggregate(self) -> int:
        """The widest aggregate's columns (0 without aggregates)."""
        return max((a1 - a0 for a0, a1 in self.windows()), default=0)

    def starts(self) -> list[int]:
        """First column (and row) of each panel."""
        out, c = [], 0
        for p in self.panels:
            out.append(c)
            c += p.width
        return out

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
                "panels": [p.to_json() for p in self.panels],
                "precision": asdict(self.precision)}
        if self.aggregate:
            data["aggregate"] = list(self.aggregate) if isinstance(self.aggregate, tuple) else self.aggregate
        if self.panel_update != "cublas":
            data["panel_update"] = self.panel_update
        if self.lookahead:
            data["lookahead"] = self.lookahead
        if self.reach:
            data["reach"] = True
        if self.aggregate_update != "gemm":
            data["aggregate_update"] = self.aggregate_update
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Schedule":
        try:
            panels = tuple(Panel(**p) for p in data["panels"])
            return cls(m=data["m"], n=data["n"], panels=panels, precision=Precision(**data.get("precision", {})),
                       aggregate=data.get("aggregate", 0), panel_update=data.get("panel_update", "cublas"),
                       lookahead=data.get("lookahead", 0), reach=data.get("reach", False),
                       aggregate_update=data.get("aggregate_update", "gemm"))
        except KeyError as exc:
            raise ValueError(f"schedule JSON lacks the field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"schedule JSON has an unknown or missing field: {exc}") from None

    def describe(self) -> str:
        """One line: runs of equal panels, precisions, aggregates, lookahead, the panels' own products."""
        groups: list[list] = []
        for p in self.panels:
            if groups and groups[-1][0] == p:
                groups[-1][1] += 1
            else:
                groups.append([p, 1])
        parts = []
        for p, count in groups:
            extra = panel_family(p.variant).describe(p) + (", column loop" if p.loop else "")
            parts.append(f"{count}x{p.width} {p.variant}({p.threads} threads{extra})")
        prec = self.precision
        text = " + ".join(parts) + f"; precision gram={prec.gram} project={prec.project} update={prec.update}"
        if isinstance(self.aggregate, tuple):
            runs: list[list[int]] = []
            for a in self.aggregate:
                if runs and runs[-1][0] == a:
                    runs[-1][1] += 1
                else:
                    runs.append([a, 1])
            text += "; aggregates of " + " + ".join(f"{c}x{a}" for a, c in runs) + " columns"
        elif self.aggregate:
            text += f"; aggregates of {self.aggregate} columns"
        text += f" (lookahead, pieces of {self.lookahead} waves)" if self.lookahead else ""
        text += "; panel products reach through the next aggregate (merges on the side lane)" if self.reach else ""
        text += "; aggregate products fused (one tf32x3 launch)" if self.aggregate_update == "fused" else ""
        return text + {"rowsplit": "; panel products split over blocks",
                       "fused": "; panel products fused (one launch)"}.get(self.panel_update, "")
