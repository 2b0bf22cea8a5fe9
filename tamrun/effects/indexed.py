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
from typing import Optional

import torch


@dataclass
class IndexedBlock:
    index: torch.Tensor  # (g, n, T) int64 in [0, R)
    n_rows_grid: int  # R
    scale: float
    factor: Optional[torch.Tensor] = None  # (g, n, Q), None for Q = 1
    weight: Optional[torch.Tensor] = None  # (g, n) row weights (0 for padding), None for 1
    _flat_index: Optional[torch.Tensor] = field(default=None, repr=False)

    @property
    def q(self) -> int:
        return 1 if self.factor is None else self.factor.shape[-1]

    @property
    def width(self) -> int:
        return self.n_rows_grid * self.q

    def row_values(self) -> torch.Tensor:
        """(g, n, Q): scale * weight[n] * factor[n, :]."""
        g, n = self.index.shape[:2]
        dtype = self.factor.dtype if self.factor is not None else (self.weight.dtype if self.weight is not None
                                                                   else torch.float64)
        values = (self.factor if self.factor is not None
                  else torch.ones(g, n, 1, dtype=dtype, device=self.index.device)) * self.scale
        return values * self.weight.unsqueeze(-1) if self.weight is not None else values

    def _flat(self) -> torch.Tensor:
        """(T, g n) indices into the (g R) rows of the stacked grids, slot-major so that consecutive
        entries stay inside one tree's leaves (cache-friendly); computed once per block."""
        if self._flat_index is None:
            g, n, t = self.index.shape
            offsets = torch.arange(g, device=self.index.device).view(g, 1, 1) * self.n_rows_grid
            self._flat_index = (self.index + offsets).permute(2, 0, 1).reshape(t, g * n).contiguous()
        return self._flat_index

    def _scatter_rows(self, source: torch.Tensor) -> torch.Tensor:
        """out[r] = sum_{n, t: index[n, t] = r} source[n]: source (g, n, Q) -> (g, R Q)."""
        g, n, t = self.index.shape
        q = source.shape[-1]
        flat = self._flat()
        if q == 1:  # one scatter over all slots
            out = torch.zeros(g * self.n_rows_grid, dtype=source.dtype, device=source.device)
            out.scatter_add_(0, flat.reshape(-1), source.reshape(1, g * n).expand(t, g * n).reshape(-1))
        else:  # one row-wise add per slot: no (T, g n, Q) temporary
            out = torch.zeros(g * self.n_rows_grid, q, dtype=source.dtype, device=source.device)
            rows = source.reshape(g * n, q)
            for slot in range(t):
                out.index_add_(0, flat[slot], rows)
        return out.view(g, self.n_rows_grid * q)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """v (g, R Q) -> Phi v (g, n)."""
        g, n, t = self.index.shape
        flat = self._flat()
        if self.q == 1:
            picked = v.reshape(-1).index_select(0, flat.reshape(-1)).view(t, g, n).sum(dim=0)
            return picked * self.row_values()[..., 0]
        grid = v.reshape(g * self.n_rows_grid, self.q)
        picked = grid.index_select(0, flat[0])
        for slot in range(1, t):
            picked += grid.index_select(0, flat[slot])
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
        g, n = self.index.shape[:2]
        values = self.row_values()
        outer = (values.unsqueeze(-1) * values.unsqueeze(-2)).reshape(g, n, self.q * self.q)
        return self._scatter_rows(outer).view(g, self.n_rows_grid, self.q, self.q)

    def cross_dense(self, dense: torch.Tensor) -> torch.Tensor:
        """Phi' B for a dense block B (g, n, K) -> (g, R Q, K)."""
        g, n = self.index.shape[:2]
        k = dense.shape[-1]
        source = (self.row_values().unsqueeze(-1) * dense.unsqueeze(2)).reshape(g, n, self.q * k)
        return self._scatter_rows(source).view(g, self.width, k)

    def cross_indexed(self, other: "IndexedBlock") -> torch.Tensor:
        """Phi_self' Phi_other (g, R Q, R' Q'), by a scatter over the T T' slot pairs of each row."""
        g, n, t = self.index.shape
        t2 = other.index.shape[-1]
        a, b = self.row_values(), other.row_values()  # (g, n, Q), (g, n, Q')
        pair_values = (a.unsqueeze(-1) * b.unsqueeze(-2)).reshape(g, n, 1, 1, self.q, other.q)
        rows = self.index.view(g, n, t, 1).expand(g, n, t, t2)
        cols = other.index.view(g, n, 1, t2).expand(g, n, t, t2)
        offsets = torch.arange(g, device=rows.device).view(g, 1, 1, 1) * (self.n_rows_grid * other.n_rows_grid)
        cell = (rows * other.n_rows_grid + cols + offsets).reshape(-1)
        out = torch.zeros(g * self.n_rows_grid * other.n_rows_grid, self.q * other.q, dtype=a.dtype, device=a.device)
        out.index_add_(0, cell, pair_values.expand(g, n, t, t2, self.q, other.q).reshape(-1, self.q * other.q))
        return (out.view(g, self.n_rows_grid, other.n_rows_grid, self.q, other.q)
                .permute(0, 1, 3, 2, 4).reshape(g, self.width, other.width))

    def to_dense(self) -> torch.Tensor:
        """The block as a dense (g, n, R Q) tensor (tests and tiny problems only)."""
        g, n, t = self.index.shape
        one_hot = torch.zeros(g, n, self.n_rows_grid, dtype=self.row_values().dtype, device=self.index.device)
        one_hot.scatter_(-1, self.index, 1.0)
        return (one_hot.unsqueeze(-1) * self.row_values().unsqueeze(2)).reshape(g, n, self.width)
