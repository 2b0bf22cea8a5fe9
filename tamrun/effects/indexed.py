"""IndexedBlock: a design block with a few non-zeros per row, kept as indices (never one-hot).

For each row n and slot t = 1..T, a row r = index[n, t] of an (R, Q) coefficient grid is active with
the weights scale * weight[n] * factor[n, :] (factor = 1 and Q = 1 for a plain forest):

    Phi[n, r Q + q] = scale * weight[n] * sum_t 1[index[n, t] = r] * factor[n, q]

i.e. Phi = diag-rows(values) applied to O V, with O the (n, R) 0/1 indicator of the T active grid
rows (T ones per row) and V the (R, Q) coefficient grid. The T active rows of one row n are distinct
(each tree owns its own R / T rows), so
    Phi v        : rowsum(values o (O V))                              (g, n)
    Phi' u       : O' (values o u)                                     (g, R Q)
    diag Phi'Phi : O' (values^2)                                       (g, R Q)
    Phi_a' Phi_b : scatter of products over the slot pairs             (g, D_a, D_b)
O and O' are sparse CSR matrices over the stacked groups (block diagonal, built once per chunk and
shared by all products): each output row sums its terms in a fixed order, so a group's result is
bitwise the same whatever other groups share its chunk. Shapes carry a leading group dimension g.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Iterator, Optional, Tuple

import torch


SORT_SLOTS = 10  # O' is built by sorts of at most this many slots' worth of a chunk's rows: under 48 bytes each of temporaries


def csr_matrix(crow: torch.Tensor, columns: torch.Tensor, values: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """A CSR matrix from arrays built here (valid by construction: no invariant check), without the
    warning that torch's CSR support is in beta."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        return torch.sparse_csr_tensor(crow, columns, values, size=size, check_invariants=False)


def sparse_times(matrix: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """matrix @ dense for a CSR ``matrix`` (m, p) and a row-major ``dense`` (p, k): (m, k), into a fresh
    row-major tensor by ``addmm(out=, beta=0)``. The same sums as ``matrix @ dense``, whose CPU path zeroes
    an output, lets MKL write another and copies it over: 1.6 against 1.2 ms for one of forest x Fourier's
    chunks (docs/benchmarks.md)."""
    out = dense.new_empty(matrix.shape[0], dense.shape[1])
    return torch.addmm(out, matrix, dense, beta=0, out=out)


@dataclass
class IndexedBlock:
    """Built from ``index`` (g, n, T) int32/int64 in [0, R); keeps only its flat form (see `flat`)."""

    index: torch.Tensor  # (g, n, T) int32/int64 in [0, R); released once `flat` is built
    n_rows_grid: int  # R
    scale: float
    factor: Optional[torch.Tensor] = None  # (g, n, Q), None for Q = 1
    weight: Optional[torch.Tensor] = None  # (g, n) row weights (0 for padding), None for 1
    flat: torch.Tensor = field(init=False, repr=False)  # (g n, T) rows of the stacked (g R) grid rows
    shape: Tuple[int, int, int] = field(init=False)
    _q: int = field(init=False)
    _values: Optional[torch.Tensor] = field(default=None, init=False, repr=False)  # row_values()
    _indicator: Optional[torch.Tensor] = field(default=None, init=False, repr=False)  # O, (g n, g R) CSR
    _indicator_t: Optional[torch.Tensor] = field(default=None, init=False, repr=False)  # O', (g R, g n) CSR

    def __post_init__(self) -> None:
        """Index the (g R) rows of the stacked grids, row-major (g n, T): int32 when g R < 2^31."""
        g, n, t = self.index.shape
        self.shape = (g, n, t)
        self._q = 1 if self.factor is None else self.factor.shape[-1]
        dtype = torch.int32 if g * self.n_rows_grid < 2**31 else torch.int64
        offsets = torch.arange(g, device=self.index.device, dtype=dtype).view(g, 1, 1) * self.n_rows_grid
        self.flat = (self.index.to(dtype) + offsets).view(g * n, t)
        self.index = None  # the flat form is all the products need

    @property
    def q(self) -> int:
        return self._q

    @property
    def width(self) -> int:
        return self.n_rows_grid * self.q

    def local_index(self) -> torch.Tensor:
        """(g, n, T) int64 in [0, R) (the Gram route, the dual route and tests)."""
        g, n, t = self.shape
        offsets = torch.arange(g, device=self.flat.device).view(g, 1, 1) * self.n_rows_grid
        return self.flat.long().view(g, n, t) - offsets

    def row_values(self) -> torch.Tensor:
        """(g, n, Q): scale * weight[n] * factor[n, :], computed once (set ``weight`` before the first
        product); the factor is released in favour of it."""
        if self._values is None:
            g, n = self.shape[:2]
            dtype = self.factor.dtype if self.factor is not None else (self.weight.dtype if self.weight is not None
                                                                       else torch.float64)
            values = (self.factor if self.factor is not None
                      else torch.ones(g, n, 1, dtype=dtype, device=self.flat.device)) * self.scale
            self._values = values * self.weight.unsqueeze(-1) if self.weight is not None else values
            self.factor = None
        return self._values

    def prepare(self, dtype: torch.dtype) -> None:
        """Build now what the products build at their first call (the row values; the indicators, which
        products in ``dtype`` use unless torch's deterministic algorithms are on): a block kept between
        products then holds all of it from the start (`tamrun.machine.sampling`: a product allocates only
        its temporaries)."""
        self.row_values()
        if not torch.are_deterministic_algorithms_enabled():
            self.indicators(dtype)

    def indicators(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """O (g n, g R) and O' (g R, g n) as CSR matrices with one shared tensor of ones as values."""
        if self._indicator is None or self._indicator.dtype != dtype:
            g, n, t = self.shape
            rows, grid_rows, index = g * n, g * self.n_rows_grid, self.flat.reshape(-1)
            ones = torch.ones(index.numel(), dtype=dtype, device=index.device)
            crow = torch.arange(0, rows * t + 1, t, dtype=index.dtype, device=index.device)
            self._indicator = csr_matrix(crow, index, ones, (rows, grid_rows))
            crow_t = torch.zeros(grid_rows + 1, dtype=index.dtype, device=index.device)
            torch.cumsum(torch.bincount(index, minlength=grid_rows), 0, out=crow_t[1:])
            columns = torch.empty_like(index)
            for data_rows, slots, first in self._sort_pieces():
                keys = self.flat[data_rows, slots].T.reshape(-1)  # slot-major: a grid row's rows ascending
                order = torch.argsort(keys, stable=True)  # the piece's entries of O', in O''s order
                start = int(crow_t[first])
                order.remainder_(data_rows.stop - data_rows.start).add_(data_rows.start)  # the data rows
                columns[start:start + keys.numel()] = order
                del keys, order
            self._indicator_t = csr_matrix(crow_t, columns, ones, (grid_rows, rows))
        return self._indicator, self._indicator_t

    def _sort_pieces(self) -> Iterator[Tuple[slice, slice, int]]:
        """Pieces of O' built by one sort each: (data rows, slots, first stacked grid row). A piece's grid
        rows are consecutive, so its sorted entries are a run of O''s column indices: whole groups when
        T of them fit in ``SORT_SLOTS`` slots' worth of the chunk's rows (the sort's temporaries, about
        48 bytes an entry, stay within what `tamrun.memory.footprint` plans), else one group's slots a
        few at a time (slot t owns grid rows [t R / T, (t + 1) R / T), the layout of
        `tamrun.effects.forest`)."""
        g, n, t = self.shape
        budget = SORT_SLOTS * g * n  # entries sorted at once
        groups = budget // (n * t) if n * t else g
        if groups >= 1 or self.n_rows_grid % t:
            for g0 in range(0, g, max(groups, 1)):
                g1 = min(g, g0 + max(groups, 1))
                yield slice(g0 * n, g1 * n), slice(0, t), g0 * self.n_rows_grid
            return
        per_slot, slots = self.n_rows_grid // t, max(budget // n, 1)
        for group in range(g):
            for t0 in range(0, t, slots):
                yield slice(group * n, (group + 1) * n), slice(t0, min(t, t0 + slots)), \
                    group * self.n_rows_grid + t0 * per_slot

    def _scatter_rows(self, source: torch.Tensor) -> torch.Tensor:
        """out[r] = sum_{n, t: index[n, t] = r} source[n]: source (g, n, K) -> (g, R K), i.e. O' source.
        Under torch's deterministic algorithms (hw.deterministic), slot by slot with index_add_ (a
        sorted kernel then; a sparse product's sum order is the library's)."""
        g, n, t = self.shape
        k = source.shape[-1]
        rows = source.reshape(g * n, k)
        if torch.are_deterministic_algorithms_enabled():
            out = rows.new_zeros(g * self.n_rows_grid, k)
            for slot in range(t):
                out.index_add_(0, self.flat[:, slot], rows)
            return out.view(g, self.n_rows_grid * k)
        _, indicator_t = self.indicators(source.dtype)
        return sparse_times(indicator_t, rows).view(g, self.n_rows_grid * k)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """v (g, R Q) -> Phi v = rowsum(values o (O V)) (g, n), V = v as an (g R, Q) grid (under torch's
        deterministic algorithms: the T grid rows gathered and summed slot by slot)."""
        g, n, t = self.shape
        grid = v.reshape(g * self.n_rows_grid, self.q)
        if torch.are_deterministic_algorithms_enabled():
            picked = grid[self.flat[:, 0]]
            for slot in range(1, t):
                picked += grid[self.flat[:, slot]]
        else:
            indicator, _ = self.indicators(v.dtype)
            picked = sparse_times(indicator, grid)  # (g n, Q): sum over the T grid rows
        return (picked.view(g, n, self.q) * self.row_values()).sum(dim=-1)

    def rmatvec(self, u: torch.Tensor) -> torch.Tensor:
        """u (g, n) -> Phi' u (g, R Q)."""
        return self._scatter_rows(self.row_values() * u.unsqueeze(-1))

    def rmatmat(self, u: torch.Tensor) -> torch.Tensor:
        """u (g, n, K) -> Phi' u (g, K, R Q): the K products of `rmatvec` as one sparse product with K Q
        columns (each output row of O' still sums its terms in a fixed order: batch invariance holds)."""
        g, n = self.shape[:2]
        k = u.shape[-1]
        source = (u.unsqueeze(-1) * self.row_values().unsqueeze(-2)).reshape(g, n, k * self.q)
        out = self._scatter_rows(source).view(g, self.n_rows_grid, k, self.q)
        return out.permute(0, 2, 1, 3).reshape(g, k, self.width)

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
