"""Split a table by calendar dates (inclusive days): local days under data.timezone (their midnights
converted to the table's UTC, `tamrun.data.dates.table_time`)."""

from __future__ import annotations

from typing import Optional, Tuple

import pandas as pd

from tamrun.config.schema import SplitConfig
from tamrun.data.dates import table_time
from tamrun.errors import ConfigError, DataError


def _day(value: Optional[str], field: str) -> Optional[pd.Timestamp]:
    if value is None:
        return None
    try:
        return pd.Timestamp(str(value)).normalize()
    except ValueError:
        raise ConfigError(field, value, "not a date", f"write {field} as YYYY-MM-DD") from None


def _between(dates: pd.Series, start: Optional[pd.Timestamp], end: Optional[pd.Timestamp],
             timezone: Optional[str] = None) -> pd.Series:
    keep = pd.Series(True, index=dates.index)
    if start is not None:
        keep &= dates >= table_time(pd.DatetimeIndex([start]), timezone)[0]
    if end is not None:
        keep &= dates < table_time(pd.DatetimeIndex([end + pd.Timedelta(days=1)]), timezone)[0]
    return keep


def in_periods(frame: pd.DataFrame, cfg: SplitConfig, date_column: str, timezone: Optional[str] = None) -> pd.Series:
    """Whether each row lies in the training or the test period (the others were read only as the history of
    derived columns, `tamrun.data.history`)."""
    dates = frame[date_column]
    periods = [(_day(getattr(cfg, f"{name}_start"), f"split.{name}_start"),
                _day(getattr(cfg, f"{name}_end"), f"split.{name}_end")) for name in ("train", "test")]
    return _between(dates, *periods[0], timezone) | _between(dates, *periods[1], timezone)


def split_by_date(frame: pd.DataFrame, cfg: SplitConfig, date_column: str,
                  timezone: Optional[str] = None) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Return (train, test): train_start <= day <= train_end, test_start <= day <= test_end (local days of
    ``timezone``, data.timezone, when set).

    Raises:
        ConfigError: a bound is not a date, a period ends before it starts, or the test period starts
            before the training one ends.
        DataError: a split has no rows.
    """
    train_start, train_end = _day(cfg.train_start, "split.train_start"), _day(cfg.train_end, "split.train_end")
    test_start, test_end = _day(cfg.test_start, "split.test_start"), _day(cfg.test_end, "split.test_end")
    for name, start, end in (("train", train_start, train_end), ("test", test_start, test_end)):
        if start is not None and end is not None and end < start:
            raise ConfigError(f"split.{name}_end", getattr(cfg, f"{name}_end"), f"the {name} period ends before it "
                              f"starts ({name}_start={getattr(cfg, f'{name}_start')})",
                              f"set split.{name}_end on or after split.{name}_start")
    if test_start <= train_end:
        raise ConfigError("split.test_start", cfg.test_start, f"the test period overlaps training (train_end={cfg.train_end})",
                          "start the test period after split.train_end")
    dates = frame[date_column]
    train = frame[_between(dates, train_start, train_end, timezone)]
    test = frame[_between(dates, test_start, test_end, timezone)]
    span = f"the data covers {dates.min():%Y-%m-%d} to {dates.max():%Y-%m-%d}"
    if train.empty:
        raise DataError("split.train_end", cfg.train_end, f"the training split has no rows ({span})",
                        "move split.train_start/train_end inside the data's dates")
    if test.empty:
        raise DataError("split.test_start", cfg.test_start, f"the test split has no rows ({span})",
                        "move split.test_start/test_end inside the data's dates")
    return train, test


def carve_validation(train: pd.DataFrame, cfg: SplitConfig, date_column: str,
                     timezone: Optional[str] = None) -> Tuple[pd.DataFrame, Optional[pd.DataFrame]]:
    """Return (fit rows, validation rows) of the training split: validation_start <= day <=
    validation_end (default train_end) is held out; (train, None) without a validation split.

    Raises:
        ConfigError: a bound is not a date or lies outside the training period.
        DataError: the validation or the remaining fit rows are empty.
    """
    if cfg.validation_start is None:
        return train, None
    start = _day(cfg.validation_start, "split.validation_start")
    end = _day(cfg.validation_end, "split.validation_end") if cfg.validation_end is not None else _day(
        cfg.train_end, "split.train_end")
    if end > _day(cfg.train_end, "split.train_end") or end < start:
        raise ConfigError("split.validation_end", cfg.validation_end,
                          f"the validation period must lie inside training (train_end={cfg.train_end}) and end "
                          f"after validation_start={cfg.validation_start}",
                          "set split.validation_end between split.validation_start and split.train_end, or null")
    held = _between(train[date_column], start, end, timezone)
    fit, validation = train[~held], train[held]
    if validation.empty or fit.empty:
        which = "validation" if validation.empty else "remaining training"
        raise DataError("split.validation_start", cfg.validation_start, f"the {which} rows are empty",
                        "choose a validation period inside the training dates that leaves rows to fit")
    return fit, validation
