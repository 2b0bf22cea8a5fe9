"""IndexedBlock: a design block with a few non-zeros per row, kept as indices (never one-hot).

For each row n and slot t = 1..T, a row r = index[n, t] of an (R, Q) coefficient grid is active with
the weights scale * weight[n] * factor[n, :] (factor = 1 and Q = 1 for a plain forest):

    Phi[n, r Q + q] = scale * weight[n] * sum_t 1[index[n, t] = r] * factor[n, q]

The T active rows of one row n are distinct (each tree owns its own R / T rows), so
    Phi v        : gather-sum                    (g, n)
    Phi' u       : index_add / bincount          (g, R Q)
    diag Phi'Phi : index_add of squares          (g, R Q)
    Phi_a' Phi_b : scatter of products           (g, D_a, D_b)
Shapes carry a leading group dimension g.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch


@dataclass
class IndexedBlock:
    """Built from ``index`` (g, n, T) int32/int64 in [0, R); keeps only its flat form (see `flat`)."""

    index: torch.Tensor  # (g, n, T) int32/int64 in [0, R); released once `flat` is built
    n_rows_grid: int  # R
    scale: float
    factor: Optional[torch.Tensor] = None  # (g, n, Q), None for Q = 1
    weight: Optional[torch.Tensor] = None  # (g, n) row weights (0 for padding), None for 1
    flat: torch.Tensor = field(init=False, repr=False)
    shape: Tuple[int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        """Index the (g R) rows of the stacked grids: row-major (g n, T) for Q = 1 (a row's T leaves
        side by side, summed by one reduction over the last dimension), slot-major (T, g n) for Q > 1
        (one contiguous index per slot)."""
        g, n, t = self.index.shape
        self.shape = (g, n, t)
        # int32 (half the bytes, faster gathers) where it fits, for Q = 1; index_add_ of (g n, Q) rows
        # is several times slower with an int32 index, so Q > 1 keeps int64
        dtype = torch.int32 if self.q == 1 and g * self.n_rows_grid < 2**31 else torch.int64
        offsets = torch.arange(g, device=self.index.device, dtype=dtype).view(g, 1, 1) * self.n_rows_grid
        flat = self.index.to(dtype) + offsets
        self.flat = flat.reshape(g * n, t) if self.q == 1 else flat.permute(2, 0, 1).reshape(t, g * n).contiguous()
        self.index = None  # the flat form is all the products need

    @property
    def q(self) -> int:
        return 1 if self.factor is None else self.factor.shape[-1]

    @property
    def width(self) -> int:
        return self.n_rows_grid * self.q

    def local_index(self) -> torch.Tensor:
        """(g, n, T) int64 in [0, R) (the Gram route and tests)."""
        g, n, t = self.shape
        flat = self.flat.long().reshape(g, n, t) if self.q == 1 else self.flat.long().reshape(t, g, n).permute(1, 2, 0)
        return flat - torch.arange(g, device=flat.device).view(g, 1, 1) * self.n_rows_grid

    def row_values(self) -> torch.Tensor:
        """(g, n, Q): scale * weight[n] * factor[n, :]."""
        g, n = self.shape[:2]
        dtype = self.factor.dtype if self.factor is not None else (self.weight.dtype if self.weight is not None
                                                                   else torch.float64)
        values = (self.factor if self.factor is not None
                  else torch.ones(g, n, 1, dtype=dtype, device=self.flat.device)) * self.scale
        return values * self.weight.unsqueeze(-1) if self.weight is not None else values

    def _slot(self, slot: int) -> torch.Tensor:
        """(g n,) grid rows of one slot."""
        return self.flat[:, slot] if self.q == 1 else self.flat[slot]

    def _scatter_rows(self, source: torch.Tensor) -> torch.Tensor:
        """out[r] = sum_{n, t: index[n, t] = r} source[n]: source (g, n, Q) -> (g, R Q). Each out[r]
        receives its terms in row order whatever the chunk holds (bitwise the same per group)."""
        g, n, t = self.shape
        q = source.shape[-1]
        if q == 1 and self.q == 1:  # one bincount over all (row, slot) pairs
            weights = source.reshape(g * n, 1).expand(g * n, t).reshape(-1)
            out = torch.bincount(self.flat.reshape(-1), weights=weights, minlength=g * self.n_rows_grid)
            return out.to(source.dtype).view(g, self.n_rows_grid)
        out = torch.zeros(g * self.n_rows_grid, q, dtype=source.dtype, device=source.device)
        rows = source.reshape(g * n, q)
        for slot in range(t):  # one row-wise add per slot: no (T, g n, Q) temporary
            out.index_add_(0, self._slot(slot), rows)
        return out.view(g, self.n_rows_grid * q)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """v (g, R Q) -> Phi v (g, n). A row's T terms are summed in slot order whatever the chunk
        holds (a group's result is bitwise the same in any chunk of groups)."""
        g, n, t = self.shape
        if self.q == 1:
            picked = v.reshape(-1).index_select(0, self.flat.reshape(-1)).view(g * n, t).sum(dim=-1)
            return picked.view(g, n) * self.row_values()[..., 0]
        grid = v.reshape(g * self.n_rows_grid, self.q)
        picked = grid.index_select(0, self._slot(0))
        for slot in range(1, t):
            picked += grid.index_select(0, self._slot(slot))
        return (picked.view(g, n, self.q) * self.row_values()).sum(dim=-1)

    def rmatvec(self, u: torch.Tensor) -> torch.Tensor:
        """u (g, n) -> Phi' u (g, R Q)."""
        return self._scatter_rows(self.row_values() * u.unsqueeze(-1))

    def squared_column_sums(self) -> torch.Tensor:
        """diag(Phi' Phi) (g, R Q)."""
        return self._scatter_rows(self.row_values() ** 2)

    def grid_gram(self) -> torch.Tensor:
        """The diagonal (Q, Q) blocks of Phi' Phi, one per grid row: (g, R, Q, Q). Within one grid
        row (a leaf) the Q columns couple; across rows of one slot they never do."""
        g, n = self.shape[:2]
        values = self.row_values()
        outer = (values.unsqueeze(-1) * values.unsqueeze(-2)).reshape(g, n, self.q * self.q)
        return self._scatter_rows(outer).view(g, self.n_rows_grid, self.q, self.q)

    def cross_dense(self, dense: torch.Tensor) -> torch.Tensor:
        """Phi' B for a dense block B (g, n, K) -> (g, R Q, K)."""
        g, n = self.shape[:2]
        k = dense.shape[-1]
        source = (self.row_values().unsqueeze(-1) * dense.unsqueeze(2)).reshape(g, n, self.q * k)
        return self._scatter_rows(source).view(g, self.width, k)

    def cross_indexed(self, other: "IndexedBlock") -> torch.Tensor:
        """Phi_self' Phi_other (g, R Q, R' Q'), by a scatter over the T T' slot pairs of each row."""
        g, n, t = self.shape
        t2 = other.shape[-1]
        a, b = self.row_values(), other.row_values()  # (g, n, Q), (g, n, Q')
        pair_values = (a.unsqueeze(-1) * b.unsqueeze(-2)).reshape(g, n, 1, 1, self.q, other.q)
        rows = self.local_index().view(g, n, t, 1).expand(g, n, t, t2)
        cols = other.local_index().view(g, n, 1, t2).expand(g, n, t, t2)
        offsets = torch.arange(g, device=rows.device).view(g, 1, 1, 1) * (self.n_rows_grid * other.n_rows_grid)
        cell = (rows * other.n_rows_grid + cols + offsets).reshape(-1)
        out = torch.zeros(g * self.n_rows_grid * other.n_rows_grid, self.q * other.q, dtype=a.dtype, device=a.device)
        out.index_add_(0, cell, pair_values.expand(g, n, t, t2, self.q, other.q).reshape(-1, self.q * other.q))
        return (out.view(g, self.n_rows_grid, other.n_rows_grid, self.q, other.q)
                .permute(0, 1, 3, 2, 4).reshape(g, self.width, other.width))

    def to_dense(self) -> torch.Tensor:
        """The block as a dense (g, n, R Q) tensor (tests and tiny problems only)."""
        g, n, t = self.shape
        one_hot = torch.zeros(g, n, self.n_rows_grid, dtype=self.row_values().dtype, device=self.flat.device)
        one_hot.scatter_(-1, self.local_index(), 1.0)
        return (one_hot.unsqueeze(-1) * self.row_values().unsqueeze(2)).reshape(g, n, self.width)
