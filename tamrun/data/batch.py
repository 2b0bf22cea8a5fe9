"""Arrange a split's rows as padded per-group tensors and learn the per-group feature ranges.

Shapes: G groups, N = the largest group's row count, F feature columns. Ragged groups are padded
with weight 0, so a padded row contributes nothing to Phi'W Phi or Phi'W y.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.data.checks import plain
from tamrun.errors import DataError


@dataclass
class GroupedBatch:
    """One split as a batch: ``x`` (G, N, F) raw features, ``y`` (G, N), ``weight`` (G, N) in {0, 1},
    ``row_index`` (G, N) the row's position in the split's frame (-1 for padding)."""

    groups: list
    columns: list
    x: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    row_index: np.ndarray

    @property
    def counts(self) -> torch.Tensor:
        """(G,) rows per group."""
        return self.weight.sum(dim=1)

    def to(self, device: torch.device) -> "GroupedBatch":
        return GroupedBatch(self.groups, self.columns, self.x.to(device), self.y.to(device),
                            self.weight.to(device), self.row_index)


def build_batch(frame: pd.DataFrame, columns: Sequence[str], target: str, group: Optional[str],
                dtype: torch.dtype, groups: Optional[list] = None) -> GroupedBatch:
    """Pad ``frame`` into a `GroupedBatch` (rows keep their order within a group).

    ``groups`` fixes the group order (the training groups, for a test split); a test group
    unseen in training raises `DataError`.
    """
    keys = frame[group].to_numpy() if group else np.zeros(len(frame), dtype=np.int64)
    if groups is None:
        groups = sorted(pd.unique(keys).tolist())
    gidx = pd.Index(groups).get_indexer(keys).astype(np.int64)  # one vectorised lookup, not one per row
    if (gidx < 0).any():
        unseen = keys[int(np.argmax(gidx < 0))]
        raise DataError("data.group", group, f"group {plain(unseen)!r} appears in the test split but not in training",
                        "train on a period that covers every group, or drop that group")
    order = np.argsort(gidx, kind="stable")
    counts = np.bincount(gidx, minlength=len(groups))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(len(keys)) - np.repeat(starts, counts)
    n_max = int(counts.max()) if len(counts) else 0
    rows, g_sorted = order, gidx[order]

    at = (torch.from_numpy(g_sorted), torch.from_numpy(pos))
    x = torch.zeros((len(groups), n_max, len(columns)), dtype=dtype)
    for i, column in enumerate(columns):  # one column at a time: two (rows,) float64 temporaries at the peak
        x[at + (i,)] = column_values(frame, column, rows, dtype)
    y = torch.zeros((len(groups), n_max), dtype=dtype)
    y[at] = column_values(frame, target, rows, dtype)
    weight = torch.zeros((len(groups), n_max), dtype=dtype)
    weight[at] = 1.0
    row_index = np.full((len(groups), n_max), -1, dtype=np.int64)
    row_index[g_sorted, pos] = rows
    return GroupedBatch(list(groups), list(columns), x, y, weight, row_index)


def column_values(frame: pd.DataFrame, column: str, rows: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``frame[column]`` in the order ``rows`` as a ``dtype`` tensor, checked against its range first
    (`check_range`)."""
    values = frame[column].to_numpy(dtype=np.float64)
    check_range(column, values, dtype)
    return torch.from_numpy(values[rows]).to(dtype)


def check_range(column: str, values: np.ndarray, dtype: torch.dtype) -> None:
    """`DataError` naming the dtype when a column's values (float64) exceed what ``dtype`` holds (they
    would turn infinite in the cast)."""
    largest = torch.finfo(dtype).max
    peak = float(np.max(np.abs(values))) if values.size else 0.0
    if peak > largest:
        kind = str(dtype).replace("torch.", "")
        raise DataError("dtype", kind, f"column {column!r} reaches {peak:.3g}, beyond {kind}'s range "
                        f"({largest:.3g})", "use dtype=float64, or rescale the column")


def feature_ranges(batch: GroupedBatch) -> Tuple[torch.Tensor, torch.Tensor]:
    """(lowest, highest) value (G, F) of each group's real rows, per feature, one feature at a time (two
    (G, N) temporaries at the peak)."""
    padded = batch.weight <= 0
    hi = batch.x.new_empty(batch.x.shape[0], batch.x.shape[-1])
    lo = torch.empty_like(hi)
    for feature in range(batch.x.shape[-1]):
        column = batch.x[..., feature]
        hi[:, feature] = column.masked_fill(padded, -torch.inf).amax(dim=1)
        lo[:, feature] = column.masked_fill(padded, torch.inf).amin(dim=1)
    return lo, hi


@dataclass
class RangeScaler:
    """Per-group affine map of each feature to [-1, 1] over its training range:
    z = (x - center) / half, center = (max + min) / 2, half = (max - min) / 2 (1 if constant).
    ``center`` and ``half`` are (G, F)."""

    center: torch.Tensor
    half: torch.Tensor

    @classmethod
    def fit(cls, batch: GroupedBatch) -> "RangeScaler":
        """The ranges of the real rows (`feature_ranges`)."""
        lo, hi = feature_ranges(batch)
        half = (hi - lo) / 2
        return cls(center=(hi + lo) / 2, half=torch.where(half > 0, half, torch.ones_like(half)))

    def apply(self, x: torch.Tensor, group_slice: slice = slice(None), columns: Sequence[int] | slice = slice(None)
              ) -> torch.Tensor:
        """Scale ``x`` (g, n, f) whose groups are ``group_slice`` and features ``columns`` of the fitted ones."""
        return (x - self.center[group_slice][:, columns].unsqueeze(1)) / self.half[group_slice][:, columns].unsqueeze(1)

    def to(self, device: torch.device) -> "RangeScaler":
        return RangeScaler(self.center.to(device), self.half.to(device))
