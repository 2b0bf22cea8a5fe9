"""Derived columns declared in the data config (``data.derived``), computed before splitting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

import numpy as np
import pandas as pd

from tamrun.config.schema import HISTORY_KINDS, DerivedColumn
from tamrun.config.expr import evaluate, names, parse_expression
from tamrun.data.calendar import Calendar, calendar_column
from tamrun.data.dates import local_time, read_dates
from tamrun.data.file_kind import use_one_of
from tamrun.data.history import HistoryTail, SmoothEnd, TimeOrder, history_column, local_clock
from tamrun.errors import DataError


DATE_KINDS = ("time_index", "calendar", "holiday")  # the kinds read from the date column alone


def add_derived_columns(frame: pd.DataFrame, derived: Mapping[str, DerivedColumn], date_column: str,
                        origin: Optional[pd.Timestamp] = None, calendar: Optional[Calendar] = None,
                        group: Optional[str] = None, ends: Optional[Mapping[str, SmoothEnd]] = None) -> pd.DataFrame:
    """Return ``frame`` with each derived column appended, in config order (a new frame; the
    existing columns are shared, copy-on-write, not copied).

    ``time_index``: (date - origin) / unit, a float (origin: the frame's first date unless given);
    ``isin``: 1.0 where ``column`` is one of ``values``; ``expr``: the expression's value as float
    (`tamrun.config.expr`: arithmetic and comparisons on columns and literals, checked before it is evaluated);
    ``calendar`` and ``holiday``: read from the date in local time (`tamrun.data.calendar`, with ``calendar``:
    the time zone, the country's holidays and the table's step; its step read from ``frame`` when not known);
    ``lag``, ``rolling``, ``smooth``: read from ``column``'s earlier rows of the row's group (data.group: ``group``),
    in time order (`tamrun.data.history`; local days in the calendar's time zone); a smooth of ``ends`` (a
    fitted model's state) continues from its end. A derived column may read the ones before it.
    """
    out = frame.copy(deep=False)
    orders: Dict[Optional[str], TimeOrder] = {}  # the rows' time orders, sorted once for every history column
    local: Optional[pd.Series] = None  # the dates' local wall times, read once for every calendar column
    for name, spec in derived.items():
        field = f"data.derived.{name}"
        if spec.kind == "time_index":
            try:
                unit = pd.Timedelta(1, unit=spec.unit)
            except ValueError:
                raise DataError(f"{field}.unit", spec.unit, "not a time unit", "use D, h, min or s") from None
            dates = out[date_column]
            out[name] = ((dates - (dates.min() if origin is None else origin)) / unit).astype(np.float64)
        elif spec.kind == "isin":
            if spec.column not in out.columns:
                raise DataError(f"{field}.column", spec.column, "no such column in the data", use_one_of(out.columns))
            out[name] = out[spec.column].isin(list(spec.values)).astype(np.float64)
        elif spec.kind in HISTORY_KINDS:
            timezone = None if calendar is None else calendar.timezone
            out[name] = history_column(out, spec, field, date_column, group, timezone, orders) if name not in \
                (ends or {}) else ends[name].continued(out, name, spec, field, date_column, group, timezone, orders)
        elif spec.kind in ("calendar", "holiday"):
            if calendar is None or calendar.step_seconds is None:
                calendar = Calendar.of_table(calendar, out[date_column])
            local = local_time(out[date_column], calendar.timezone) if local is None else local
            out[name] = calendar_column(out[date_column], spec, field, calendar, local)
        else:  # expr (kinds are checked by tamrun.config.checks)
            out[name] = evaluate(f"{field}.expr", spec.expr, out)
    return out


def derived_sources(derived: Mapping[str, DerivedColumn]) -> Tuple[Dict[str, str], Set[str]]:
    """The file columns the derived columns read: (config field -> column of each ``isin`` and each history
    column, unless it reads an earlier derived column: each must exist; the names an ``expr`` mentions,
    which are read when they are columns). An expression that is not allowed is refused here, before any data
    is read (`tamrun.config.expr.parse_expression`)."""
    required: Dict[str, str] = {}
    mentioned: Set[str] = set()
    earlier: Set[str] = set()
    for name, spec in derived.items():
        if spec.kind in ("isin", *HISTORY_KINDS) and spec.column and spec.column not in earlier:
            required[f"data.derived.{name}.column"] = spec.column
        elif spec.kind == "expr" and spec.expr:
            mentioned.update(names(parse_expression(f"data.derived.{name}.expr", spec.expr)))
        earlier.add(name)
    return required, mentioned


@dataclass(frozen=True)
class DataRecipe:
    """What turns a raw table into the rows a fitted model reads: the derived columns (a time index
    counts from ``origin``, the first date of the table the model was fitted from; calendar and holiday
    columns are read with ``calendar``, the table's time zone, holidays and step), the date, target
    and group columns (data config)."""

    derived: Dict[str, DerivedColumn]
    date_column: str
    target: str
    group: Optional[str]
    origin: Optional[pd.Timestamp]
    date_format: Optional[str] = None  # how the file's dates were read (data.date_format, data.dayfirst):
    dayfirst: bool = False  # a table to predict from is read the same way (`read_dates`)
    calendar: Optional[Calendar] = None  # None: a model saved before calendars (no time zone)
    tail: Optional[HistoryTail] = None  # each group's last rows for its lag and rolling columns (None: none kept)
    smooth: Optional[Dict[str, SmoothEnd]] = None  # each smooth column's state at the table's end (None: none kept)

    @property
    def timezone(self) -> Optional[str]:
        """data.timezone of the table the model was fitted from: a date without an offset is local time there."""
        return None if self.calendar is None else self.calendar.timezone

    def dates(self, frame: pd.DataFrame) -> pd.Series:
        """``frame``'s date column read as the run read its file's (`read_dates`)."""
        return read_dates(frame[self.date_column], self.date_format, self.dayfirst, self.timezone, frame, self.group)

    def sources(self, column: str, available: Iterable[str]) -> List[str]:
        """The raw columns ``column`` is read from: itself unless it is derived; the date for a time
        index, an ``isin``'s column, the names an expression mentions that are in ``available``; for a history
        column (`tamrun.data.history`: it reads earlier rows), none when the kept ``tail`` holds its source (the
        tail and the rows sent give it; a derived source: that source), for a smooth its source and the date when
        its state is kept (``smooth``: it continues from it), else the column itself, given as such."""
        spec = self.derived.get(column)
        if spec is None:
            return [column]
        if spec.kind in DATE_KINDS:
            return [self.date_column]
        if spec.kind == "isin":
            return [spec.column]
        if spec.kind == "smooth":  # continued from its kept state over the rows sent, else given as such
            return [spec.column, self.date_column] if self.smooth and column in self.smooth else [column]
        if spec.kind in HISTORY_KINDS:  # read from earlier rows: the kept tail's and those sent, else given as such
            if self.tail is None or spec.column not in self.tail.values:
                return [column]
            return [spec.column] if spec.column in self.derived else []
        _, mentioned = derived_sources({column: spec})
        return [name for name in available if name in mentioned]

    def raw_sources(self, column: str, present: Iterable[str]) -> List[str]:
        """`sources` of ``column`` followed through derived columns of derived columns (an ``isin`` of a calendar
        part reads the date) down to a column of the table (``present``: those it holds) or one not derived; a
        history column without a kept tail is its own source."""
        present = list(present)
        if column not in self.derived:
            return [column]
        return [raw for source in self.sources(column, [*present, *self.derived])
                for raw in ([source] if source == column or source in present or source not in self.derived
                            else self.raw_sources(source, present))]

    def needed(self, columns: Optional[Iterable[str]]) -> Dict[str, DerivedColumn]:
        """The derived columns ``columns`` (None: all) and the group (data.group) are or read, those read by them
        included (an ``isin``'s or an expression's earlier derived columns), in config order."""
        if columns is None:
            return dict(self.derived)
        wanted = {*columns, *([self.group] if self.group else [])}
        for name in reversed(list(self.derived)):
            if name in wanted:
                wanted.update(self.sources(name, self.derived))
        return {name: spec for name, spec in self.derived.items() if name in wanted}

    def continued(self, columns: Optional[Iterable[str]]) -> List[str]:
        """The smooth columns ``columns`` read (`needed`) that continue from their kept state (``smooth``) over rows
        after the table's end: rows at or before it give them as such."""
        return [name for name in self.needed(columns) if name in (self.smooth or {})]

    def apply(self, frame: pd.DataFrame, columns: Optional[Iterable[str]] = None) -> pd.DataFrame:
        """``frame`` with the derived columns it lacks (a copy when any is added); ``columns``: only those the
        model reads (`needed`): a derived column it does not read may lack its source."""
        missing = {name: spec for name, spec in self.needed(columns).items() if name not in frame.columns}
        if not missing:
            return frame
        if self.date_column in frame.columns:
            frame = frame.assign(**{self.date_column: self.dates(frame)})
        if self.group in missing:  # a derived group first: the history's rows are matched by it
            grouping = {name: spec for name, spec in self.needed([]).items() if name in missing}
            frame = add_derived_columns(frame, grouping, self.date_column, self.origin, self.calendar)
            missing = {name: spec for name, spec in missing.items() if name not in grouping}
        history = {name: spec for name, spec in missing.items() if spec.kind in HISTORY_KINDS}
        ends = {name: end for name, end in (self.smooth or {}).items() if name in missing}
        refuse_before_end(frame, ends, self)
        if history and self.tail is not None:
            out = add_derived_columns(self.tail.before(frame, self.date_column, self.group), missing, self.date_column,
                                      self.origin, self.calendar, self.group, ends)
            out = out.iloc[len(out) - len(frame):].set_axis(frame.index)[[*frame.columns, *missing]]
        else:
            out = add_derived_columns(frame, missing, self.date_column, self.origin, self.calendar, self.group, ends)
        refuse_no_history(out, history)
        return out


def refuse_no_history(frame: pd.DataFrame, history: Mapping[str, DerivedColumn]) -> None:
    """`DataError` naming a history column that rows to predict have no value of (their earlier rows are not
    among them): a forecast is never made from a missing input."""
    for name, spec in history.items():
        missing = np.isnan(frame[name].to_numpy(dtype=np.float64))
        if missing.any():
            raise DataError(f"data.derived.{name}", spec.column, f"{int(missing.sum())} of the {len(frame)} rows to "
                            f"predict (first: row {int(np.argmax(missing))}, counted from 0) have no {spec.kind} of "
                            f"{spec.column!r}: it reads the earlier rows of their group, which are neither among the "
                            "rows to predict nor among the last rows of its table the model keeps",
                            f"send those earlier rows with their {spec.column} along, or give the column {name} itself "
                            "in the rows to predict (the value a run would derive)")


def refuse_before_end(frame: pd.DataFrame, ends: Mapping[str, SmoothEnd], recipe: DataRecipe) -> None:
    """`DataError` naming a smooth column continued from its kept state (``ends``) that rows to predict lie at or
    before the end of (or in a group the table did not have): their smoothing reads rows the model did not keep."""
    for name, end in ends.items():
        spec = recipe.derived[name]
        at = end.position(frame, spec, recipe.group)
        dates = frame[recipe.date_column].to_numpy(dtype="datetime64[ns]")
        stamps = dates if spec.daily is None else \
            local_clock(dates, recipe.timezone).normalize().to_numpy(dtype="datetime64[ns]")
        early = ~end.after(at, stamps)
        if not early.any():
            continue
        first = int(np.argmax(early))
        last = pd.Timestamp(int(end.ends[max(at[first], 0)]))
        where = "a group the table did not have" if at[first] < 0 else "not after the table's last " + \
            (f"date {last}{' UTC' if recipe.timezone else ''}" if spec.daily is None else f"local day {last.date()}") + \
            (" (of their group)" if end.groups else "")
        raise DataError(f"data.derived.{name}", spec.column, f"{int(early.sum())} of the {len(frame)} rows to predict "
                        f"(first: row {first}, counted from 0) are {where}: the {spec.kind} continues from its value "
                        "at the end of the table the model was fitted from, over rows after that end only",
                        f"send only rows after the table's end, or give the column {name} itself in the rows to "
                        "predict (the value a run would derive)")
