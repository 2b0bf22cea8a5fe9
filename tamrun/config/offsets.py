"""The backtest's calendar (``mode=backtest``): its offsets read as pandas offsets of whole days, and its
cut-off days.

    cut-off k = split.test_start + k * backtest.step      (k = 0 .. backtest.windows - 1; k = 0: test_start)
    window k trains on [start_k, cut-off k) and is scored on [cut-off k, cut-off k + backtest.horizon)
    start_k   = split.train_start (or the data's first day)  refit=expanding
              = cut-off k - backtest.length                  refit=sliding
              = the first window's                           refit=once

The days are local calendar days (naive midnights); `tamrun.data.dates.table_time` turns them into the
table's time. An anchored offset (``1W``, ``MS``) steps as pandas adds it (``2023-01-15 + 1 MS`` is
``2023-02-01``).
"""

from __future__ import annotations

from typing import List, Optional

import pandas as pd

from tamrun.config.schema import BacktestConfig, BacktestRefit
from tamrun.errors import ConfigError

OFFSET_EXAMPLES = "a pandas offset of whole days such as 7D, 1W or 1MS"


def day_offset(field: str, value: Optional[str]) -> pd.DateOffset:
    """``value`` (e.g. ``7D``) as a pandas offset that moves a midnight forward to a later midnight;
    `ConfigError` naming ``field`` otherwise (not an offset, zero or negative, or not whole days)."""
    from pandas.tseries.frequencies import to_offset

    try:
        offset = to_offset(str(value).strip()) if value is not None else None
    except ValueError:
        offset = None
    if offset is None:
        raise ConfigError(field, value, "not a pandas offset", f"write {OFFSET_EXAMPLES}")
    start = pd.Timestamp("2001-01-01")
    moved = [start + k * offset for k in (1, 2, 3)]
    if moved[0] <= start or any(day != day.normalize() for day in moved):
        raise ConfigError(field, value, "the offset must move a day forward by whole days (the cut-offs and "
                          "horizons are days, as a plain run's splits are)", f"write {OFFSET_EXAMPLES}")
    return offset


def cutoff_days(test_start: str, cfg: BacktestConfig) -> pd.DatetimeIndex:
    """The windows' cut-off days (naive local midnights), strictly increasing."""
    step = day_offset("backtest.step", cfg.step)
    first = pd.Timestamp(str(test_start)).normalize()
    return pd.DatetimeIndex([first] + [first + k * step for k in range(1, cfg.windows)])


def horizon_ends(cutoffs: pd.DatetimeIndex, cfg: BacktestConfig) -> pd.DatetimeIndex:
    """The day after each window's horizon (exclusive ends)."""
    horizon = day_offset("backtest.horizon", cfg.horizon)
    return pd.DatetimeIndex([day + horizon for day in cutoffs])


def start_days(cutoffs: pd.DatetimeIndex, cfg: BacktestConfig, first: Optional[pd.Timestamp]) -> List[
        Optional[pd.Timestamp]]:
    """The first training day of each window (None: the first row), by ``cfg.refit`` (``first``:
    split.train_start's day or None)."""
    if cfg.refit == BacktestRefit.sliding:
        length = day_offset("backtest.length", cfg.length)
        return [day - length for day in cutoffs]
    return [first] * len(cutoffs)


def check_backtest(test_start: str, cfg: BacktestConfig) -> None:
    """The settings of mode=backtest that need no data: the offsets, and refit=sliding's length."""
    if cfg.refit == BacktestRefit.sliding and cfg.length is None:
        raise ConfigError("backtest.length", None, "backtest.refit=sliding trains each window on the rows of a "
                          "span before its cut-off, and the span is not given",
                          "set backtest.length (a pandas offset of whole days such as 365D), or "
                          "backtest.refit=expanding")
    if cfg.length is not None:
        day_offset("backtest.length", cfg.length)
    horizon_ends(cutoff_days(test_start, cfg), cfg)
