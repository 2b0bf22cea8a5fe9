"""The experts' forecasts laid out as B series on a day grid, the shape the rules (tamrun/aggregate/rules.py) read.

    table rows (date, group, actual, K expert columns)
        per_group=true:  series b = group b (B = G), the group's rows of day t in slots r
        per_group=false: one series (B = 1), every group's rows of day t in slots r
    -> forecasts (B, T, R, K), target and observed (B, T, R); ``day`` and ``slot`` (n,) of each table row
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from tamrun.adaptive.state_space import day_grid


@dataclass
class SeriesGrid:
    """``forecasts`` (B, T, R, K), ``target`` (B, T, R), ``observed`` (B, T, R) bool on the host; ``days`` (T,)
    datetime64[D]; each table row's ``series``, ``day`` and ``slot`` (n,)."""

    forecasts: torch.Tensor
    target: torch.Tensor
    observed: torch.Tensor
    days: np.ndarray
    series: np.ndarray
    day: np.ndarray
    slot: np.ndarray

    def day_index(self, day: pd.Timestamp) -> int:
        """The first grid day on or after ``day``."""
        return int(np.searchsorted(self.days, np.datetime64(day.date(), "D")))

    def rows(self, values: torch.Tensor) -> np.ndarray:
        """The table rows' entries (n, ...) of ``values`` (B, T, R, ...) on the grid."""
        return values[self.series, self.day, self.slot].numpy()


def series_grid(table: pd.DataFrame, experts: list, per_group: bool, dtype: torch.dtype) -> SeriesGrid:
    """The rows of ``table`` (date-sorted; date, group, actual and the ``experts`` columns) on a day grid."""
    keys = table["group"].to_numpy() if per_group else np.zeros(len(table), dtype=np.int64)
    _, series = np.unique(keys, return_inverse=True)
    order = np.argsort(series, kind="stable")
    counts = np.bincount(series)
    position = np.empty(len(table), dtype=np.int64)
    position[order] = np.arange(len(table)) - np.repeat(np.cumsum(counts) - counts, counts)
    shape = (len(counts), int(counts.max()))
    dates = np.full(shape, np.datetime64("2262-04-11"), dtype="datetime64[ns]")
    dates[series, position] = table["date"].to_numpy(dtype="datetime64[ns]")
    real = np.zeros(shape, dtype=bool)
    real[series, position] = True
    grid = day_grid(dates, real)
    values = torch.zeros(shape + (len(experts) + 1,), dtype=dtype)
    values[series, position] = torch.as_tensor(table[["actual", *experts]].to_numpy(dtype=np.float64), dtype=dtype)
    placed = grid.place(values)
    observed = grid.place(torch.as_tensor(real), False)
    return SeriesGrid(placed[..., 1:].contiguous(), placed[..., 0].contiguous(), observed, grid.days, series,
                      grid.day[series, position], grid.slot[series, position])
