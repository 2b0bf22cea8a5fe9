"""The refit schedule of the adaptive mode and the gathering of window rows into batches of systems.

Refit k = 0..K-1 happens at t_k = test_start + k * step days. In a group's date-sorted history rows,
    window k   = rows dated in [t_k - window, t_k)         -> [lo[k, g], hi[k, g])
    forecast k = rows dated in [t_k, t_k + horizon)        -> [hi[k, g], end[k, g])
    own k      = rows dated in [t_k, t_k + step)           -> [hi[k, g], own[k, g])  (the latest refit's days)
Consecutive windows differ by the rows [hi[k-1], hi[k]) added and [lo[k-1], lo[k]) removed.

A *system* is one (window, group) pair; a batch of S systems is a `GroupedBatch` of S rows of
groups, each padded to the batch's longest range with weight 0, read through `system_design` (the
fitted design whose per-group feature ranges are repeated for each system's group).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
import numpy as np
import pandas as pd
import torch

from tamrun.config.schema import AdaptiveConfig
from tamrun.data.batch import GroupedBatch, RangeScaler
from tamrun.effects.design import AdditiveDesign
from tamrun.errors import ConfigError


@dataclass
class WindowSchedule:
    """K refits over G groups: ``dates`` (K,) refit days; row bounds (K, G) int64 into the history batch."""

    dates: pd.DatetimeIndex
    lo: np.ndarray
    hi: np.ndarray
    end: np.ndarray
    own: np.ndarray

    @property
    def n_windows(self) -> int:
        return len(self.dates)

    @property
    def n_groups(self) -> int:
        return self.lo.shape[1]

    @property
    def window_rows(self) -> int:
        """The longest window (rows of one group)."""
        return int((self.hi - self.lo).max())

    @property
    def horizon_rows(self) -> int:
        """The longest forecast (rows of one group)."""
        return int((self.end - self.hi).max())

    @property
    def step_rows(self) -> int:
        """The most rows one group gains or loses between consecutive windows (added + removed)."""
        if self.n_windows < 2:
            return 0
        return int((np.diff(self.hi, axis=0) + np.diff(self.lo, axis=0)).max())


def history_dates(batch: GroupedBatch, frame_dates: np.ndarray) -> np.ndarray:
    """(G, N) datetime64[ns] of the batch's rows; padding holds the largest date (sorts last)."""
    dates = np.asarray(frame_dates, dtype="datetime64[ns]")[np.maximum(batch.row_index, 0)]
    dates[batch.row_index < 0] = np.datetime64("2262-04-11")
    return dates


def build_schedule(dates: np.ndarray, first_train_day: pd.Timestamp, test_start: pd.Timestamp,
                   last_day: pd.Timestamp, cfg: AdaptiveConfig) -> WindowSchedule:
    """Refits every ``cfg.step`` days from ``test_start`` to ``last_day`` over date-sorted rows ``dates``
    (G, N). Raises `ConfigError` when the first window starts before the training data does."""
    first_window = test_start - pd.Timedelta(days=cfg.window)
    if first_window < first_train_day.normalize():
        available = (test_start - first_train_day.normalize()).days
        raise ConfigError("adaptive.window", cfg.window,
                          f"the first window ({first_window:%Y-%m-%d} to {test_start - pd.Timedelta(days=1):%Y-%m-%d}) "
                          f"starts before the training data ({first_train_day:%Y-%m-%d})",
                          f"set adaptive.window to at most {available} days, or start split.train_start earlier")
    refits = pd.date_range(test_start, last_day.normalize(), freq=f"{cfg.step}D")
    horizon = cfg.horizon if cfg.horizon is not None else cfg.step
    bounds = {name: np.empty((len(refits), dates.shape[0]), dtype=np.int64) for name in ("lo", "hi", "end", "own")}
    offsets = {"lo": -cfg.window, "hi": 0, "end": horizon, "own": cfg.step}
    for name, days in offsets.items():
        edges = (refits + pd.Timedelta(days=days)).to_numpy(dtype="datetime64[ns]")
        for g in range(dates.shape[0]):
            bounds[name][:, g] = np.searchsorted(dates[g], edges, side="left")
    return WindowSchedule(refits, **bounds)


def gather_systems(batch: GroupedBatch, group: np.ndarray, start: np.ndarray, stop: np.ndarray) -> GroupedBatch:
    """Systems s = 0..S-1 holding rows [start[s], stop[s]) of group ``group[s]`` of ``batch``, as one
    padded `GroupedBatch` (padding: weight 0, features 0, row_index -1)."""
    length = max(1, int((stop - start).max())) if len(start) else 1
    rows = torch.as_tensor(start).unsqueeze(1) + torch.arange(length)
    valid = rows < torch.as_tensor(stop).unsqueeze(1)
    rows = torch.minimum(rows, torch.as_tensor(np.maximum(stop - 1, 0)).unsqueeze(1))
    groups = torch.as_tensor(group).unsqueeze(1).expand_as(rows)
    mask = valid.to(batch.x.dtype)
    x = batch.x[groups, rows] * mask.unsqueeze(-1)
    weight = batch.weight[groups, rows] * mask
    row_index = np.where(valid.numpy(), batch.row_index[groups.numpy(), rows.numpy()], -1)
    return GroupedBatch([batch.groups[g] for g in group], batch.columns, x, batch.y[groups, rows] * mask, weight,
                        row_index)


def system_design(design: AdditiveDesign, group: np.ndarray) -> AdditiveDesign:
    """The fitted design read per system: system s uses the feature ranges of group ``group[s]``
    (effects' state is shared; nothing is refitted)."""
    out = copy.copy(design)
    index = torch.as_tensor(group, device=design.scaler.center.device)
    out.scaler = RangeScaler(design.scaler.center[index], design.scaler.half[index])
    return out


def span_rows(start: np.ndarray, stop: np.ndarray):
    """(k, g, n, j): for every history row n of group g in rows [start[k, g], stop[k, g]) (K, G), its offset j
    from start[k, g]."""
    counts = (stop - start).ravel()
    k, g = np.divmod(np.repeat(np.arange(counts.size), counts), start.shape[1])
    j = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return k, g, start[k, g] + j, j


def systems_of(windows: range, groups: range) -> tuple:
    """(window, group) index arrays of the systems of ``windows`` x ``groups``, window-major."""
    k = np.repeat(np.arange(windows.start, windows.stop), len(groups))
    g = np.tile(np.arange(groups.start, groups.stop), len(windows))
    return k, g

