"""The date column as timestamps, read with one format for the whole file.

The format is ``data.date_format`` when set (strftime codes such as ``%d/%m/%Y %H:%M``, or pandas'
``ISO8601``), else the one the file's first date is written in (`DateFormat.of`): ISO 8601 when it
starts with the year, else pandas' guess, day first under ``data.dayfirst`` (01/02/2024 is then
1 February). Every block of the file is read with that format, so that one file is never read half
month first and half day first. A value it does not fit is refused in one line naming the value, its
line in the file, the format tried and the settings that choose it.

Timestamps with a UTC offset (``+01:00``, ``Z``) are converted to UTC and the offset dropped, so that one
table may mix offsets (summer and winter time); timestamps without one are taken as they are, unless
``data.timezone`` is set: they are then local wall times of that zone, converted to UTC (`LocalClock`). The
hour the clocks go back reads twice in local time: per group, in the file's order, the first of the two is
summer time and the second winter time; a time the clocks skip (the hour they go forward) does not exist,
and is refused naming the value and its row.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

from tamrun.config.schema import DataConfig, NanPolicy
from tamrun.data.cells import quoted
from tamrun.errors import DataError

log = logging.getLogger(__name__)

ISO = "ISO8601"  # pandas' format for any ISO 8601 date (with or without time, fraction, offset)
# Characters of the longest text read as a date ('2024-03-31T03:00:00.123456789+02:00' has 35): a longer
# value is not one, and is refused without being parsed (pandas' parsers take minutes on a 1 MB value).
LONGEST_DATE = 64
# A time followed by a UTC offset or a zone letter: '... 03:00:00+02:00', '...T03:00Z', '... 03:00 +0200'.
OFFSET = r"\d:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s*(?:Z|UTC|GMT|[+-]\d{2}(?::?\d{2})?)$"


@dataclass(frozen=True)
class DateFormat:
    """The format a file's dates are read with (``None``: pandas reads each value as it can), how it was
    chosen (for messages) and whether a date without a format reads day first."""

    format: Optional[str]
    chosen: str
    dayfirst: bool = False

    @classmethod
    def of(cls, cfg: DataConfig, first: str) -> "DateFormat":
        """``data.date_format``, else the format of ``first``, the file's first date (`chosen`)."""
        return cls.chosen(cfg.date_format, cfg.dayfirst, first)

    @classmethod
    def chosen(cls, date_format: Optional[str], dayfirst: bool, first: str) -> "DateFormat":
        """``date_format`` (data.date_format), else the format of ``first``, day first under ``dayfirst``."""
        if date_format:
            return cls(date_format, "data.date_format")
        chosen = f"read from the first date {quoted(first)} with data.dayfirst={str(dayfirst).lower()}"
        if len(first) > LONGEST_DATE:
            return cls(None, chosen, dayfirst)
        if year_first(first):  # ISO 8601, never day first
            return cls(ISO, chosen)
        return cls(guess_format(first, dayfirst), chosen, dayfirst)

    def describe(self) -> str:
        """E.g. ``'%m/%d/%Y', read from the first date '01/02/2020' with data.dayfirst=false``."""
        shown = "ISO 8601" if self.format == ISO else repr(self.format) if self.format else "none recognised"
        return f"{shown}, {self.chosen}"


def guess_format(value: str, dayfirst: bool) -> Optional[str]:
    """pandas' guess of the strftime format ``value`` is written in (None: none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return guess_datetime_format(value, dayfirst=dayfirst)


def first_date(frame: pd.DataFrame, column: str) -> Optional[str]:
    """The first non-blank value of the date column, as text (None: every value is blank)."""
    values = frame[column].dropna().astype(str).str.strip()
    values = values[values != ""]
    return values.iloc[0] if len(values) else None


class FileDates:
    """The date column of one file, block after block: its format is chosen from the first date seen
    (`DateFormat.of`) and kept for every later block."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.form: Optional[DateFormat] = None
        self.clock = LocalClock.of(cfg)

    def parse(self, block: pd.DataFrame) -> Tuple[pd.DataFrame, int]:
        """``block`` with its dates parsed, and the number of its rows dropped (`parse_dates`)."""
        column = self.cfg.date_column
        if self.form is None:
            if has_offset(block[column].head(1).astype("string").str.strip()).any():
                warn_utc_calendar(self.cfg)
            first = first_date(block, column)
            self.form = DateFormat.of(self.cfg, first) if first is not None else None
        return parse_dates(block, column, self.cfg.nan_policy, self.form or DateFormat(self.cfg.date_format, ""),
                           self.clock)


def file_line(index: Any) -> str:
    """Where a row of a CSV is: its frame index counts the file's rows after the header."""
    return f"line {int(index) + 2} of the file"


def parse_dates(frame: pd.DataFrame, column: str, policy: NanPolicy, form: DateFormat,
                clock: Optional["LocalClock"] = None) -> Tuple[pd.DataFrame, int]:
    """``frame`` with ``column`` parsed in ``form``, and the number of rows dropped. Blank cells are
    refused under data.nan_policy=error (naming the file line of the first: the frame's index counts
    the file's rows) and their rows dropped under drop; a value ``form`` does not fit is refused
    (`unparsed`). ``clock``: dates without an offset are local times of data.timezone (`LocalClock`)."""
    text = frame[column].astype("string").str.strip()
    blank = text.isna() | (text == "")
    dropped = int(blank.sum())
    if dropped:
        if policy != NanPolicy.drop:
            raise DataError("data.date_column", column, f"{dropped} row(s) have no date (first at line "
                            f"{int(blank.idxmax()) + 2} of the file)",
                            "fill the dates, or set data.nan_policy=drop to drop those rows")
        frame, text = frame[~blank.to_numpy()], text[~blank.to_numpy()]
    dates = timestamps(text, form)
    if dates.isna().any():
        raise unparsed(column, text, dates.isna(), form)
    if clock is not None:
        dates = clock.utc(dates, ~has_offset(text), frame, column, text, file_line)
    return frame.assign(**{column: dates}), dropped


def warn_utc_calendar(cfg: DataConfig) -> None:
    """A warning when dates with a UTC offset are read in UTC (no data.timezone) and a derived column reads the
    calendar from them: its hours and days would be UTC's, not the table's."""
    reads = [name for name, spec in cfg.derived.items() if spec.kind in ("calendar", "holiday")]
    if cfg.timezone is None and reads:
        log.warning("the dates carry a UTC offset and data.timezone is not set: they are read in UTC, and so are the "
                    "calendar columns %s; set data.timezone to the table's zone (e.g. data.timezone=Europe/Paris) "
                    "to read them in local time", ", ".join(reads))


def has_offset(text: pd.Series) -> np.ndarray:
    """(n,) whether each date written as text carries a UTC offset or zone (`OFFSET`)."""
    return text.astype("string").str.contains(OFFSET, case=False, regex=True).fillna(False).to_numpy(dtype=bool)


def timestamps(text: pd.Series, form: DateFormat) -> pd.Series:
    """``text`` read in ``form``: timestamps without an offset (one given is converted to UTC and dropped),
    NaT where a value does not fit."""
    with warnings.catch_warnings():  # pandas warns when it reads each value apart (no format)
        warnings.simplefilter("ignore")
        dates = pd.to_datetime(text.mask(text.str.len() > LONGEST_DATE).astype(object), utc=True, format=form.format, dayfirst=form.dayfirst,
                               errors="coerce")
    return dates.dt.tz_localize(None)


def read_dates(values: pd.Series, date_format: Optional[str], dayfirst: bool, timezone: Optional[str] = None,
               frame: Optional[pd.DataFrame] = None, group: Optional[str] = None) -> pd.Series:
    """``values`` (text, Python or pandas datetimes) as a run reads its file's dates: one format for all of
    them (`DateFormat.chosen` from the first), an offset or time zone converted to UTC and dropped; NaT
    where a value is blank or does not fit (the rows a served model is asked about: `tamrun.tracking`).
    ``timezone``: a date without an offset is a local time there (`LocalClock`; the repeated hour's rows of a
    group of ``frame`` in their order), converted to UTC; one that does not exist is refused."""
    clock = LocalClock(timezone, group) if timezone else None
    if pd.api.types.is_datetime64_any_dtype(values):
        if values.dt.tz is not None:
            return values.dt.tz_convert("UTC").dt.tz_localize(None)
        local = np.ones(len(values), dtype=bool)
        return values if clock is None else clock.utc(values, local, frame, str(values.name), values, request_row)
    text = values.astype("string").str.strip()
    first = first_date(text.to_frame("date"), "date")
    form = DateFormat.chosen(date_format, dayfirst, first) if first is not None else DateFormat(date_format, "")
    dates = timestamps(text, form)
    if clock is None:
        return dates
    readable = dates.notna().to_numpy()
    return clock.utc(dates, ~has_offset(text) & readable, frame, str(values.name), text, request_row)


def request_row(index: Any) -> str:
    """Where a row of a table to predict is (its position, counted from 0)."""
    return f"row {index} of the rows to predict (counted from 0)"


def year_first(value: str) -> bool:
    """Whether ``value`` starts with a 4-digit year (ISO 8601, never read day first)."""
    return value[:4].isdigit() and not value[4:5].isdigit()


def own_formats(value: str) -> List[str]:
    """The formats ``value`` may be written in: day first, then month first when it reads both ways (none for
    a value longer than `LONGEST_DATE`)."""
    if len(value) > LONGEST_DATE:
        return []
    guesses = [guess_format(value, False)] if year_first(value) else [guess_format(value, True),
                                                                      guess_format(value, False)]
    return [f for f in dict.fromkeys(guesses) if f]


def unparsed(column: str, text: pd.Series, failed: pd.Series, form: DateFormat) -> DataError:
    """The error naming the first value ``form`` does not fit, its line in the file and the settings."""
    where = failed.idxmax()
    value = str(text.loc[where])
    problem = (f"the value {quoted(value, column)} at line {int(where) + 2} of the file is not a date in the format tried "
               f"({form.describe()})")
    owns = [f for f in own_formats(value) if f != form.format]
    if len(owns) == 2:
        fix = f"set data.date_format='{owns[0]}' if {value!r} is day first, or '{owns[1]}' if month first"
    elif owns:
        fix = f"set data.date_format='{owns[0]}' (the format of {value!r})"
    else:
        fix = ("set data.date_format to the dates' strftime format (e.g. data.date_format='%d/%m/%Y %H:%M'), "
               "or correct the value in the file")
    if owns and owns[0].startswith("%d") and not form.dayfirst and form.chosen != "data.date_format":
        fix += ", or data.dayfirst=true"
    return DataError("data.date_column", column, problem, fix)


def table_time(days: pd.DatetimeIndex, timezone: Optional[str]) -> pd.DatetimeIndex:
    """Local wall times ``days`` (naive; e.g. the split's and the backtest's midnights) as the table holds
    its dates: unchanged without ``data.timezone``, else converted to naive UTC. A few zones change their
    clocks at midnight: a midnight that reads twice is its first, one that does not exist the time after it."""
    if timezone is None:
        return days
    first = np.ones(len(days), dtype=bool)
    return days.tz_localize(timezone, ambiguous=first, nonexistent="shift_forward").tz_convert("UTC").tz_localize(None)


@dataclass
class LocalClock:
    """Local wall times of ``timezone`` (data.timezone) as naive UTC, block after block of one table.

    The hour the clocks go back reads twice: of the rows of one group (``group``: data.group's column)
    at such a local time, the first (in the table's order, over every block read so far: ``seen``) is
    summer time, the next ones winter time. A local time the clocks skip does not exist: refused."""

    timezone: str
    group: Optional[str] = None
    seen: Dict[Tuple[Any, pd.Timestamp], int] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: DataConfig) -> Optional["LocalClock"]:
        """The clock of data.timezone (None when it is not set)."""
        return cls(cfg.timezone, cfg.group) if cfg.timezone else None

    def utc(self, dates: pd.Series, local: np.ndarray, frame: Optional[pd.DataFrame], column: str,
            shown: pd.Series, where: Callable[[Any], str]) -> pd.Series:
        """``dates`` with those marked ``local`` (n,) converted from local time to naive UTC; a local time that
        does not exist is a `DataError` naming its value (as ``shown`` holds it) and ``where`` its row is."""
        if not local.any():
            return dates
        index = pd.DatetimeIndex(dates[local])
        keys = frame[self.group] if frame is not None and self.group in frame.columns else None
        summer = self.first_of_twice(index, None if keys is None else keys[local])
        placed = index.tz_localize(self.timezone, ambiguous=summer, nonexistent="NaT")
        if placed.isna().any():
            at = int(np.flatnonzero(placed.isna())[0])
            row = dates.index[np.flatnonzero(local)[at]]
            raise skipped_time(column, str(shown.loc[row]), where(row), self.timezone)
        out = dates.copy()
        out[local] = placed.tz_convert("UTC").tz_localize(None).to_numpy()
        return out

    def first_of_twice(self, index: pd.DatetimeIndex, keys: Optional[pd.Series]) -> np.ndarray:
        """(n,) True where a local time that reads twice is its group's first (summer time), or reads once."""
        summer = index.tz_localize(self.timezone, ambiguous=np.ones(len(index), dtype=bool), nonexistent="NaT")
        winter = index.tz_localize(self.timezone, ambiguous=np.zeros(len(index), dtype=bool), nonexistent="NaT")
        first = np.ones(len(index), dtype=bool)
        twice = np.flatnonzero(np.asarray(summer != winter) & ~np.asarray(summer.isna()))
        for at in twice:  # one hour a year per group
            key = (None if keys is None else keys.iloc[at], index[at])
            first[at] = self.seen.get(key, 0) == 0
            self.seen[key] = self.seen.get(key, 0) + 1
        return first


def skipped_time(column: str, value: str, where: str, timezone: str) -> DataError:
    """The error for a local time that does not exist in ``timezone`` (the clocks skip it)."""
    return DataError("data.date_column", column, f"the value {quoted(value, column)} at {where} is a local time that "
                     f"does not exist in data.timezone={timezone} (the clocks skip that hour when they go forward)",
                     "correct or remove that row (a table of local times has no row in the skipped hour), write "
                     "the dates with their UTC offset (e.g. 2024-03-31T03:00:00+02:00), or unset data.timezone to "
                     "take the dates as they are")


def instant(value: Optional[pd.Timestamp], timezone: Optional[str]) -> Optional[pd.Timestamp]:
    """One date as the table holds it: a zone's converted to naive UTC; a naive one, under ``timezone``, a local
    time (the earlier of a repeated hour, the hour after a skipped one); else as it is."""
    if value is None or pd.isna(value):
        return None
    value = pd.Timestamp(value)
    if value.tz is not None:
        return value.tz_convert("UTC").tz_localize(None)
    if timezone is None:
        return value
    return value.tz_localize(timezone, ambiguous=True, nonexistent="shift_forward").tz_convert("UTC").tz_localize(None)


def local_time(dates: pd.Series, timezone: Optional[str]) -> pd.Series:
    """The table's dates (naive UTC under ``timezone``) as local wall times; as they are without one."""
    if timezone is None:
        return dates
    return dates.dt.tz_localize("UTC").dt.tz_convert(timezone).dt.tz_localize(None)
