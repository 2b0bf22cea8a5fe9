"""Byte footprints of every planned allocation, written as coefficients of the problem's sizes.

Symbols: g groups in a chunk, r rows in a chunk, N rows per group (padded), D design width,
F raw feature columns, B the columns held at the peak of building Phi (`AdditiveDesign.peak_row_width`:
the blocks, their concatenation, or the temporaries of the block being built, at least 2D),
s bytes per element (8 float64, 4 float32). Per group:

    design row     (F + B + 1) s       scaled features, the blocks at their peak, W y
    dense system   (2 D^2 + 4 D) s     Gram + rhs (held over the row chunks), Cholesky factor, solution
    cg system      (8 D) s             rhs, x, r, z, p, Ap, Jacobi diagonal, a spare
    cg cache       N D s               W Phi kept between CG iterations (when the plan allows); the
                                       chunk being built is part of it, so its row costs (F + B + 1 - D) s
    predict row    (F + B + 2) s       as a design row, plus the prediction
    predict fixed  (N_pred + D) s      the predictions of the group and its coefficients

A step's footprint is g * (fixed + r * row), times the overhead factor (default 1.1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProblemSize:
    """The sizes the footprints depend on."""

    n_groups: int
    n_rows: int
    width: int
    n_features: int
    itemsize: int
    peak_row_width: int = 0  # B; 0 means 2 D
    n_predict_rows: int = 0


def row_bytes(p: ProblemSize) -> int:
    """Bytes per row of a design chunk, per group."""
    return (p.n_features + (p.peak_row_width or 2 * p.width) + 1) * p.itemsize


def dense_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's dense normal equations and their Cholesky solve."""
    return (2 * p.width * p.width + 4 * p.width) * p.itemsize


def cg_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's CG state."""
    return 8 * p.width * p.itemsize


def cg_cache_bytes(p: ProblemSize) -> int:
    """Bytes of one group's whole weighted design, kept across CG iterations when it fits."""
    return p.n_rows * p.width * p.itemsize


def predict_row_bytes(p: ProblemSize) -> int:
    """Bytes per predicted row, per group."""
    return row_bytes(p) + p.itemsize


def predict_fixed_bytes(p: ProblemSize) -> int:
    """Bytes held per group for the whole prediction: its predictions and coefficients."""
    return (max(p.n_predict_rows, p.n_rows) + p.width) * p.itemsize


def step_bytes(groups: int, rows: int, fixed: int, per_row: int, overhead: float) -> int:
    """overhead * groups * (fixed + rows * per_row)."""
    return int(overhead * groups * (fixed + rows * per_row))
