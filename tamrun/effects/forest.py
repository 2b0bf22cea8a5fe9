"""Random-binning forest: T oblivious random trees of depth d over one or more scaled features.

Tree t splits at level l on feature f_{t,l} (uniform among the effect's columns) at threshold
c_{t,l} = min + u_{t,l} (max - min) over that feature's scaled training values (``split=uniform``)
or their u_{t,l}-quantile (``split=quantile``), u uniform in (0, 1).
A row's leaf in tree t is sum_l 2^l 1[z_{f_{t,l}} > c_{t,l}] (L = 2^d leaves); its column is
t L + leaf. Phi = one-hot of the T leaves / sqrt(T): T non-zeros among T L columns, kept as an
`IndexedBlock` of leaf indices. Penalty lambda I. Deterministic given the seed.
"""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch

from tamrun.config.effects import ForestSpec
from tamrun.effects.base import IndexedEffect
from tamrun.effects.indexed import IndexedBlock


class ForestEffect(IndexedEffect):
    def __init__(self, name: str, spec: ForestSpec, seed: int) -> None:
        super().__init__(name, spec.column, spec.ap)
        self.others = list(spec.others or [])
        self.n_trees, self.depth, self.split = spec.n_trees, spec.max_depth, spec.split
        generator = torch.Generator().manual_seed(int(spec.seed if spec.seed is not None else seed))
        self.features = torch.randint(len(self.columns), (self.n_trees, self.depth), generator=generator)
        self.quantile_levels = torch.rand(self.n_trees, self.depth, generator=generator, dtype=torch.float64)
        self.thresholds = torch.zeros(self.n_trees, self.depth, dtype=torch.float64)

    @property
    def columns(self) -> List[str]:
        return [self.column] + self.others

    @property
    def leaves(self) -> int:
        return 2 ** self.depth

    @property
    def width(self) -> int:
        return self.n_trees * self.leaves

    @property
    def slots(self) -> int:
        """Non-zeros per row (T)."""
        return self.n_trees

    @property
    def grid_q(self) -> int:
        """Columns per grid row (Q = 1: one column per leaf)."""
        return 1

    @property
    def index_dtype(self) -> torch.dtype:
        """The leaves' column indices t L + leaf: int32, int64 if T L >= 2^31."""
        return torch.int32 if self.width < 2**31 else torch.int64

    @property
    def leaf_dtype(self) -> torch.dtype:
        """`leaf_index`'s leaves while it builds them: one byte while d <= 8 (L <= 256), else the index's."""
        return torch.uint8 if self.depth <= 8 else self.index_dtype

    @property
    def work_width(self) -> int:
        # the picked features (T, in the chunk's dtype, counted as 8 bytes), the comparisons (T bytes) and
        # the leaves being built (`leaf_dtype`), the columns' (C, n) copy, besides the leaves themselves
        # (`slots`): in 8-byte columns
        leaf_bytes = self.leaf_dtype.itemsize
        return self.n_trees + ((1 + leaf_bytes) * self.n_trees + 7) // 8 + len(self.columns)

    def fit(self, raw: np.ndarray, scaled: np.ndarray) -> None:
        """Thresholds from each chosen feature's scaled training values (see the module docstring)."""
        thresholds = np.empty((self.n_trees, self.depth))
        features, levels = self.features.numpy(), self.quantile_levels.numpy()
        for f in range(len(self.columns)):
            chosen = features == f
            if not chosen.any():
                continue
            values = scaled[:, f]
            if self.split == "quantile":
                thresholds[chosen] = np.quantile(values, levels[chosen])
            else:
                thresholds[chosen] = values.min() + levels[chosen] * (values.max() - values.min())
        self.thresholds = torch.as_tensor(thresholds)

    def leaf_index(self, scaled: torch.Tensor) -> torch.Tensor:
        """scaled (..., n, C) -> (..., n, T) column index t L + leaf (int32, int64 if T L >= 2^31).

        Tree-major, one level at a time: each tree's split feature is picked from the columns laid out
        as (C, n) rows (a row copy per tree), compared with the level's thresholds into (T, n), and 2^l
        is added to the tree's leaf, kept in one byte per row and tree while d <= 8; the (T, n) leaves
        are then laid out row-major with t L added. Integer results: the same leaves in any layout.
        Per row: the picked features T s, the comparisons T and the leaves T bytes (with the columns'
        copy C s), then the int32 or int64 leaves."""
        lead, n_cols = scaled.shape[:-1], scaled.shape[-1]
        dtype = self.index_dtype
        device = scaled.device
        features = self.features.to(device)
        thresholds = self.thresholds.to(device=device, dtype=scaled.dtype)
        columns = scaled.reshape(-1, n_cols).T.contiguous()  # (C, n)
        n_rows = columns.shape[1]
        leaf = torch.zeros(self.n_trees, n_rows, dtype=self.leaf_dtype, device=device)
        picked = torch.empty(leaf.shape, dtype=scaled.dtype, device=device)
        above = torch.empty(leaf.shape, dtype=torch.bool, device=device)
        for level in range(self.depth):
            torch.index_select(columns, 0, features[:, level], out=picked)
            torch.gt(picked, thresholds[:, level, None], out=above)
            leaf.add_(above.to(leaf.dtype), alpha=2 ** level)
        del picked, above, columns
        offsets = torch.arange(self.n_trees, device=device, dtype=dtype) * self.leaves
        index = torch.empty(n_rows, self.n_trees, dtype=dtype, device=device)
        torch.add(leaf.T, offsets, out=index)
        return index.view(*lead, self.n_trees)

    def indexed_block(self, raw: torch.Tensor, scaled: torch.Tensor,
                      factor: Optional[torch.Tensor] = None) -> IndexedBlock:
        """The leaves as an `IndexedBlock`; ``factor`` (..., n, Q) weights each leaf's Q columns (crossings)."""
        return IndexedBlock(self.leaf_index(scaled), self.width, 1.0 / math.sqrt(self.n_trees), factor=factor)

    def structure(self) -> torch.Tensor:
        return torch.ones(self.width, dtype=torch.float64)

    def grid_penalty(self) -> torch.Tensor:
        """M with P = kron(I_R, M): (1, 1)."""
        return torch.ones(1, 1, dtype=torch.float64)
