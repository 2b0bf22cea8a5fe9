"""Offsets of the config read as pandas offsets: the reach of the history columns (`Span`, `span`,
`check_history`), and the backtest's calendar (``mode=backtest``): its offsets of whole days, and its cut-off
days.

A history column's duration (data.derived.<name>.by, .window, .gap) is ``D`` or ``W``: calendar days, the
same local clock time n days earlier under data.timezone; or ``h``, ``min``, ``s`` (``1.5D`` is 36 h): elapsed
time. A history column that reads data.target (itself, or through earlier derived columns) is refused when it
can see its own row's local day: a day-ahead forecast never reads the target of the day it forecasts.

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

from dataclasses import dataclass
from typing import Dict, List, Optional

import pandas as pd

from tamrun.config.expr import names, parse_expression
from tamrun.config.schema import (HISTORY_KINDS, HISTORY_OVER, ROLLING_ALIGNS, ROLLING_STATS, BacktestConfig,
                                  BacktestRefit, Config, DerivedColumn)
from tamrun.errors import ConfigError

OFFSET_EXAMPLES = "a pandas offset of whole days such as 7D, 1W or 1MS"
SPAN_EXAMPLES = "a pandas offset of days or time such as 1D, 7D, 1W, 12h or 30min"
ONE_DAY = pd.Timedelta(days=1)
LONGEST_DAY = pd.Timedelta(hours=25)  # a local day's length at most (the day the clocks go back)
OWN_FIELDS = {"by": "lag", "window": "rolling", "factor": "smooth", "daily": "smooth"}  # fields of one kind alone


@dataclass(frozen=True)
class Span:
    """A reach back in time: ``days`` calendar days (local days under data.timezone: the same clock time
    ``days`` days earlier), then ``elapsed`` time."""

    days: int = 0
    elapsed: pd.Timedelta = pd.Timedelta(0)

    def __add__(self, other: "Span") -> "Span":
        return Span(self.days + other.days, self.elapsed + other.elapsed)

    def skips_day(self, timezone: Optional[str]) -> bool:
        """Whether t minus this span lies before the local day of t, for every t (a local day lasts up to
        25 hours under a time zone, 24 without)."""
        return self.days >= 1 or self.elapsed >= (LONGEST_DAY if timezone else ONE_DAY)

    @property
    def bound(self) -> pd.Timedelta:
        """An elapsed time at least as long as the span (a calendar day counts 25 hours)."""
        return self.days * LONGEST_DAY + self.elapsed


def span(field: str, value: Optional[str], zero: bool = False) -> Span:
    """``value`` (e.g. ``7D``, ``12h``) as a `Span`; `ConfigError` naming ``field`` when it is not an offset of
    days or time, or not > 0 (>= 0 under ``zero``)."""
    from pandas.tseries.frequencies import to_offset

    try:
        offset = to_offset(str(value).strip()) if value is not None else None
    except ValueError:
        offset = None
    if isinstance(offset, pd.offsets.Day):
        found = Span(days=offset.n)
    elif isinstance(offset, pd.offsets.Week):
        found = Span(days=7 * offset.n)
    elif isinstance(offset, pd.offsets.Tick):
        found = Span(elapsed=pd.Timedelta(offset))
    else:
        raise ConfigError(field, value, "not a pandas offset of days or time" if value is not None else
                          "the duration is not given", f"write {SPAN_EXAMPLES}")
    if found.days < 0 or found.elapsed < pd.Timedelta(0) or (not zero and found == Span()):
        raise ConfigError(field, value, f"the duration must be {'0 or more' if zero else 'more than 0'} (a history "
                          "column reads earlier rows)", f"write {SPAN_EXAMPLES}")
    return found


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


def check_history(cfg: Config) -> None:
    """The history columns of data.derived (kinds lag, rolling, smooth): a column to read, offsets, statistic,
    alignment, factor, ``over``; and none that reads the target of its own row's day (`target_view`)."""
    derived, target, timezone = cfg.data.derived, cfg.data.target, cfg.data.timezone
    for name, spec in derived.items():
        field = f"data.derived.{name}"
        for key, kind in OWN_FIELDS.items():
            if getattr(spec, key) is not None and spec.kind != kind:
                raise ConfigError(f"{field}.{key}", getattr(spec, key), f"a {spec.kind} column has no {key} (a field "
                                  f"of kind {kind})", f"remove {field}.{key}, or set {field}.kind={kind}")
        if spec.kind not in HISTORY_KINDS:
            continue
        if not spec.column:
            raise ConfigError(f"{field}.column", spec.column, f"a {spec.kind} column reads a column",
                              f"set {field}.column to the column it reads (e.g. {field}.column={target})")
        choices = {"over": HISTORY_OVER, **({"stat": ROLLING_STATS, "align": ROLLING_ALIGNS} if spec.kind == "rolling"
                                            else {})}
        for key, allowed in choices.items():
            if getattr(spec, key) not in allowed:
                raise ConfigError(f"{field}.{key}", getattr(spec, key), f"not a {key} of a {spec.kind} column",
                                  f"use one of {', '.join(allowed)}")
        reach(field, spec)
        if spec.kind == "smooth":
            factor = spec.factor
            if factor is None or not 0.0 <= float(factor) < 1.0:
                raise ConfigError(f"{field}.factor", factor, "a smooth's factor weighs the previous value: it lies in "
                                  "[0, 1)", f"set {field}.factor, e.g. 0.95 (0.99 smooths more)")
            if spec.daily is not None and spec.daily not in ROLLING_STATS:
                raise ConfigError(f"{field}.daily", spec.daily, "not a statistic of the day",
                                  f"use one of {', '.join(ROLLING_STATS)}, or null to smooth row by row")
    for name, spec in derived.items():
        if spec.kind in HISTORY_KINDS:
            check_no_peeking(name, derived, target, timezone)


def reach(field: str, spec: DerivedColumn) -> Optional[Span]:
    """How far back before its row a history column reads (its offsets checked): a lag's ``by``, a rolling
    window's gap + window (before the row's local midnight under align: day); None: unbounded (a smooth)."""
    if spec.kind == "lag":
        return span(f"{field}.by", spec.by)
    if spec.kind == "rolling":
        return span(f"{field}.gap", spec.gap, zero=True) + span(f"{field}.window", spec.window)
    return None


def sees_own_day(spec: DerivedColumn, timezone: Optional[str]) -> bool:
    """Whether a history column of a row can read a value of the row's own local day (a lag shorter than a
    day, a rolling window of align: row with a gap under a day, any smooth)."""
    if spec.kind == "lag":
        return not span("by", spec.by).skips_day(timezone)
    if spec.kind == "rolling":
        return spec.align != "day" and not span("gap", spec.gap, zero=True).skips_day(timezone)
    return True


def target_view(column: str, derived: Dict[str, DerivedColumn], target: str, timezone: Optional[str],
                before: int) -> bool:
    """Whether ``column`` (a file column, or one of the first ``before`` derived columns) holds the target of its
    own row's day: the target itself, or a derived column reading it that does not skip the row's day."""
    order = list(derived)
    if column not in order[:before]:
        return column == target
    at = order.index(column)
    spec = derived[column]
    if spec.kind in HISTORY_KINDS:
        return sees_own_day(spec, timezone) and target_view(spec.column, derived, target, timezone, at)
    if spec.kind == "isin":
        return target_view(spec.column, derived, target, timezone, at)
    if spec.kind == "expr":
        read = names(parse_expression(f"data.derived.{column}.expr", spec.expr))
        return any(target_view(name, derived, target, timezone, at) for name in read)
    return False


def check_no_peeking(name: str, derived: Dict[str, DerivedColumn], target: str, timezone: Optional[str]) -> None:
    """`ConfigError` when the history column ``name`` reads the target of its own row's local day."""
    spec = derived[name]
    at = list(derived).index(name)
    if not (sees_own_day(spec, timezone) and target_view(spec.column, derived, target, timezone, at)):
        return
    field = f"data.derived.{name}"
    what = f"data.target={target!r}" + ("" if spec.column == target else f" (through {spec.column!r})")
    key, value = {"lag": ("by", spec.by), "rolling": ("gap", spec.gap)}.get(spec.kind, ("kind", spec.kind))
    fix = {"lag": f"set {field}.by to 1D or more", "rolling": f"set {field}.align=day (the days before the row's), "
           f"or {field}.gap=1D"}.get(spec.kind, "smooth a column known before the target (a temperature), or read "
                                                "the target through a lag of 1D or more or a rolling window of "
                                                "align: day")
    raise ConfigError(f"{field}.{key}", value, f"this {spec.kind} of {what} reads the target of its own row's day: "
                      "a forecast would read the answer (a history column may read the target only up to the end "
                      "of the day before)", fix)
