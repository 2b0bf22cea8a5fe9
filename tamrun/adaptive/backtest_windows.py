"""The backtest's windows over the history rows, and each window's design.

In a group's date-sorted history rows (every row from split.train_start to the last horizon's end),
window k (cut-off c_k, `tamrun.config.offsets`) is
    training rows   [lo[k, g], hi[k, g])      dated in [start_k, c_k)   (refit=once: window 0's)
    scored rows     [ahead[k, g], end[k, g])  dated in [c_k, c_k + horizon)
with the days turned into the table's time by `tamrun.data.dates.table_time` (local midnights).

A plain run (mode=run) fits its design on its own training rows: the per-group feature ranges, the
categorical levels, the forest thresholds. So does each window here (`window_designs`): the design is
copied and fitted on the window's training rows. Consecutive windows whose effects hold the same state
(`tamrun.effects.design.same_effects`) form one *segment*, fitted as one batch of systems through a
design whose feature ranges are stacked per (window, group) (`stacked_design`); where a system's
ranges differ from the previous window's (`range_changes`), its Gram is recomputed from its rows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.adaptive.windows import WindowSchedule
from tamrun.config.offsets import cutoff_days, horizon_ends, start_days
from tamrun.config.schema import BacktestConfig, BacktestRefit
from tamrun.data.batch import GroupedBatch, RangeScaler
from tamrun.data.dates import table_time
from tamrun.effects.design import AdditiveDesign, same_effects
from tamrun.errors import DataError


@dataclass
class BacktestSchedule:
    """K windows over G groups: the local days (``cutoffs``, ``ends``: the day after each horizon,
    ``starts``: each window's first training day, None: the first row) and the row bounds (K, G):
    ``rows`` (lo, hi: training; end: the horizon's end) and ``ahead`` (the horizon's first row)."""

    cutoffs: pd.DatetimeIndex
    ends: pd.DatetimeIndex
    starts: List[Optional[pd.Timestamp]]
    rows: WindowSchedule
    ahead: np.ndarray

    @property
    def n_windows(self) -> int:
        return len(self.cutoffs)

    def train_rows(self) -> np.ndarray:
        """(K,) training rows of each window (all groups)."""
        return (self.rows.hi - self.rows.lo).sum(axis=1)

    def scored_rows(self) -> np.ndarray:
        """(K,) horizon rows of each window (all groups)."""
        return (self.rows.end - self.ahead).sum(axis=1)


def row_bounds(dates: np.ndarray, days: pd.DatetimeIndex, timezone: Optional[str]) -> np.ndarray:
    """(len(days), G): the first row of each group dated at or after each local day."""
    edges = table_time(pd.DatetimeIndex(days), timezone).to_numpy(dtype="datetime64[ns]")
    return np.stack([np.searchsorted(dates[g], edges, side="left") for g in range(dates.shape[0])], axis=1)


def build_backtest(dates: np.ndarray, cfg: BacktestConfig, test_start: str, first: Optional[pd.Timestamp],
                   timezone: Optional[str]) -> BacktestSchedule:
    """The windows over date-sorted rows ``dates`` (G, N) (padding sorts last); ``first``: split.train_start's
    day or None."""
    cutoffs = cutoff_days(test_start, cfg)
    ends, starts = horizon_ends(cutoffs, cfg), start_days(cutoffs, cfg, first)
    hi, end = row_bounds(dates, cutoffs, timezone), row_bounds(dates, ends, timezone)
    lo = np.zeros_like(hi)
    if cfg.refit == BacktestRefit.sliding:
        lo = row_bounds(dates, pd.DatetimeIndex(starts), timezone)
    ahead = hi.copy()
    if cfg.refit == BacktestRefit.once:  # every window is window 0's fit
        lo, hi = np.repeat(lo[:1], len(cutoffs), axis=0), np.repeat(hi[:1], len(cutoffs), axis=0)
    return BacktestSchedule(cutoffs, ends, starts, WindowSchedule(cutoffs, lo, hi, end, ahead), ahead)


def check_windows(schedule: BacktestSchedule, batch: GroupedBatch, last_date: pd.Timestamp,
                  timezone: Optional[str], cfg: BacktestConfig) -> None:
    """`DataError` naming the setting to change: a window's horizon beyond the data's last day, a window
    without training rows, a group scored in a window it has no training rows in, a window with no row to
    score."""
    last_day = table_time(schedule.ends - pd.Timedelta(days=1), timezone)
    fits = int(np.sum(last_day <= last_date))
    if fits < schedule.n_windows:
        k = schedule.n_windows - 1
        raise DataError("backtest.windows", cfg.windows, f"window {k}'s horizon ends on "
                        f"{schedule.ends[k] - pd.Timedelta(days=1):%Y-%m-%d}, after the data's last date "
                        f"({last_date:%Y-%m-%d %H:%M})", f"set backtest.windows={max(fits, 1)} or fewer, a shorter "
                        "backtest.step / backtest.horizon, or an earlier split.test_start")
    rows, train = schedule.rows, schedule.train_rows()
    for k in range(schedule.n_windows):
        where = f"window {k} (cut-off {schedule.cutoffs[k]:%Y-%m-%d})"
        if train[k] == 0:
            field, value = (("backtest.length", cfg.length) if cfg.refit == BacktestRefit.sliding
                            else ("split.test_start", None))
            raise DataError(field, value or str(schedule.cutoffs[0].date()), f"{where} has no training rows before "
                            "its cut-off", "start split.test_start later (after the data's first days)"
                            + (", or set a longer backtest.length" if field == "backtest.length" else ""))
        orphan = np.nonzero((rows.hi[k] == rows.lo[k]) & (rows.end[k] > schedule.ahead[k]))[0]
        if len(orphan):
            raise DataError("data.group", batch.groups[orphan[0]], f"{where} scores group {batch.groups[orphan[0]]!r}, "
                            "which has no training rows before that cut-off", "start split.test_start later"
                            + (", or set a longer backtest.length" if cfg.refit == BacktestRefit.sliding else "")
                            + ", or drop that group")
        if schedule.scored_rows()[k] == 0:
            raise DataError("backtest.step", cfg.step, f"{where} has no rows in its horizon (a gap in the data)",
                            "choose a split.test_start and backtest.step whose horizons hold rows")


def window_designs(base: AdditiveDesign, history: GroupedBatch, rows: WindowSchedule,
                   refit: BacktestRefit) -> List[AdditiveDesign]:
    """Each window's design, copied from ``base`` and fitted on the window's training rows, as a plain run
    fits it (refit=once: window 0's for every window): its ranges (`window_ranges`), then its stateful effects
    on the rows [lo, hi) of each group. A group without training rows in a window gets the ranges (0, 1): it
    has nothing to fit nor to score there."""
    designs: List[AdditiveDesign] = []
    x, position = history.x.cpu(), torch.arange(history.x.shape[1])
    prefix = PrefixRanges(x) if (rows.lo == 0).all() and refit != BacktestRefit.once else None
    for k in range(rows.n_windows):
        if refit == BacktestRefit.once and designs:
            designs.append(designs[0])
            continue
        lo, hi = torch.as_tensor(rows.lo[k]), torch.as_tensor(rows.hi[k])
        real = (position >= lo.unsqueeze(1)) & (position < hi.unsqueeze(1))
        scaler = prefix.scaler(hi) if prefix is not None else window_ranges(history, real)
        designs.append(copy.deepcopy(base).fit_rows(scaler, x, real))
    return designs


def window_ranges(history: GroupedBatch, real: torch.Tensor) -> RangeScaler:
    """The per-group ranges of the rows ``real`` (G, N) of ``history`` (`RangeScaler.fit`); (0, 1) for a
    group without rows."""
    scaler = RangeScaler.fit(GroupedBatch(history.groups, history.columns, history.x.cpu(), history.y,
                                          real.to(history.x.dtype), history.row_index))
    return empty_ranges(scaler, real.any(dim=1))


def empty_ranges(scaler: RangeScaler, fed: torch.Tensor) -> RangeScaler:
    """``scaler`` with the ranges (0, 1) for the groups that are not ``fed`` (G,)."""
    scaler.center[~fed], scaler.half[~fed] = 0.0, 1.0
    return scaler


class PrefixRanges:
    """The ranges of every prefix of each group's date-sorted rows (windows that all start at the first row):
    running minima and maxima (G, N, F), read at each window's last row. The same values as `RangeScaler.fit`
    of the prefix's rows, by the same arithmetic."""

    def __init__(self, x: torch.Tensor) -> None:
        self.low, self.high = torch.cummin(x, dim=1).values, torch.cummax(x, dim=1).values

    def scaler(self, hi: torch.Tensor) -> RangeScaler:
        """The ranges of rows [0, hi[g]) of each group g."""
        groups, last = torch.arange(len(hi)), (hi - 1).clamp_min(0)
        low, high = self.low[groups, last], self.high[groups, last]
        half = (high - low) / 2
        scaler = RangeScaler(center=(high + low) / 2, half=torch.where(half > 0, half, torch.ones_like(half)))
        return empty_ranges(scaler, hi > 0)


def segments(designs: List[AdditiveDesign]) -> List[Tuple[int, int]]:
    """[start, stop) runs of consecutive windows whose effects hold the same state."""
    out, start = [], 0
    for k in range(1, len(designs)):
        if designs[k] is not designs[k - 1] and not same_effects(designs[k], designs[k - 1]):
            out.append((start, k))
            start = k
    return out + [(start, len(designs))]


def stacked_design(designs: List[AdditiveDesign]) -> AdditiveDesign:
    """The first design with the feature ranges of every window's groups stacked: system (k, g) of these
    windows reads row k * G + g (`tamrun.adaptive.windows.system_design`)."""
    out = copy.copy(designs[0])
    out.scaler = RangeScaler(torch.cat([d.scaler.center for d in designs]), torch.cat([d.scaler.half for d in designs]))
    return out


def range_changes(designs: List[AdditiveDesign]) -> np.ndarray:
    """(K, G): whether group g's feature ranges in window k differ from window k - 1's (True for k = 0)."""
    changed = np.ones((len(designs), designs[0].scaler.center.shape[0]), dtype=bool)
    for k in range(1, len(designs)):
        a, b = designs[k].scaler, designs[k - 1].scaler
        changed[k] = ((a.center != b.center) | (a.half != b.half)).any(dim=1).numpy()
    return changed
