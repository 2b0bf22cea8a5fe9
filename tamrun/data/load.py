"""Load the table the config names: the embedded national dataset or a user CSV."""

from __future__ import annotations

import logging
import zlib
from importlib import resources
from pathlib import Path
from typing import Mapping

import pandas as pd

from tamrun.config.schema import DataConfig, DataSource, NanPolicy
from tamrun.errors import DataError, os_reason

log = logging.getLogger(__name__)

EMBEDDED_NATIONAL = "force_national.csv.gz"


def embedded_path() -> Path:
    """Path of the embedded national dataset (see tamrun/data/national/README.md for provenance)."""
    return Path(str(resources.files("tamrun.data") / "national" / EMBEDDED_NATIONAL))


def load_table(cfg: DataConfig) -> pd.DataFrame:
    """Read the table, parse the date column and sort rows by (date, group).

    Raises:
        DataError: the file is missing, unreadable or empty, or the date column is absent/unparseable.
    """
    path = Path(cfg.path).expanduser() if cfg.source == DataSource.file else embedded_path()
    frame = read_csv(path)
    require_columns(frame, {"data.date_column": cfg.date_column})
    frame = parse_dates(frame, cfg.date_column, cfg.nan_policy)
    sort_by = [cfg.date_column] + ([cfg.group] if cfg.group and cfg.group in frame.columns else [])
    frame = frame.sort_values(sort_by, kind="stable").reset_index(drop=True)
    log.info("loaded %d rows x %d columns from %s", len(frame), frame.shape[1], path)
    return frame


def read_csv(path: Path) -> pd.DataFrame:
    """The CSV (optionally .gz) at ``path``, with at least one row and no column named twice.

    Raises:
        DataError: the path is not a readable file, or the table is empty, corrupt or ambiguous.
    """
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise DataError("data.path", str(path), f"the path cannot be used ({os_reason(exc)})",
                        "point data.path at an existing CSV file") from None
    if is_dir:
        raise DataError("data.path", str(path), "a folder, not a file", "point data.path at a CSV file inside it")
    if not is_file:
        raise DataError("data.path", str(path), "no such file", "point data.path at an existing CSV file")
    try:
        frame = pd.read_csv(path)
        header = pd.read_csv(path, header=None, nrows=1, dtype=str).iloc[0].tolist()
    except pd.errors.EmptyDataError:
        raise DataError("data.path", str(path), "the file is empty", "give a CSV with a header and rows") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)  # EOFError, zlib.error: a corrupt .gz
        raise DataError("data.path", str(path), f"the file cannot be read as CSV ({reason})",
                        "give a readable CSV file (optionally .gz)") from None
    if frame.empty:
        raise DataError("data.path", str(path), "the file has no rows", "give a CSV with at least one data row")
    repeated = sorted({name for name in header if header.count(name) > 1}, key=str)
    if repeated:
        raise DataError("data.path", str(path), f"the header names column(s) {repeated} more than once (pandas "
                        "would rename the copies and a setting could read the wrong one)",
                        "give every column a distinct name")
    return frame


def parse_dates(frame: pd.DataFrame, column: str, policy: NanPolicy) -> pd.DataFrame:
    """``frame`` with ``column`` parsed as timestamps. Timestamps with a UTC offset (``+01:00``,
    ``Z``) are converted to UTC and the offset dropped, so that one table may mix offsets (summer and
    winter time); timestamps without one are taken as they are. Blank cells are refused under
    data.nan_policy=error and their rows dropped (with a log line) under drop."""
    blank = frame[column].isna() | (frame[column].astype(str).str.strip() == "")
    if bool(blank.any()):
        if policy != NanPolicy.drop:
            raise DataError("data.date_column", column, f"{int(blank.sum())} row(s) have no date (first at line "
                            f"{int(blank.to_numpy().argmax()) + 2} of the file)",
                            "fill the dates, or set data.nan_policy=drop to drop those rows")
        log.warning("dropping %d row(s) without a date in column %r (data.nan_policy=drop)", int(blank.sum()), column)
        frame = frame[~blank.to_numpy()].reset_index(drop=True)
    try:
        dates = pd.to_datetime(frame[column], utc=True).dt.tz_localize(None)
    except (ValueError, TypeError) as exc:
        raise DataError("data.date_column", column, f"its values are not dates ({exc})",
                        "give ISO timestamps such as 2024-01-31 12:30:00") from None
    return frame.assign(**{column: dates})


def require_columns(frame: pd.DataFrame, columns: Mapping[str, str]) -> None:
    """Check that every configured column exists; ``columns`` maps config field -> column name."""
    for field, column in columns.items():
        if column not in frame.columns:
            raise DataError(field, column, "no such column in the data",
                            f"use one of: {', '.join(map(str, frame.columns))}")


def require_numeric(frame: pd.DataFrame, columns: Mapping[str, str]) -> None:
    """Check that every configured column holds numbers."""
    for field, column in columns.items():
        if not pd.api.types.is_numeric_dtype(frame[column]):
            example = frame[column].iloc[0]
            raise DataError(field, column, f"the column is not numeric (e.g. {example!r})",
                            "choose a numeric column, or derive one in data.derived")
