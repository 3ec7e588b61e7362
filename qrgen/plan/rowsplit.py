"""Product family "rowsplit" (Schedule.panel_update "rowsplit"): a panel's own two products W = Z^T C and
C -= V W as generated fp32 kernels that also split the rows over blocks, for small batches whose cuBLAS GEMMs would
leave most SMs idle (templates/cuda/rowsplit.cu.j2): blocks of THREADS, TILE rows per shared-memory step (project) or
per block (update), 32 columns per block."""
from __future__ import annotations

from ..render.environment import environment
from ..targets.cuda import GRID_YZ
from ..version import __version__
from .specs import KernelSpec, Rendered

THREADS = 256
TILE = 64
KINDS = ("project", "update")
ROW_BLOCKS_MAX = GRID_YZ  # the update's blocks along the rows at most (update_grid)
# W (width x cols) = Z^T C: z, zld, zs, c, ldc, cs, part, part stride, w, ldw, ws, counters, depth, cols, rows/block
PROJECT_SIGNATURE = "PILPILPLPILPIII"
# C (rows x cols) -= V W: vt, vld, vs, w, ldw, ws, c, ldc, cs, rows, cols
UPDATE_SIGNATURE = "PILPILPILII"


def name(kind: str, width: int) -> str:
    return f"qr_rowsplit_{kind}_w{width}"


def kernel(kind: str, width: int) -> KernelSpec:
    """The product `kind` ("project" or "update") for panels of `width` columns."""
    return KernelSpec(name(kind, width), kind, width, THREADS, 1, 0, 1, False, 0, 0, ())


def signature(spec: KernelSpec) -> str:
    return PROJECT_SIGNATURE if spec.variant == "project" else UPDATE_SIGNATURE


def features(spec: KernelSpec) -> tuple[str, ...]:
    return ()


def split_rows(rows: int, nc: int, batch: int, sms: int) -> tuple[int, int]:
    """(blocks along the rows, rows per block) of a projection: about two blocks per SM over the batch and the
    32-column tiles, each block at least TILE rows (a multiple of it)."""
    tiles = -(-nc // 32)
    splits = max(1, min(-(-rows // TILE), -(-2 * sms // (batch * tiles))))
    chunk = -(-rows // splits)
    chunk = -(-chunk // TILE) * TILE
    return -(-rows // chunk), chunk


def update_grid(rows: int, nc: int, batch: int) -> tuple[int, int, int]:
    """The update's grid: 32-column tiles (times the groups of row tiles past the first), TILE-row tiles up to
    CUDA's grid.y limit, matrices."""
    row_tiles = -(-rows // TILE)
    return -(-nc // 32) * -(-row_tiles // ROW_BLOCKS_MAX), min(row_tiles, ROW_BLOCKS_MAX), batch


def render(spec: KernelSpec, schedule, target) -> Rendered:
    template = environment().get_template(f"{target.record.template_dir}/rowsplit.cu.j2")
    return Rendered(spec.name, template.render(version=__version__, arch=target.arch, k=spec, tile=TILE))
