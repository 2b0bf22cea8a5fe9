"""Derived columns that read earlier rows (kinds lag, rolling, smooth), per group in time order.

    lag       the value of ``column`` at exactly t - by in the row's group; NaN when no row has that date
              (a gap keeps its meaning: this is never "k rows back")
    rolling   the mean, min or max (``stat``) of the rows of the group in [t - gap - window, t - gap)
              (align: row), or in [m - gap - window, m - gap), m the local midnight that starts t's day
              (align: day: with window 1D, the previous day's level); NaN values are skipped, an empty window
              is NaN
    smooth    s = factor * s_prev + (1 - factor) * x in time order, s_first = x_first (pandas'
              ``ewm(alpha=1 - factor, adjust=False)``); a NaN leaves s as it was (``ignore_na=True``) and a
              gap in time is one step; ``daily``: the column's mean, min or max of each local day smoothed
              day by day, each row given its own day's value

Durations are `tamrun.config.offsets.Span`: D and W count local calendar days under data.timezone (the same
clock time n days earlier: 23 or 25 hours across a clock change), h, min and s elapsed time. A local time
that does not exist (the hour the clocks skip) has no row: its lag is NaN; one that reads twice is its first
(summer time). A window's bound at such a time moves to the hour after, or to the first of the two.

A fitted model keeps each group's last rows for its lags and windows (`HistoryTail`) and each smooth's value at
the table's end (`SmoothEnd`): rows sent after the end continue the smooth from it (`continued_smooth`).

``over: group`` (default) reads each group of data.group apart; ``over: table`` reads every row in one time
order (each date at most once). The frame's order is kept: its rows are sorted stably by (group, date) once,
computed, and put back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import numpy as np
import pandas as pd

from tamrun.config.expr import names, parse_expression
from tamrun.config.offsets import Span, reach, span
from tamrun.config.schema import HISTORY_KINDS, DerivedColumn
from tamrun.data.file_kind import use_one_of
from tamrun.errors import DataError

UNBOUNDED = pd.Timedelta.max  # the reach of a smooth: every earlier row
SMOOTH_BLOCK = 128  # time steps a smooth advances at once (one (B, B) product per block)


def reads_history(derived: Mapping[str, DerivedColumn]) -> bool:
    """Whether a derived column reads earlier rows."""
    return any(spec.kind in HISTORY_KINDS for spec in derived.values())


def lookback(derived: Mapping[str, DerivedColumn]) -> Optional[pd.Timedelta]:
    """How far before the first row it derives the history columns read, as an elapsed time at least as long
    (the longest column's reach, a column's source's added when it reads an earlier derived column); None: no
    history column; `UNBOUNDED`: a smooth."""
    if not reads_history(derived):
        return None
    order = list(derived)
    reaches: Dict[str, pd.Timedelta] = {}
    for at, (name, spec) in enumerate(derived.items()):
        sources = [spec.column] if spec.kind in (*HISTORY_KINDS, "isin") else \
            names(parse_expression(f"data.derived.{name}.expr", spec.expr)) if spec.kind == "expr" else []
        before = max((reaches.get(source, pd.Timedelta(0)) for source in sources if source in order[:at]),
                     default=pd.Timedelta(0))
        own = reach(f"data.derived.{name}", spec) if spec.kind in HISTORY_KINDS else Span()
        if own is None or before == UNBOUNDED:
            reaches[name] = UNBOUNDED
            continue
        reaches[name] = before + own.bound + (pd.Timedelta(days=1) if spec.kind == "rolling" and spec.align == "day"
                                              else pd.Timedelta(0))
    return max(reaches.values())


def history_column(frame: pd.DataFrame, spec: DerivedColumn, field: str, date_column: str, group: Optional[str],
                   timezone: Optional[str], orders: Optional[Dict[Optional[str], "TimeOrder"]] = None) -> np.ndarray:
    """(n,) float64: the history column ``spec`` of ``frame``'s rows, in their order. ``orders``: the time
    orders of ``frame`` already sorted (`time_order`), shared by the columns of one `add_derived_columns`."""
    values = source_values(frame, spec, field)
    ordered = time_order(frame, spec, field, date_column, group, timezone, {} if orders is None else orders)
    if not len(frame):
        return np.empty(0)
    values = ordered.sort(values)
    if spec.kind == "lag":
        found = lag_values(ordered, values, span(f"{field}.by", spec.by))
    elif spec.kind == "rolling":
        found = rolling_values(ordered, values, spec, field)
    elif spec.daily is not None:
        found = daily_smooth(ordered, values, spec)
    else:
        found = smooth_values(ordered.keys, values, float(spec.factor))
    del values
    return ordered.unsort(found)


def source_values(frame: pd.DataFrame, spec: DerivedColumn, field: str) -> np.ndarray:
    """(n,) float64: the column a history column reads, in ``frame``'s order (refused when absent or text)."""
    if spec.column not in frame.columns:
        raise DataError(f"{field}.column", spec.column, "no such column in the data", use_one_of(frame.columns))
    try:
        return frame[spec.column].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):
        raise DataError(f"{field}.column", spec.column, f"a {spec.kind} column reads numbers, and this column holds "
                        "text", "name a numeric column") from None


@dataclass(eq=False)  # arrays: compared by identity
class TimeOrder:
    """A table's rows sorted stably by (group, date) once and shared by its history columns: the frame's row of
    each sorted row (``order``), the sorted group codes and dates, and, computed when first asked and then kept,
    the dates' local wall times and their ranks (what lags and windows look up)."""

    order: Optional[np.ndarray]  # (n,) int64; None: the rows are in that order already
    keys: np.ndarray  # (n,) int64 group codes (all 0: one time order)
    dates: np.ndarray  # (n,) datetime64[ns], sorted within each group
    timezone: Optional[str]
    kept: Dict[str, object] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, frame: pd.DataFrame, date_column: str, group: Optional[str], timezone: Optional[str]) -> "TimeOrder":
        """``frame``'s rows in the order of (``group``'s codes, date); None: of the date alone."""
        dates = frame[date_column].to_numpy(dtype="datetime64[ns]")
        if group is None:
            if not len(dates) or bool((dates[1:] >= dates[:-1]).all()):  # sorted by date (the read sorts it): as is
                return cls(None, np.zeros(len(frame), dtype=np.int64), dates, timezone)
            order = np.argsort(dates, kind="stable")
            return cls(order, np.zeros(len(frame), dtype=np.int64), dates[order], timezone)
        codes = pd.factorize(frame[group])[0].astype(np.int64) + 1
        order = np.lexsort((dates, codes))
        return cls(order, codes[order], dates[order], timezone)

    def sort(self, values: np.ndarray) -> np.ndarray:
        """``values`` of the frame's rows in the sorted order."""
        return values if self.order is None else values[self.order]

    def unsort(self, found: np.ndarray) -> np.ndarray:
        """``found`` (in the sorted order) in the frame's order."""
        if self.order is None:
            return found
        out = np.empty(len(found))
        out[self.order] = found
        return out

    @property
    def local(self) -> pd.DatetimeIndex:
        """The sorted dates as naive local wall times (`local_clock`)."""
        if "local" not in self.kept:
            self.kept["local"] = local_clock(self.dates, self.timezone)
        return self.kept["local"]

    def earlier(self, dates: np.ndarray, reach_back: Span, exact: bool) -> np.ndarray:
        """`earlier` of ``dates`` (the sorted dates themselves: their local times are read once)."""
        if not reach_back.days and not reach_back.elapsed:
            return dates
        return earlier(dates, reach_back, self.timezone, exact, self.local if dates is self.dates else None)

    def positions(self, wanted: np.ndarray) -> np.ndarray:
        """(n,) for each sorted row, the first sorted position at or after (its group, ``wanted``) (n where none;
        NaT wanted: n)."""
        n = len(self.dates)
        valid = ~np.isnat(wanted)
        if not len(self.keys) or self.keys[0] == self.keys[-1]:  # one time order: the sorted dates themselves
            return np.where(valid, np.searchsorted(self.dates, wanted, side="left"), n)
        if "ranked" not in self.kept:  # distinct dates (sorted, np.unique hashes: slower) and each row's rank
            stamps = np.sort(self.dates)
            stamps = stamps[np.r_[True, stamps[1:] != stamps[:-1]]]
            scale = np.int64(len(stamps) + 1)
            self.kept["ranked"] = stamps, scale, self.keys * scale + np.searchsorted(stamps, self.dates)
        stamps, scale, combined = self.kept["ranked"]
        asked = np.searchsorted(stamps, np.where(valid, wanted, stamps[-1]))
        asked += self.keys * scale  # a wanted date between two stamps ranks as the later: the first at or after
        return np.where(valid, np.searchsorted(combined, asked, side="left"), n)


def time_order(frame: pd.DataFrame, spec: DerivedColumn, field: str, date_column: str, group: Optional[str],
               timezone: Optional[str], orders: Dict[Optional[str], TimeOrder]) -> TimeOrder:
    """The `TimeOrder` a history column reads (``orders``: those sorted already, this one added): one per group
    under data.group (``over: group``), else one time order, two rows of one date refused (``over: table``)."""
    grouped = grouped_by(frame, spec, group)
    if grouped not in orders:
        orders[grouped] = TimeOrder.of(frame, date_column, grouped, timezone)
    ordered = orders[grouped]
    if spec.over == "table":
        repeated = np.flatnonzero(ordered.dates[1:] == ordered.dates[:-1])
        if len(repeated):
            raise DataError(f"{field}.over", "table", f"{len(repeated)} row(s) share a date with another (first: "
                            f"{pd.Timestamp(ordered.dates[repeated[0]])}): the table has no single time order",
                            f"set {field}.over=group (each group of data.group in its own time order)")
    return ordered


def local_clock(dates: np.ndarray, timezone: Optional[str]) -> pd.DatetimeIndex:
    """The table's dates (naive UTC under ``timezone``) as naive local wall times."""
    index = pd.DatetimeIndex(dates)
    return index if timezone is None else index.tz_localize("UTC").tz_convert(timezone).tz_localize(None)


def table_clock(local: pd.DatetimeIndex, timezone: Optional[str], exact: bool) -> np.ndarray:
    """Naive local wall times as the table holds them (naive UTC under ``timezone``): a time that reads twice is
    its first; one the clocks skip is NaT when ``exact``, else the time after the skipped hour."""
    if timezone is None:
        return local.to_numpy(dtype="datetime64[ns]")
    placed = local.tz_localize(timezone, ambiguous=np.ones(len(local), dtype=bool),
                               nonexistent="NaT" if exact else "shift_forward")
    return placed.tz_convert("UTC").tz_localize(None).to_numpy(dtype="datetime64[ns]")


def earlier(dates: np.ndarray, reach_back: Span, timezone: Optional[str], exact: bool,
            local: Optional[pd.DatetimeIndex] = None) -> np.ndarray:
    """(n,) datetime64[ns]: ``dates`` moved back by ``reach_back``: its days on the local calendar (the same clock
    time), then its elapsed time (`table_clock`: ``exact``: NaT at a local time that does not exist). ``local``:
    ``dates``' local wall times when already read."""
    out = dates
    if reach_back.days:
        local = local_clock(out, timezone) if local is None else local
        out = table_clock(local - pd.Timedelta(days=reach_back.days), timezone, exact)
    return out - reach_back.elapsed.to_timedelta64() if reach_back.elapsed else out


def lag_values(ordered: TimeOrder, values: np.ndarray, by: Span) -> np.ndarray:
    """(n,) each sorted row's value at exactly its date - ``by`` in its group (NaN where there is none)."""
    keys, dates = ordered.keys, ordered.dates
    wanted = ordered.earlier(dates, by, exact=True)
    at = ordered.positions(wanted)
    inside = np.minimum(at, len(dates) - 1)
    found = (at < len(dates)) & (keys[inside] == keys) & (dates[inside] == wanted)
    return np.where(found, values[inside], np.nan)


def rolling_values(ordered: TimeOrder, values: np.ndarray, spec: DerivedColumn, field: str) -> np.ndarray:
    """(n,) each sorted row's ``spec.stat`` over its window (`rolling` in the module doc)."""
    end = ordered.dates
    if spec.align == "day":
        end = table_clock(ordered.local.normalize(), ordered.timezone, exact=False)
    upper = ordered.earlier(end, span(f"{field}.gap", spec.gap, zero=True), exact=False)
    lower = ordered.earlier(upper, span(f"{field}.window", spec.window), exact=False)
    lo, hi = ordered.positions(lower), ordered.positions(upper)
    del end, upper, lower
    if spec.stat == "mean":
        return window_mean(values, lo, hi)
    return window_extreme(values, lo, hi, np.fmin if spec.stat == "min" else np.fmax)


def window_mean(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(n,) the mean of the finite ``values[lo:hi]`` of each row (NaN when none)."""
    finite = np.isfinite(values)
    count = window_sum(finite.astype(np.float64), lo, hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, window_sum(np.where(finite, values, 0.0), lo, hi) / count, np.nan)


def window_sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """(n,) the sum of each row's ``values[lo:hi]``: the sums of runs of 2^k rows (pairwise), the window's length
    taken bit by bit from the largest, so that a window's sum reads only its own values (a value outside it
    never moves it, not even by a rounding)."""
    length = hi - lo
    out = np.zeros(len(lo))
    if not len(values):
        return out
    top = int(np.floor(np.log2(max(int(length.max()), 1))))
    levels = [values]  # levels[k][i]: the sum of values[i:i + 2^k] (as far as the array goes)
    while len(levels) <= top:
        half, last = 2 ** (len(levels) - 1), levels[-1]
        nxt = last.copy()
        nxt[:len(last) - half] += last[half:]
        levels.append(nxt)
    at = lo.copy()
    for k in range(top, -1, -1):
        take = (length >> k) & 1 == 1
        out[take] += levels[k][at[take]]
        at[take] += 2 ** k
    return out


def window_extreme(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, reduce) -> np.ndarray:
    """(n,) ``reduce`` (np.fmin, np.fmax: NaN skipped) of each row's ``values[lo:hi]`` (NaN when empty): a sparse
    table of the reductions over runs of 1, 2, 4 ... rows, up to the longest window, two look-ups a row (the rows
    of each run length at a time: the table is not stacked into one array)."""
    length = hi - lo
    out = np.full(len(values), np.nan)
    if not len(values):
        return out
    level = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    last_row = len(values) - 1
    run = values  # run[i]: the reduction of values[i:i + 2^k] (as far as the array goes)
    for k in range(int(level.max()) + 1):
        if k:
            half = 2 ** (k - 1)
            run = run.copy() if k == 1 else run
            run[:len(run) - half] = reduce(run[:len(run) - half], run[half:])
        rows = np.flatnonzero((level == k) & (length > 0))
        out[rows] = reduce(run[np.minimum(lo[rows], last_row)], run[np.clip(hi[rows] - 2 ** k, 0, last_row)])
    return out


def smooth_values(keys: np.ndarray, values: np.ndarray, factor: float) -> np.ndarray:
    """(n,) the exponential smoothing of each group's sorted ``values`` (NaN skipped: the last value carried;
    NaN before a group's first finite value). Groups advance together, `SMOOTH_BLOCK` steps at a time: a block's
    values times the (B, B) matrix of weights (1 - factor) factor^(k - j), plus factor^(k + 1) times the state."""
    n = len(values)
    finite = np.isfinite(values)
    smoothed = np.full(n, np.nan)
    if finite.any():
        smoothed[finite] = smooth_finite(keys[finite], values[finite], factor)
    if finite.all():
        return smoothed
    rows = np.arange(n)
    last = np.maximum.accumulate(np.where(finite, rows, -1))  # each row's last finite row so far
    start = np.maximum.accumulate(np.where(np.r_[True, keys[1:] != keys[:-1]], rows, 0))  # its group's first row
    return np.where(last >= start, smoothed[np.maximum(last, 0)], np.nan)


def smooth_finite(keys: np.ndarray, values: np.ndarray, factor: float) -> np.ndarray:
    """(n,) the smoothing of sorted finite ``values`` of groups ``keys`` (`smooth_values`)."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    lengths = np.diff(np.r_[starts, len(values)])
    ranked = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[ranked], lengths[ranked]
    steps = np.arange(SMOOTH_BLOCK)
    weights = np.tril((1.0 - factor) * factor ** np.subtract.outer(steps, steps).clip(0))
    carry = factor ** (steps + 1)
    state = values[starts].copy()  # s_{-1} = x_first, so that s_first = x_first
    out = np.empty(len(values))
    for first in range(0, int(lengths[0]), SMOOTH_BLOCK):
        active = int(np.count_nonzero(lengths > first))
        rows = starts[:active, None] + first + steps
        inside = steps < (lengths[:active, None] - first)
        block = np.where(inside, values[np.where(inside, rows, 0)], 0.0)
        found = block @ weights.T + state[:active, None] * carry
        out[rows[inside]] = found[inside]
        state[:active] = found[:, -1]
    return out


def daily_smooth(ordered: TimeOrder, values: np.ndarray, spec: DerivedColumn) -> np.ndarray:
    """(n,) each sorted row's day's value of the smoothing, day by day, of its group's ``spec.daily`` of each local
    day (NaN values skipped)."""
    return day_smooth(ordered.keys, end_stamps(ordered, spec), values, spec)


def day_smooth(keys: np.ndarray, days: np.ndarray, values: np.ndarray, spec: DerivedColumn,
               before: Optional[np.ndarray] = None) -> np.ndarray:
    """(n,) `daily_smooth` of sorted rows of groups ``keys`` on local days ``days``; ``before``: each row's group's
    smoothed value of the day before its first (`continued_smooth`), None: each group starts afresh."""
    cuts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (days[1:] != days[:-1])])
    finite = np.isfinite(values)
    if spec.daily == "mean":
        counts = np.add.reduceat(finite.astype(np.float64), cuts)
        with np.errstate(invalid="ignore", divide="ignore"):
            daily = np.where(counts > 0, np.add.reduceat(np.where(finite, values, 0.0), cuts) / counts, np.nan)
    else:
        daily = (np.fmin if spec.daily == "min" else np.fmax).reduceat(values, cuts)
    day_of_row = np.searchsorted(cuts, np.arange(len(values)), side="right") - 1
    if before is None:
        return smooth_values(keys[cuts], daily, float(spec.factor))[day_of_row]
    return continued_smooth(keys[cuts], daily, float(spec.factor), before[cuts])[day_of_row]


def continued_smooth(keys: np.ndarray, values: np.ndarray, factor: float, before: np.ndarray) -> np.ndarray:
    """(n,) `smooth_values` of each group's sorted ``values`` continued from ``before`` (each row's group's smoothed
    value before its first row; NaN: none, the group starts afresh): ``before`` is put as a row ahead of each
    group's first (a smoothing starts at its first value), then taken out."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    smoothed = smooth_values(np.insert(keys, starts, keys[starts]), np.insert(values, starts, before[starts]), factor)
    return np.delete(smoothed, starts + np.arange(len(starts)))


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class HistoryTail:
    """The last rows of each group a fitted model keeps for its lag and rolling columns (as mlforecast's
    ``keep_last_n``): the rows within their reach back (`lookback`) of the group's last date, their date (int64
    ns, as the table holds it), group (None without data.group) and the values of each source column read from
    the file. Rows sent to the model are put after them, so that the day after the table gets its history."""

    dates: np.ndarray
    groups: list
    values: Dict[str, np.ndarray]

    @classmethod
    def of(cls, frame: pd.DataFrame, derived: Mapping[str, DerivedColumn], date_column: str,
           group: Optional[str]) -> Optional["HistoryTail"]:
        """The tail of ``frame`` (the table's rows the run scored, derived columns included); None when no lag
        or rolling column reads a file column or a smooth (a smooth reads every earlier row: its values are kept
        for the lags and windows that read it, and it continues from its `SmoothEnd`)."""
        kept = {name: spec for name, spec in derived.items() if spec.kind in ("lag", "rolling")}
        sources = [spec.column for spec in kept.values() if spec.column in frame and
                   (spec.column not in derived or derived[spec.column].kind == "smooth")]
        reach_back = lookback(kept)
        if not sources or reach_back is None or not len(frame):
            return None
        dates = frame[date_column]
        last = frame.groupby(group)[date_column].transform("max") if group else dates.max()
        rows = frame[(dates >= last - reach_back).to_numpy()]
        return cls(rows[date_column].to_numpy(dtype="datetime64[ns]").astype(np.int64),
                   rows[group].tolist() if group else [],
                   {column: rows[column].to_numpy(dtype=np.float64, na_value=np.nan) for column in dict.fromkeys(sources)})

    def before(self, frame: pd.DataFrame, date_column: str, group: Optional[str]) -> pd.DataFrame:
        """The tail's rows (those whose group and date ``frame`` does not hold) followed by ``frame``'s; the
        columns of the tail ``frame`` lacks are NaN in its rows."""
        tail = pd.DataFrame({date_column: self.dates.astype("datetime64[ns]"), **self.values})
        if group:
            tail[group] = pd.Series(self.groups, dtype=frame[group].dtype if group in frame else None)
        keys = [date_column] + ([group] if group else [])
        frame = frame.assign(**{date_column: frame[date_column].astype("datetime64[ns]")})
        given = pd.MultiIndex.from_frame(frame[keys]) if len(keys) > 1 else pd.Index(frame[date_column])
        ours = pd.MultiIndex.from_frame(tail[keys]) if len(keys) > 1 else pd.Index(tail[date_column])
        return pd.concat([tail[~ours.isin(given)], frame], ignore_index=True)


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class SmoothEnd:
    """A smooth column's state at the end of the table a fitted model kept (`HistoryTail`'s last rows): for each
    group of its time order (``groups``; empty: one time order, ``over: table`` or no data.group), the last date
    it read (``ends``, int64 ns as the table holds it; ``daily``: the last local day, its local midnight) and its
    smoothed value there (``values``; NaN: no finite value yet). Rows sent after the end continue it."""

    groups: list
    ends: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame, name: str, spec: DerivedColumn, date_column: str, group: Optional[str],
           timezone: Optional[str]) -> "SmoothEnd":
        """The state of the smooth column ``name`` at the end of ``frame`` (which holds it)."""
        grouped = grouped_by(frame, spec, group)
        ordered = TimeOrder.of(frame, date_column, grouped, timezone)
        last = np.flatnonzero(np.r_[ordered.keys[1:] != ordered.keys[:-1], True])
        values = ordered.sort(frame[name].to_numpy(dtype=np.float64, na_value=np.nan))[last]
        groups = ordered.sort(frame[grouped].to_numpy())[last].tolist() if grouped else []
        return cls(groups, end_stamps(ordered, spec)[last].astype(np.int64), values)

    def position(self, frame: pd.DataFrame, spec: DerivedColumn, group: Optional[str]) -> np.ndarray:
        """(n,) each row's place in the state (-1: a group the table did not have)."""
        grouped = grouped_by(frame, spec, group)
        if grouped is None:
            return np.full(len(frame), 0 if len(self.ends) else -1, dtype=np.int64)
        return pd.Index(self.groups).get_indexer(pd.Index(frame[grouped])).astype(np.int64)

    def after(self, at: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """(n,) whether each row (its place ``at``, its date or local day ``stamps``) lies after its group's end."""
        if not len(self.ends):
            return np.zeros(len(at), dtype=bool)
        return (at >= 0) & (stamps.astype("datetime64[ns]").astype(np.int64) > self.ends[np.maximum(at, 0)])

    def continued(self, frame: pd.DataFrame, name: str, spec: DerivedColumn, field: str, date_column: str,
                  group: Optional[str], timezone: Optional[str], orders: Dict[Optional[str], TimeOrder]) -> np.ndarray:
        """(n,) the column ``name`` of ``frame``'s rows: continued from the state after the end; elsewhere the
        value ``frame`` holds (a kept tail's row) or NaN."""
        values = source_values(frame, spec, field)
        ordered = time_order(frame, spec, field, date_column, group, timezone, orders)
        at = ordered.sort(self.position(frame, spec, group))
        rows = np.flatnonzero(self.after(at, end_stamps(ordered, spec)))
        out = ordered.sort(frame[name].to_numpy(dtype=np.float64, na_value=np.nan) if name in frame
                           else np.full(len(frame), np.nan)).copy()
        if len(rows):
            values, keys, before = ordered.sort(values)[rows], ordered.keys[rows], self.values[at[rows]]
            out[rows] = continued_smooth(keys, values, float(spec.factor), before) if spec.daily is None else \
                day_smooth(keys, end_stamps(ordered, spec)[rows], values, spec, before)
        return ordered.unsort(out)


def grouped_by(frame: pd.DataFrame, spec: DerivedColumn, group: Optional[str]) -> Optional[str]:
    """The column whose groups a history column reads apart (`time_order`); None: one time order."""
    return group if spec.over != "table" and group is not None and group in frame.columns else None


def end_stamps(ordered: TimeOrder, spec: DerivedColumn) -> np.ndarray:
    """(n,) datetime64[ns] what a smooth's end is counted in: the sorted dates, or (``daily``) their local days."""
    return ordered.dates if spec.daily is None else ordered.local.normalize().to_numpy(dtype="datetime64[ns]")


def smooth_ends(frame: pd.DataFrame, derived: Mapping[str, DerivedColumn], date_column: str, group: Optional[str],
                timezone: Optional[str]) -> Optional[Dict[str, SmoothEnd]]:
    """The `SmoothEnd` of each smooth column of ``frame`` (the table's rows the run scored, derived columns
    included); None when it has none (or no row)."""
    ends = {name: SmoothEnd.of(frame, name, spec, date_column, group, timezone) for name, spec in derived.items()
            if spec.kind == "smooth" and name in frame.columns and len(frame)}
    return ends or None
