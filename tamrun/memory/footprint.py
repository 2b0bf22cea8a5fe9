"""Byte footprints of every planned allocation, written as coefficients of the problem's sizes.

Symbols: g groups in a chunk, r rows in a chunk, N rows per group (padded), D design width,
s bytes per element (8 float64, 4 float32), and the design's per-row bytes (`RowBytes`, from
`AdditiveDesign.row_bytes`): build (scaled features, the dense blocks at their peak, leaf indices and
their temporaries), store (what a cached row keeps), gram (the direct route's scatter temporaries
for indexed blocks), apply (one product Phi v or Phi' u). Per group:

    direct          fixed (2 D^2 + 4 D) s            Gram + rhs, Cholesky factor, solution
                    per row max(build, store + max(gram, apply))
    direct, dual    fixed max(N^2 s + build, 2 N^2 s) + N (store + kernel)
                    (N < D: the N x N kernel K while its lower triangle is built tile by tile, with
                    the leaf indicators and one tile's temporaries (`kernel_build_bytes`), then K and
                    its factor; all N rows of the group kept, with their whitened copies); per row
                    build; one group per chunk
    cg, cached      fixed (8 D + 3 K) s + N store    CG vectors, block-Jacobi blocks (K = Dd^2 if Dd <= 512,
                                                     plus R Q^2 per forest crossing); W Phi kept between iterations
                    per row max(build - store, apply) the chunk being built becomes part of the cache
    cg, rebuilt     fixed (8 D + 3 K) s, per row build + apply
    predict         fixed D s, per row max(build, store + apply) + s; plus the (G, N) predictions

A step's footprint is g * (fixed + r * per row), times the overhead factor (default 1.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Tuple

from tamrun.effects.design import RowBytes


@dataclass(frozen=True)
class ProblemSize:
    """The sizes the footprints depend on."""

    n_groups: int
    n_rows: int
    width: int
    itemsize: int
    row: RowBytes = field(default_factory=lambda: RowBytes(0, 0, 0, 0))
    n_predict_rows: int = 0
    preconditioner_elements: int = 0  # per group: the blocks block-Jacobi inverts (Dd^2 + sum R Q^2)
    kernel_row: int = 0  # bytes per row of the dual route's whitened rows (`AdditiveDesign.kernel_row_bytes`)
    kernel_build: int = 0  # the dual's temporaries while K is built (`kernel_build_bytes`)


def dense_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's dense normal equations and their Cholesky solve."""
    return (2 * p.width * p.width + 4 * p.width) * p.itemsize


COUNT_PAIRS_PER_STEP = 1 << 20  # the dual's scattered leaf counts: pairs of rows scattered at a time
COUNT_PAIR_BYTES = 44  # per pair: left, right, their leaf's first entry, offsets, flat position (int64), a one (float32)
COUNT_ENTRY_BYTES = 56  # per leaf entry (N T of them): the sort's order and keys, data row, first entry, size


def kernel_build_bytes(n_rows: int, itemsize: int, tile_rows: int,
                       forests: Sequence[Tuple[int, int, int, bool]] = (), scatter_max_rows: int = 0) -> int:
    """Temporaries of the dual's K built tile by tile (`tamrun.solve.dual.group_kernel`), per forest
    block (slots T, grid rows R, count itemsize c, wide: R > solver.dual_dense_counts_max), kept while
    K is built: the leaf indicator of the leaves in the dense product (N (R_d + 1) c, R_d = R, or for a
    wide forest at most N T / (scatter_max_rows + 1) leaves of more rows) and, for a wide forest, the
    scattered counts C (4 N^2), with the scatter's temporaries while C is made (COUNT_ENTRY_BYTES per
    entry, COUNT_PAIR_BYTES per pair of a step); then one tile of b = min(tile_rows, N) rows: the
    tile and one (G G') term (2 b N s), the product's tile (b N c) and, wide, its sum with C's (b N 4)."""
    rows = min(tile_rows, n_rows)
    kept, making, counts_tile = 0, 0, 0
    for slots, grid_rows, count_itemsize, wide in forests:
        dense_leaves = min(grid_rows, n_rows * slots // (scatter_max_rows + 1)) if wide else grid_rows
        if wide:
            making = max(making, kept + COUNT_ENTRY_BYTES * n_rows * slots + COUNT_PAIR_BYTES * COUNT_PAIRS_PER_STEP)
            kept += 4 * n_rows * n_rows
        kept += n_rows * (dense_leaves + 1) * count_itemsize
        counts_tile = max(counts_tile, rows * n_rows * (count_itemsize + (4 if wide else 0)))
    return max(making, kept + 2 * rows * n_rows * itemsize + counts_tile)


def dual_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's dual (kernel) system and its rows, see the module docstring."""
    n2 = p.n_rows * p.n_rows
    return max(n2 * p.itemsize + p.kernel_build, 2 * n2 * p.itemsize) + p.n_rows * (p.row.store + p.kernel_row)


def direct_row_bytes(p: ProblemSize) -> int:
    """Bytes per row of a direct-route chunk, per group: building it, or the built chunk and the
    temporaries of its Gram or of Phi' y."""
    return max(p.row.build, p.row.store + max(p.row.gram, p.row.apply))


def cg_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's CG state: rhs, x, r, z, p, Ap, the Jacobi diagonal, a spare, and the
    block-Jacobi blocks (their Gram, Cholesky factor and inverse while they are set up)."""
    return (8 * p.width + 3 * p.preconditioner_elements) * p.itemsize


def cg_cache_bytes(p: ProblemSize) -> int:
    """Bytes of one group's whole weighted design, kept across CG iterations when it fits."""
    return p.n_rows * p.row.store


def cg_row_bytes(p: ProblemSize, cached: bool) -> int:
    """Bytes per row of a CG chunk, per group."""
    return max(p.row.build - p.row.store, p.row.apply) if cached else p.row.build + p.row.apply


def predict_row_bytes(p: ProblemSize) -> int:
    """Bytes per predicted row, per group: building the chunk, or the chunk and one product, and the row's prediction."""
    return max(p.row.build, p.row.store + p.row.apply) + p.itemsize


def predict_output_bytes(p: ProblemSize) -> int:
    """Bytes of the (G, N) predictions."""
    return max(p.n_predict_rows, p.n_rows) * p.itemsize * p.n_groups


def step_bytes(groups: int, rows: int, fixed: int, per_row: int, overhead: float) -> int:
    """overhead * groups * (fixed + rows * per_row)."""
    return int(overhead * groups * (fixed + rows * per_row))
