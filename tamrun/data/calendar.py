"""Derived columns read from the date alone, in the table's local time (data.timezone): the parts of the
calendar (kind ``calendar``, `tamrun.config.schema.CALENDAR_PARTS`) and the public holidays of a country
(kind ``holiday``, the holidays package: data.holidays, data.holiday_subdivision).

    time_of_day   floor((local time - local midnight) / step): 0..23 for an hourly table, 0..47 half-hourly;
                  ``step`` is the table's (`table_step`: its most common gap between consecutive dates),
                  read once from the training table and kept with the model (`Calendar`)
    hour          the local hour, 0..23
    day_of_week   0 = Monday ... 6 = Sunday
    day_of_year   1..366
    year_fraction day_of_year / the days of its year: 1/365 (1 January) .. 1 (31 December), the national table's toy
    week          the ISO week, 1..53
    month         1..12
    weekend       1.0 on Saturday and Sunday
    day_off       1.0 on a weekend or a public holiday (the weekend only without data.holidays)

On the days the clocks change a local day has 23 or 25 hours: the skipped hour has no time of day, the
repeated one's two rows share theirs (02:00 twice: time_of_day 2 for both).

A bridge day (``bridge: true``) is a working day with a public holiday on one side and a day off (a weekend
or another holiday) on the other: the Friday after a Thursday holiday, the Monday before a Tuesday one.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from tamrun.config.schema import DataConfig, DerivedColumn
from tamrun.data.dates import local_time

log = logging.getLogger(__name__)

SECONDS_PER_DAY = 86400.0
ONE_DAY = np.timedelta64(1, "D")


@dataclass(frozen=True)
class Calendar:
    """What a table's calendar and holiday columns are read with: data.timezone, data.holidays,
    data.holiday_subdivision and the table's step in seconds (`table_step`; None: not read yet). A fitted
    model keeps it (`tamrun.data.derive.DataRecipe`), so that the rows it is asked about get the same columns."""

    timezone: Optional[str] = None
    country: Optional[str] = None
    subdivision: Optional[str] = None
    step_seconds: Optional[float] = None

    @classmethod
    def of(cls, cfg: DataConfig, dates: Optional[pd.Series] = None) -> "Calendar":
        """The calendar of the data config, its step read from ``dates`` (the table's) when given and a
        derived column reads the calendar."""
        reads = any(spec.kind == "calendar" for spec in cfg.derived.values())
        step = table_step(dates).total_seconds() if dates is not None and reads else None
        return cls(cfg.timezone, cfg.holidays, cfg.holiday_subdivision, step)

    @classmethod
    def of_table(cls, calendar: Optional["Calendar"], dates: pd.Series) -> "Calendar":
        """``calendar`` (none: no time zone nor holidays) with the step of the table of ``dates``."""
        known = calendar or cls()
        return cls(known.timezone, known.country, known.subdivision, table_step(dates).total_seconds())


def table_step(dates: pd.Series) -> pd.Timedelta:
    """The table's step: the most common gap between its consecutive distinct dates (one day when it has
    fewer than two)."""
    gaps = np.diff(np.sort(dates.dropna().to_numpy(dtype="datetime64[ns]")))
    gaps = gaps[gaps > np.timedelta64(0, "ns")]  # between distinct dates
    if not len(gaps):
        return pd.Timedelta(days=1)
    counts = pd.Series(gaps).value_counts().sort_index()  # hashed: a few distinct gaps; a tie: the shortest
    return pd.Timedelta(counts.index[int(np.argmax(counts.to_numpy()))])


def calendar_column(dates: pd.Series, spec: DerivedColumn, field: str, calendar: Calendar,
                    local: Optional[pd.Series] = None) -> np.ndarray:
    """(n,) float64: the derived column ``spec`` (kind calendar or holiday) of the table's ``dates`` (``local``:
    their local wall times when already read, `tamrun.data.dates.local_time`)."""
    local = local_time(dates, calendar.timezone) if local is None else local
    if spec.kind == "holiday":
        return day_flags(local, lambda days: holidays_on(days, calendar, spec.bridge))
    part = spec.part
    if part == "time_of_day":
        step = min(calendar.step_seconds or SECONDS_PER_DAY, SECONDS_PER_DAY)
        seconds = (local - local.dt.normalize()).dt.total_seconds().to_numpy(dtype=np.float64)
        return np.floor(seconds / step + 1e-9)
    if part == "day_off":
        if calendar.country is None:
            log.info("%s: day_off is the weekend only (data.holidays is not set; set it to a country code such as "
                     "FR to count its public holidays too)", field)
        return day_flags(local, lambda days: (weekday(days) >= 5) | holidays_on(days, calendar, spec.bridge))
    values = {"hour": lambda: local.dt.hour, "day_of_week": lambda: local.dt.day_of_week,
              "day_of_year": lambda: local.dt.day_of_year,
              "year_fraction": lambda: local.dt.day_of_year / (365 + local.dt.is_leap_year.astype(np.int64)),
              "week": lambda: local.dt.isocalendar().week, "month": lambda: local.dt.month,
              "weekend": lambda: local.dt.day_of_week >= 5}[part]()
    return np.asarray(values, dtype=np.float64)


def day_flags(local: pd.Series, flag: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """(n,) float64: ``flag`` of each row's local day (computed once per distinct day)."""
    days, inverse = np.unique(local.dt.normalize().to_numpy().astype("datetime64[D]"), return_inverse=True)
    return flag(days)[inverse].astype(np.float64)


def weekday(days: np.ndarray) -> np.ndarray:
    """(n,) 0 = Monday ... 6 = Sunday of ``days`` (datetime64[D]; 1970-01-01 was a Thursday)."""
    return (days.astype(np.int64) + 3) % 7


def holidays_on(days: np.ndarray, calendar: Calendar, bridge: bool) -> np.ndarray:
    """(n,) bool: whether each of ``days`` (datetime64[D]) is a public holiday of the calendar's country (none
    without one), or under ``bridge`` a bridge day."""
    if calendar.country is None or not len(days):
        return np.zeros(len(days), dtype=bool)
    years = days.astype("datetime64[Y]").astype(np.int64) + 1970
    known = holiday_dates(calendar.country, calendar.subdivision, int(years.min()) - 1, int(years.max()) + 1)

    def holiday(d: np.ndarray) -> np.ndarray:
        return np.isin(d, known)

    found = holiday(days)
    return found | bridge_days(days, holiday) if bridge else found


def bridge_days(days: np.ndarray, holiday: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """(n,) bool: working days with a holiday on one side and a day off (weekend or holiday) on the other."""
    def off(d: np.ndarray) -> np.ndarray:
        return (weekday(d) >= 5) | holiday(d)

    before, after = days - ONE_DAY, days + ONE_DAY
    return ~off(days) & ((holiday(before) & off(after)) | (off(before) & holiday(after)))


@functools.lru_cache(maxsize=32)
def holiday_dates(country: str, subdivision: Optional[str], first_year: int, last_year: int) -> np.ndarray:
    """The public holidays of ``country`` (and ``subdivision``) from ``first_year`` to ``last_year``, as
    datetime64[D] (the holidays package; the country and subdivision are checked with the config,
    `tamrun.config.checks`)."""
    import holidays  # imported when a table has holiday columns

    found = holidays.country_holidays(country, subdiv=subdivision, years=range(first_year, last_year + 1))
    return np.array(sorted(found), dtype="datetime64[D]")
