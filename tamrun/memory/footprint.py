"""Byte footprints of every planned allocation, written as coefficients of the problem's sizes, and
the one chunk selector that turns them into chunk sizes (Falkon's ``select_dim_over_n``, for two
dimensions: groups and rows, or groups and windows).

Symbols: g groups in a chunk, r rows in a chunk, N rows per group (padded), D design width, Dd its
dense columns, F feature columns, s bytes per element (8 float64, 4 float32), and the design's
per-row bytes (`RowBytes`, `design_row_bytes`): build (scaled features, the dense blocks at their
peak, leaf indices and their temporaries), store (what a cached row keeps), gram (the direct route's
scatter temporaries for indexed blocks), apply (one product Phi v or Phi' u). Per group:

    direct          fixed (2 D^2 + 4 D) s            Gram + rhs, Cholesky factor, solution
                    per row max(build, store + max(gram, apply))
    direct, dual    fixed max(N^2 s + build, 2 N^2 s) + N (store + kernel)
                    (N < D: the N x N kernel K while its lower triangle is built tile by tile, with
                    the leaf indicators and one tile's temporaries (`kernel_build_bytes`), then K and
                    its factor; all N rows of the group kept, with their whitened copies); per row
                    build; one group per chunk
    cg, cached      fixed (8 D + 3 K) s + N store    CG vectors, block-Jacobi blocks (K = Dd^2 if Dd <=
                                                     solver.block_max_dim, plus R Q^2 per forest crossing);
                                                     W Phi kept between iterations
                    per row max(build - store, apply) the chunk being built becomes part of the cache
    cg, rebuilt     fixed (8 D + 3 K) s, per row build + apply
    predict         fixed D s, per row max(build, store + apply) + s; plus the (G, N) predictions
    gcv (model.penalties=gcv, `tamrun.fit.gcv`)
                    held    (D^2 + D + 2) s for every group through the search (Gram, Phi'y, y'y, n)
                    build   fixed (D^2 + D) s (a chunk's Gram and Phi'y before they are kept), per row
                            as the direct route's
                    score   fixed (8 D^2 + 6 D) s, no rows (one candidate: G/n, A, its factor, the
                            right-hand sides [G/n | b/n], the two triangular solves, a jitter retry)
    window batch    see `window_costs` (the adaptive mode's batches of windows x groups)

A step's footprint is g * (fixed + r * per row), times the overhead factor (memory.overhead_factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

import torch

from tamrun.config.schema import SolverConfig
from tamrun.effects.indexed import SORT_SLOTS
from tamrun.solve.coarse import aligned_width, two_level_dims
from tamrun.solve.dual import count_dtype

if TYPE_CHECKING:  # typing only: the design is read through its declared widths
    from tamrun.effects.design import AdditiveDesign

INDEX_BYTES = 8  # int64 leaf indices
COUNT_PAIR_BYTES = 44  # the dual's scattered counts, per pair: left, right, their leaf's first entry, offsets, flat position (int64), a one (float32)
COUNT_ENTRY_BYTES = 56  # per leaf entry (N T of them): the sort's order and keys, data row, first entry, size


@dataclass(frozen=True)
class RowBytes:
    """Bytes per row of a chunk, per group: to build it, to keep it (CG cache), the extra temporaries
    of its Gram (direct route) and of one product Phi v / Phi' u (CG, prediction)."""

    build: int
    store: int
    gram: int
    apply: int


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
    coarse_elements: int = 0  # per group: the two-level correction's (`coarse_elements`)
    kernel_row: int = 0  # bytes per row of the dual route's whitened rows (`kernel_row_bytes`)
    kernel_build: int = 0  # the dual's temporaries while K is built (`kernel_build_bytes`)


@dataclass(frozen=True)
class StepCost:
    """A step's footprint per group: ``fixed`` bytes plus ``per_row`` bytes per row of its chunk."""

    fixed: int
    per_row: int

    def bytes(self, groups: int, rows: int, overhead: float) -> int:
        return step_bytes(groups, rows, self.fixed, self.per_row, overhead)


@dataclass(frozen=True)
class WindowCost:
    """What a batch of windows of ``groups`` groups holds: overhead x groups x (fixed + windows x
    per_window); `bytes` has the signature of `StepCost.bytes` (rows unused) for the chunk loop."""

    groups: int
    fixed: int
    per_window: int

    def bytes(self, windows: int, rows: int = 0, overhead: float = 1.0) -> int:
        return step_bytes(self.groups, windows, self.fixed, self.per_window, overhead)


def step_bytes(groups: int, rows: int, fixed: int, per_row: int, overhead: float) -> int:
    """overhead * groups * (fixed + rows * per_row)."""
    return int(overhead * groups * (fixed + rows * per_row))


def select_chunk(n_groups: int, n_rows: int, cost: StepCost, budget: int, overhead: float, floor_rows: int,
                 regrow_rows: bool = True) -> Optional[Tuple[int, int]]:
    """The largest (groups, rows) with overhead * groups * (fixed + rows * per_row) <= budget, or None
    when one group of one row does not fit.

    All ``n_groups`` are kept when a chunk of ``floor_rows`` rows fits for all of them, with as many
    rows as fit (at most ``n_rows``); otherwise as many groups as fit with ``floor_rows`` rows, then as
    many rows as fit for them (``regrow_rows``) or ``floor_rows``. Pure: no device is touched.
    """
    if cost.bytes(1, 1, overhead) > budget:
        return None
    if cost.bytes(n_groups, floor_rows, overhead) <= budget:
        groups = n_groups
    else:
        groups = max(1, min(n_groups, int(budget // max(1, cost.bytes(1, floor_rows, overhead)))))
        if not regrow_rows:
            return groups, floor_rows
    rows = int(((budget / overhead) / groups - cost.fixed) // cost.per_row)
    if cost.bytes(groups, floor_rows, overhead) <= budget:  # the division may round a fitting floor down
        rows = max(rows, floor_rows)
    return groups, max(1, min(rows, n_rows))


# ---- the design's rows ---------------------------------------------------------------------------
def peak_row_width(design: "AdditiveDesign") -> int:
    """Dense columns per row held at the peak of building the dense part (scaled features
    excluded): the blocks built so far plus the one being built and its temporaries, or all
    blocks plus their concatenation: max(2 Dd, max_j (blocks before j + D_j + work_j))."""
    built, peak = int(design.intercept), 0
    for effect in design.dense_effects:
        peak = max(peak, built + effect.width + effect.work_width)
        built += effect.width
    return max(peak, 2 * design.dense_width)


def design_row_bytes(design: "AdditiveDesign", itemsize: int) -> RowBytes:
    """Per-row bytes (per group) of a chunk of ``design``, see `RowBytes`. With s = itemsize, F
    features, Dd dense columns, and per indexed block T slots, Q columns per grid row, C columns:

        build  max(dense phase (F + peak_row_width) s,
                   (F + Dd) s + blocks kept so far + 2 C s (its columns, raw and scaled) + Q s (Q > 1)
                   + max(leaf_index: T s + T + 4T + C s (picked features, comparisons, the leaves
                         at most 4 bytes, the columns' (C, n) copy), int32 leaves and flat index: 8T))
        store  Dd s + per block 16T + Q s: the flat index (O's indices, 4T), O' (indices 4T, ones
               shared with O 8T), the row values
        apply  2 s + max(Dd s, per block max(4 Q s, 48 min(T, SORT_SLOTS) + 2 Q s): the products, or
               O' being built with the row values)
    """
    s = itemsize
    features, dd = len(design.columns), design.dense_width
    build = (features + peak_row_width(design)) * s
    held = (features + dd) * s
    store, apply, gram = dd * s, dd * s, 0
    for effect in design.indexed_effects:
        t, q, cols = effect.slots, effect.grid_q, len(effect.columns)
        factor = q * s if q > 1 else 0
        leaves = t * s + t + 4 * t + cols * s
        build = max(build, held + 2 * cols * s + factor + max(leaves, 8 * t))
        kept = 16 * t + q * s
        held += kept
        store += kept
        apply = max(apply, 4 * q * s, 48 * min(t, SORT_SLOTS) + 2 * q * s)
        gram += t * q * dd * s * 2 + t * INDEX_BYTES
        for other in design.indexed_effects:
            gram += t * other.slots * (2 * q * other.grid_q * s + 3 * INDEX_BYTES)
    return RowBytes(build, store, gram, 2 * s + apply)


def kernel_row_bytes(design: "AdditiveDesign", itemsize: int) -> int:
    """Per-row bytes of the dual route's whitened rows (`tamrun.solve.dual.KernelFeatures`) with
    their concatenation temporaries, and the weighted target and alpha: (2 Dd + sum 2 Q + 2) s + sum 8 T."""
    s = itemsize
    return (2 * design.dense_width + 2) * s + sum(2 * e.grid_q * s + 8 * e.slots for e in design.indexed_effects)


def problem_size(n_groups: int, n_rows: int, design: "AdditiveDesign", itemsize: int, solver: SolverConfig,
                 n_predict_rows: int = 0) -> ProblemSize:
    """The sizes the memory oracle plans with, for ``n_groups`` groups of ``n_rows`` (padded) rows."""
    blocks = 0
    if solver.preconditioner.value in ("block_jacobi", "two_level"):
        blocks = design.dense_width ** 2 if design.dense_width <= solver.block_max_dim else 0
        blocks += sum(e.width * e.grid_q for e in design.indexed_effects if e.grid_q > 1)  # R Q^2
    # auto resolves per device when the kernel is built; float32's itemsize bounds both choices
    counts = torch.float32 if solver.dual_counts_dtype.value == "auto" else getattr(torch, solver.dual_counts_dtype.value)
    forests = [(e.slots, e.width // e.grid_q, count_dtype(e.slots, counts).itemsize,
                e.width // e.grid_q > solver.dual_dense_counts_max) for e in design.indexed_effects]
    kernel_build = kernel_build_bytes(n_rows, itemsize, solver.dual_tile_rows, forests,
                                      solver.dual_scatter_max_leaf_rows, solver.dual_scatter_pairs_per_step)
    return ProblemSize(n_groups=n_groups, n_rows=n_rows, width=design.width, itemsize=itemsize,
                       row=design_row_bytes(design, itemsize), n_predict_rows=n_predict_rows,
                       preconditioner_elements=blocks, kernel_row=kernel_row_bytes(design, itemsize),
                       coarse_elements=coarse_elements(design, solver, itemsize),
                       kernel_build=kernel_build)


# ---- what a run records after its fit ------------------------------------------------------------
# Host memory the recording allocates above the planning baseline, reserved out of the real limit's
# free memory before the chunks are chosen (`recording_bytes`; measured on the national table with
# memory.limit=5MiB, `python -m tamrun.bench.rss`):
#   the predictions table of every scored row (date, group, split, actual, predicted: 5 columns of 8
#     bytes, and 2 per interval level: lower_<p>, upper_<p>), built per split, concatenated and sorted:
#     3 copies at its peak; built only when its CSV or the plots are logged
#   the plots (figures, their Agg canvases and PNG encodings): PLOTS_BYTES (measured 12.4 MiB)
#   the pyfunc model (its files, signature and input example): MODEL_BYTES (measured 3.3 MiB)
RESULT_COLUMNS = 5
RESULT_COPIES = 3
PLOTS_BYTES = 24 * 2**20
MODEL_BYTES = 8 * 2**20


def results_bytes(n_scored_rows: int, levels: int = 0) -> int:
    """Bytes of the run's predictions table at its peak: rows x (5 + 2 x ``levels``) columns x 8 bytes x 3
    copies (``levels``: its intervals)."""
    return n_scored_rows * (RESULT_COLUMNS + 2 * levels) * 8 * RESULT_COPIES


def recording_bytes(n_scored_rows: int, table: bool, plots: bool, model: bool, levels: int = 0) -> int:
    """Bytes the recording adds after the fit: the predictions table (``table``, with ``levels`` intervals),
    the plots, the model."""
    return ((results_bytes(n_scored_rows, levels) if table else 0) + (PLOTS_BYTES if plots else 0)
            + (MODEL_BYTES if model else 0))


# ---- a table streamed in chunks of groups -------------------------------------------------------
# Host bytes per row of a chunk of the table through its run (`tamrun.jobs.stream`): its frame as read
# (8 bytes a numeric or date column, TEXT_CELL_BYTES a text cell: a pointer and a Python string) in
# STREAM_FRAME_COPIES copies (the frame, its splits, the padded training and test batches, their
# predictions: measured 7.2 copies held when the fit is planned, a spline and an hourly categorical effect
# on 5 columns, 385,000 rows a chunk), and the chunk's predictions table (`results_bytes`, with its
# intervals). The fit's own chunks are planned apart, in what is left (`MemoryOracle.plan`).
TEXT_CELL_BYTES = 64
STREAM_FRAME_COPIES = 8


def stream_row_bytes(numeric_columns: int, text_columns: int, levels: int = 0) -> int:
    """Bytes per row of a streamed chunk: (8 numeric + TEXT_CELL_BYTES text) x STREAM_FRAME_COPIES + the
    row's predictions (`results_bytes` of one row, ``levels`` intervals)."""
    return ((8 * numeric_columns + TEXT_CELL_BYTES * text_columns) * STREAM_FRAME_COPIES
            + results_bytes(1, levels))


# ---- the unplanned data phase --------------------------------------------------------------------
# Peak bytes a step of the data phase adds to what is already held, in copies of what it works on:
#   read    the last block read: the next block's text and parsed columns
#   join    the blocks read: their concatenation and the copy sorted by (date, group)
#   derive  the derived columns (data.derived) and, beside them, DERIVE_WORK_COLUMNS (n,) arrays: the rows'
#           time orders the history columns share (order, group codes, dates, local times, ranks) and one
#           column's look-ups, windows and temporaries (`derive_bytes`)
#   check   the table with its derived columns: NaN masks, the periods' and the NaN policy's copies
#   split   the table: the splits and the constant-column checks
#   batch   the training table: the (G, N, F) tensors, filled one column at a time
#   design  the widest effect's c columns of the training batch and one more, (G, N, c + 1): the design
#           is fitted one effect at a time on its raw and scaled columns and their real rows (4 copies
#           of c columns), after the ranges (two (G, N) temporaries)
# Measured per step (RSS high-water mark, national table): 1.0-1.3 copies (check, split), 0.5-0.7
# (batch), 3.5-3.6 (design); rounded up. derive: at most 19.4 working columns beside those made for one column
# (a grouped 7-day rolling mean, its group's time order sorted), 18.2 for the national table's 12 (tracemalloc,
# 2026-11-29); 24 leaves room for longer windows (one more array per doubling of a window's rows). A step is refused (exit 2) when it would not fit under the binding real
# limit with memory.safety_margin still free (`tamrun.memory.guard.require_room`).
DATA_STEP_COPIES = {"read": 3.0, "join": 2.0, "derive": 1.0, "check": 1.5, "split": 1.5, "batch": 1.5, "design": 5.0}
DERIVE_WORK_COLUMNS = 24


def derive_bytes(rows: int, derived: int) -> int:
    """Bytes of the (n,) float64 arrays the derive step holds at its peak: the ``derived`` columns it makes and
    `DERIVE_WORK_COLUMNS` more (none without a derived column)."""
    return 8 * rows * (derived + DERIVE_WORK_COLUMNS) if derived else 0


def data_step_bytes(step: str, nbytes: int) -> int:
    """Peak bytes data-phase step ``step`` (a key of `DATA_STEP_COPIES`) adds over ``nbytes`` of input."""
    return int(DATA_STEP_COPIES[step] * nbytes)


# ---- the routes' systems -------------------------------------------------------------------------
def dense_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's dense normal equations and their Cholesky solve."""
    return (2 * p.width * p.width + 4 * p.width) * p.itemsize


def gcv_held_bytes(p: ProblemSize) -> int:
    """Bytes of one group's statistics GCV keeps through its search: Gram, Phi'y, y'y and n."""
    return (p.width * p.width + p.width + 2) * p.itemsize


def gcv_build_cost(p: ProblemSize) -> StepCost:
    """Per group: a chunk's Gram and Phi'y while built (before they are kept), rows as the direct route's."""
    return StepCost((p.width * p.width + p.width) * p.itemsize, direct_row_bytes(p))


def gcv_score_bytes(p: ProblemSize) -> int:
    """Bytes of one group's GCV score at one candidate penalty (`tamrun.fit.gcv.gcv_terms`)."""
    return (8 * p.width * p.width + 6 * p.width) * p.itemsize


def kernel_build_bytes(n_rows: int, itemsize: int, tile_rows: int,
                       forests: Sequence[Tuple[int, int, int, bool]] = (), scatter_max_rows: int = 0,
                       pairs_per_step: int = 0) -> int:
    """Temporaries of the dual's K built tile by tile (`tamrun.solve.dual.chunk_kernel`), per forest
    block (slots T, grid rows R, count itemsize c, wide: R > solver.dual_dense_counts_max), kept while
    K is built: the leaf indicator of the leaves in the dense product (N (R_d + 1) c, R_d = R, or for a
    wide forest at most N T / (scatter_max_rows + 1) leaves of more rows) and, for a wide forest, the
    scattered counts C (4 N^2), with the scatter's temporaries while C is made (COUNT_ENTRY_BYTES per
    entry, COUNT_PAIR_BYTES per pair of a step of ``pairs_per_step``); then one tile of
    b = min(tile_rows, N) rows: the tile and one (G G') term (2 b N s), the product's tile (b N c)
    and, wide, its sum with C's (b N 4)."""
    rows = min(tile_rows, n_rows)
    kept, making, counts_tile = 0, 0, 0
    for slots, grid_rows, count_itemsize, wide in forests:
        dense_leaves = min(grid_rows, n_rows * slots // (scatter_max_rows + 1)) if wide else grid_rows
        if wide:
            making = max(making, kept + COUNT_ENTRY_BYTES * n_rows * slots + COUNT_PAIR_BYTES * pairs_per_step)
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


def coarse_elements(design: "AdditiveDesign", solver: SolverConfig, itemsize: int) -> int:
    """Elements per group of the two-level correction (`tamrun.solve.coarse`): H in its padded layout,
    S' D', and E, its factor, its inverse and the inverse padded, 3 k^2 + k'^2 (S', D', k' rounded up to
    64 bytes of ``itemsize``, `aligned_width`); 0 without it."""
    if solver.preconditioner.value != "two_level" or not design.indexed_effects:
        return 0
    sources, size = two_level_dims(design.dense_width, [(e.width // e.grid_q, e.grid_q, e.slots)
                                                        for e in design.indexed_effects])
    padded = [aligned_width(d, itemsize) for d in (sources, design.width, size)]
    return padded[0] * padded[1] + 3 * size * size + padded[2] * padded[2]


def cg_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's CG state: rhs, x, r, z, p, Ap, the Jacobi diagonal, a spare, the
    block-Jacobi blocks (their Gram, Cholesky factor and inverse while they are set up) and the
    two-level correction's elements."""
    return (8 * p.width + 3 * p.preconditioner_elements + p.coarse_elements) * p.itemsize


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


def gathered_row_bytes(n_features: int, itemsize: int) -> int:
    """Bytes of one row gathered into a window's batch: its features, target and weight, (F + 2) s."""
    return (n_features + 2) * itemsize


def window_costs(p: ProblemSize, n_features: int, step_rows: int, updating: bool, fit_rows: int) -> Tuple[int, int]:
    """(fixed, per window) bytes per group of a batch of windows (the adaptive mode), with W = the
    longest window (p.n_rows), A = ``step_rows`` (the most rows added + removed between two windows),
    H the longest forecast (p.n_predict_rows), r the gathered row (`gathered_row_bytes`):

        updating (direct, primal)  fixed      W r + (2 D^2 + 4 D) s + min(W, fit_rows) direct_row
                                              (one window's Gram from its rows)
                                   per window (2 D^2 + 4 D) s + A (r + direct_row) + H (r + predict_row)
                                              (the added and removed rows' Grams, the Grams and
                                              their factors, the forecast)
        cg / dual                  fixed 0, per window W r + H (r + predict_row); the fit's own chunks
                                   are charged by its dispatcher
    """
    row = gathered_row_bytes(n_features, p.itemsize)
    predict = p.n_predict_rows * (row + predict_row_bytes(p))
    if not updating:
        return 0, p.n_rows * row + predict
    fixed = p.n_rows * row + dense_system_bytes(p) + min(p.n_rows, fit_rows) * direct_row_bytes(p)
    return fixed, dense_system_bytes(p) + step_rows * (row + direct_row_bytes(p)) + predict
