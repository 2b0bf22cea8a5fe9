"""Parquet data: a file, or a folder of Parquet files (a partitioned dataset, ``key=value`` folders read
as columns), read by pyarrow with only what the run uses.

- **Columns.** Only the columns the run reads (the date, the target, the group, the effects' columns)
  are read: a Parquet file stores each column apart, so the others are never decoded.
- **Rows.** The split's periods (`DateWindow`: split.train_start..train_end and test_start..test_end,
  inclusive days) are pushed down to pyarrow as a filter on the date column when that column holds
  timestamps or dates: row groups (and partitions) outside the periods are skipped by their statistics,
  and the rows kept are those of the split. A date column of text is read whole and parsed as a CSV's
  (`tamrun.data.dates`); the calendar split drops the other rows after.
- **Origin.** A derived ``time_index`` counts from the table's first date: with a filter the first date
  read may be later, so `read_parquet` also returns the first date of the whole column (`ParquetRead`).

`ParquetRead` reports what was read (columns, rows, whether the filter was pushed down): the run logs it,
and the tests check it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import pandas as pd

from tamrun.config.schema import DataConfig, SplitConfig
from tamrun.data.chunks import GroupChunk, group_filter
from tamrun.errors import DataError

log = logging.getLogger(__name__)

PARQUET_MAGIC = b"PAR1"
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
FIX_PARQUET = "point data.path at a Parquet file, or a folder of Parquet files"
ONE_DAY = pd.Timedelta(days=1)


def is_parquet(path: Path) -> bool:
    """Whether ``path`` is a Parquet file (its first bytes are ``PAR1``) or a folder holding Parquet files."""
    if os.path.isdir(path):  # (False, not an error, for a name too long)
        return any(name.endswith(PARQUET_SUFFIXES) for _, _, names in os.walk(path) for name in names)
    try:
        with open(path, "rb") as file:
            return file.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class DateWindow:
    """The days a run reads: the training period and the test period, each [start, end] inclusive (None:
    open). Validation lies inside training."""

    periods: Tuple[Tuple[Optional[pd.Timestamp], Optional[pd.Timestamp]], ...]

    @classmethod
    def of(cls, split: SplitConfig) -> "DateWindow":
        """The window of a split config (its bounds checked later by `tamrun.data.split`; one that is not
        a date leaves its side open here)."""
        def day(value: Optional[str]) -> Optional[pd.Timestamp]:
            try:
                return None if value is None else pd.Timestamp(str(value)).normalize()
            except ValueError:
                return None
        return cls(((day(split.train_start), day(split.train_end)), (day(split.test_start), day(split.test_end))))

    @property
    def lower(self) -> Optional[pd.Timestamp]:
        """The earliest day read (None: no lower bound)."""
        starts = [start for start, _ in self.periods]
        return None if any(start is None for start in starts) else min(starts)


@dataclass(frozen=True)
class ParquetRead:
    """What `read_parquet` read: the columns, the rows, whether the date filter was pushed down, and the
    first date of the whole date column (the origin of a derived ``time_index``)."""

    columns: List[str]
    rows: int
    pushed_down: bool
    first_date: Optional[pd.Timestamp]
    groups_pushed_down: bool = False  # only a chunk's groups were read (`tamrun.data.chunks`)


def parquet_dataset(path: Path, field: str = "data.path"):
    """The pyarrow dataset of a file or a (hive-partitioned) folder; a `DataError` naming ``field`` when
    pyarrow cannot read it."""
    import pyarrow.dataset as ds  # imported only when a Parquet table is read

    try:
        return ds.dataset(str(path), format="parquet", partitioning="hive")
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DataError(field, str(path), f"the Parquet data cannot be read ({reason})", FIX_PARQUET) from None


def parquet_header(dataset) -> List[str]:
    """The dataset's column names (partition keys included)."""
    return [str(name) for name in dataset.schema.names]


def temporal(dataset, column: str) -> bool:
    """Whether ``column`` holds timestamps or dates (a filter on it can be pushed down)."""
    import pyarrow as pa

    kind = dataset.schema.field(column).type
    return pa.types.is_timestamp(kind) or pa.types.is_date(kind)


def window_filter(dataset, column: str, window: DateWindow):
    """pyarrow's filter expression keeping the rows of ``window``'s periods (None: every row)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    kind = dataset.schema.field(column).type
    field, keep = ds.field(column), None
    for start, end in window.periods:
        part = None
        for bound, keeps in ((start, lambda f, s: f >= s), (None if end is None else end + ONE_DAY, lambda f, s: f < s)):
            if bound is None:
                continue
            scalar = pa.scalar(bound.date() if pa.types.is_date(kind) else bound.to_pydatetime(), type=kind)
            term = keeps(field, scalar)
            part = term if part is None else part & term
        if part is None:
            return None  # a period open at both ends: every row
        keep = part if keep is None else keep | part
    return keep


def first_date(dataset, column: str) -> Optional[pd.Timestamp]:
    """The earliest value of the date column over the whole dataset (only that column is read)."""
    import pyarrow.compute as pc

    smallest = pc.min(dataset.to_table(columns=[column]).column(column)).as_py()
    return None if smallest is None else naive_utc(pd.Series([pd.Timestamp(smallest)])).iloc[0]


def naive_utc(dates: pd.Series) -> pd.Series:
    """Timestamps with a time zone converted to UTC and the zone dropped (as the CSV's dates,
    `tamrun.data.dates`); others as they are, as datetime64."""
    dates = pd.to_datetime(dates)
    return dates.dt.tz_convert("UTC").dt.tz_localize(None) if dates.dt.tz is not None else dates


def without_blank_dates(frame: pd.DataFrame, column: str, cfg: DataConfig) -> pd.DataFrame:
    """``frame`` without its rows of no date under data.nan_policy=drop; a `DataError` under error (as a
    CSV's blank dates, `tamrun.data.dates.parse_dates`)."""
    from tamrun.config.schema import NanPolicy

    blank = frame[column].isna()
    if not blank.any():
        return frame
    if cfg.nan_policy != NanPolicy.drop:
        raise DataError("data.date_column", column, f"{int(blank.sum())} row(s) have no date",
                        "fill the dates, or set data.nan_policy=drop to drop those rows")
    log.warning("dropping %d row(s) without a date in column %r (data.nan_policy=drop)", int(blank.sum()), column)
    return frame[~blank.to_numpy()]


def read_parquet(path: Path, usecols: Optional[List[str]], cfg: DataConfig, window: Optional[DateWindow],
                 chunk: Optional[GroupChunk] = None) -> Tuple[pd.DataFrame, ParquetRead]:
    """The rows of ``window`` (all without one) and the ``usecols`` columns (all: None) of the Parquet data
    at ``path``, the date column as naive timestamps (text dates parsed as a CSV's), and what was read.
    ``chunk``: only its groups' rows (a filter on data.group pushed down beside the dates')."""
    from tamrun.data.dates import FileDates

    dataset = parquet_dataset(path)
    column = cfg.date_column
    pushed = window is not None and temporal(dataset, column)
    keep = window_filter(dataset, column, window) if pushed else None
    groups = group_filter(cfg.group, chunk)
    keep = groups if keep is None else keep if groups is None else keep & groups
    try:
        table = dataset.to_table(columns=usecols, filter=keep)
    except (OSError, ValueError) as exc:
        raise DataError("data.path", str(path), f"the Parquet data cannot be read ({str(exc).strip()[:200]})",
                        FIX_PARQUET) from None
    frame = table.to_pandas()
    if temporal(dataset, column):
        frame = without_blank_dates(frame, column, cfg)
        frame[column] = naive_utc(frame[column])
        origin = first_date(dataset, column) if pushed and window.lower is not None and chunk is None else None
    else:
        frame, dropped = FileDates(cfg).parse(frame)
        if dropped:
            log.warning("dropping %d row(s) without a date in column %r (data.nan_policy=drop)", dropped, column)
        origin = None
    read = ParquetRead(list(table.column_names), table.num_rows, pushed, origin, groups is not None)
    log.info("read %d rows x %d columns (%s) of the Parquet data %s%s", read.rows, len(read.columns),
             ", ".join(read.columns), path, ", the split's dates pushed down" if pushed else "")
    return frame, read
