"""Byte footprints of the planned allocations, written as coefficients of the problem's sizes.

Symbols: g groups in a chunk, r rows in a chunk, N rows per group (padded), D = design width,
F = raw feature columns, s = bytes per element (8 float64, 4 float32).

    row chunk    r * (2F + 4D) * s    per group: raw slice + scaled copy, Phi, W*Phi, effect temporaries
    dense system (3 D^2 + 4 D) * s   per group: Gram, normalised copy / Cholesky factor, rhs, solution
    cg system    (8 D) * s           per group: b, x, r, z, p, Ap, preconditioner, residual norms
    cg cache     N * D * s           per group: Phi kept between iterations when it fits

All are multiplied by the overhead factor (default 1.1) before they are compared with a budget.
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


def row_bytes(p: ProblemSize) -> int:
    """Bytes per row of a design chunk, per group."""
    return (2 * p.n_features + 4 * p.width) * p.itemsize


def dense_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's dense normal equations and their Cholesky solve."""
    return (3 * p.width * p.width + 4 * p.width) * p.itemsize


def cg_system_bytes(p: ProblemSize) -> int:
    """Bytes of one group's CG state."""
    return 8 * p.width * p.itemsize


def cg_cache_bytes(p: ProblemSize) -> int:
    """Bytes of one group's whole design, kept across CG iterations when it fits."""
    return p.n_rows * p.width * p.itemsize


def predict_row_bytes(p: ProblemSize) -> int:
    """Bytes per predicted row, per group (raw slice, scaled copy, Phi, product)."""
    return (2 * p.n_features + 2 * p.width + 1) * p.itemsize
