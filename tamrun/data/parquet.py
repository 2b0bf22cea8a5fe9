"""Parquet data: a file, or a folder of Parquet files (a partitioned dataset, ``key=value`` folders read
as columns), read by pyarrow with only what the run uses.

- **Columns.** Only the columns the run reads (the date, the target, the group, the effects' columns)
  are read: a Parquet file stores each column apart, so the others are never decoded.
- **Rows.** The split's periods (`DateWindow`: split.train_start..train_end and test_start..test_end,
  inclusive days) are pushed down to pyarrow as a filter on the date column when that column holds
  timestamps or dates: row groups (and partitions) outside the periods are skipped by their statistics,
  and the rows kept are those of the split. A date column of text is read whole and parsed as a CSV's
  (`tamrun.data.dates`); the calendar split drops the other rows after. Under data.timezone the days are
  local midnights: converted to UTC for a column of timestamps with a zone, as they are for naive
  timestamps (local wall times, converted to UTC once read: `tamrun.data.dates.LocalClock`) and for dates.
- **Origin.** A derived ``time_index`` counts from the table's first date: with a filter the first date
  read may be later, so `read_parquet` also returns the first date of the whole column (`ParquetRead`).

`ParquetRead` reports what was read (columns, rows, whether the filter was pushed down): the run logs it,
and the tests check it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np
import pandas as pd

from tamrun.config.schema import DataConfig, SplitConfig
from tamrun.data.chunks import GroupChunk, group_filter
from tamrun.data.dates import FileDates, LocalClock, instant, table_time, warn_utc_calendar
from tamrun.data.file_kind import EXCERPT_NAMES
from tamrun.errors import DataError

log = logging.getLogger(__name__)

PARQUET_MAGIC = b"PAR1"
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
FIX_PARQUET = "point data.path at a Parquet file, or a folder of Parquet files"
ONE_DAY = pd.Timedelta(days=1)


IGNORED_PREFIXES = (".", "_")  # names pyarrow skips in a folder: _SUCCESS, _metadata, .crc files, hidden folders


def parquet_state(path: str) -> str:
    """What the file at ``path`` is by its bytes: ``parquet`` (``PAR1`` at both ends), ``cut`` (``PAR1`` at
    the start only: a write cut short), ``empty`` (no bytes, or it cannot be opened), ``special`` (not a
    regular file: a FIFO is never opened, opening it would wait for a writer) or ``other``."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return "special"
        with open(path, "rb") as file:
            head = file.read(len(PARQUET_MAGIC))
            if head != PARQUET_MAGIC:
                return "other" if head else "empty"
            file.seek(-len(PARQUET_MAGIC), os.SEEK_END)
            return "parquet" if file.tell() >= len(PARQUET_MAGIC) and file.read() == PARQUET_MAGIC else "cut"
    except OSError:
        return "empty"


def is_parquet(path: Path) -> bool:
    """Whether ``path`` is a Parquet file (its first bytes are ``PAR1``) or a folder holding Parquet files."""
    if os.path.isdir(path):  # (False, not an error, for a name too long)
        return any(name.endswith(PARQUET_SUFFIXES) for _, _, names in os.walk(path) for name in names)
    return parquet_state(str(path)) in ("parquet", "cut")


def folder_files(folder: Path, field: str = "data.path") -> List[str]:
    """The Parquet files of a folder (its sub-folders included), by their content. Skipped, and logged: the
    names pyarrow skips (`IGNORED_PREFIXES`), empty files, files that are not Parquet (a README.txt) and
    what is not a regular file (a FIFO, a device); a
    `DataError` naming a Parquet file cut short, or a file named as Parquet that is not one (their rows
    would be lost)."""
    files, ignored = [], []
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith(IGNORED_PREFIXES))
        for name in sorted(names):
            path = os.path.join(root, name)
            state = "skipped" if name.startswith(IGNORED_PREFIXES) else parquet_state(path)
            if state == "cut" or (state == "other" and name.endswith(PARQUET_SUFFIXES)):
                raise DataError(field, path, "a Parquet file cut short (no PAR1 footer)" if state == "cut" else
                                "a file named as Parquet that is not one (its first bytes are not PAR1)",
                                "rewrite the file, or remove it from the folder")
            (files if state == "parquet" else ignored).append(path)
    if ignored:
        log.warning("ignoring %d file(s) of the Parquet folder %s (not Parquet, empty, not a regular file, or named "
                    "with a leading '.' or '_'): %s", len(ignored), folder,
                    ", ".join(os.path.relpath(path, folder) for path in ignored[:EXCERPT_NAMES]))
    return files


def hive_keys(folder: Path, files: List[str]) -> List[str]:
    """The partition keys of a folder's files (``key=value`` sub-folders), in order of first use."""
    keys: List[str] = []
    for path in files:
        for part in Path(os.path.relpath(path, folder)).parts[:-1]:
            if "=" in part and part.split("=", 1)[0] not in keys:
                keys.append(part.split("=", 1)[0])
    return keys


@dataclass(frozen=True)
class DateWindow:
    """The days a run reads: the training period and the test period, each [start, end] inclusive (None:
    open). Validation lies inside training."""

    periods: Tuple[Tuple[Optional[pd.Timestamp], Optional[pd.Timestamp]], ...]
    timezone: Optional[str] = None  # data.timezone: the days are its local days

    @classmethod
    def of(cls, split: SplitConfig, timezone: Optional[str] = None) -> "DateWindow":
        """The window of a split config (its bounds checked later by `tamrun.data.split`; one that is not
        a date leaves its side open here)."""
        def day(value: Optional[str]) -> Optional[pd.Timestamp]:
            try:
                return None if value is None else pd.Timestamp(str(value)).normalize()
            except ValueError:
                return None
        return cls(((day(split.train_start), day(split.train_end)), (day(split.test_start), day(split.test_end))),
                   timezone)

    def widened(self, reach: Optional[pd.Timedelta]) -> "DateWindow":
        """The window with each period starting ``reach`` earlier (whole days, one more for the day a UTC date
        may lie apart from its local one), so that the history columns of a period's first rows find their
        earlier rows (`tamrun.data.history.lookback`; None: as it is; `UNBOUNDED`: no lower bound). The split
        drops the rows read before a period: they are only history."""
        if reach is None:
            return self
        days = None if reach == pd.Timedelta.max else pd.Timedelta(days=int(np.ceil(reach / ONE_DAY)) + 1)
        return DateWindow(tuple((None if start is None or days is None else start - days, end)
                                for start, end in self.periods), self.timezone)

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
    """The pyarrow dataset of a file or a (hive-partitioned) folder (`folder_files`: its Parquet files only);
    a `DataError` naming ``field`` when pyarrow cannot read it, or when a partition key is also a column of
    the files (which of the two holds the value?)."""
    import pyarrow.dataset as ds  # imported only when a Parquet table is read
    import pyarrow.parquet as pq

    folder = os.path.isdir(path)
    try:
        files = folder_files(path, field) if folder else [str(path)]
        if not files:
            raise DataError(field, str(path), "the folder holds no Parquet data (its files are empty or not Parquet)",
                            FIX_PARQUET)
        keys = hive_keys(path, files) if folder else []
        both = [key for key in keys if key in pq.read_schema(files[0]).names] if keys else []
        if both:
            raise DataError(field, str(path), f"the partition key {both[0]!r} (folders {both[0]}=...) is also a column "
                            f"of the files ({files[0]}): which of the two holds the value is ambiguous",
                            f"drop the column {both[0]!r} from the files (the folder names give it), or rename the "
                            "folders' key")
        return ds.dataset(files if folder else str(path), format="parquet", partitioning="hive",
                          partition_base_dir=str(path) if folder else None)
    except (OSError, ValueError, TypeError) as exc:  # ArrowInvalid is a ValueError, ArrowTypeError a TypeError
        raise unreadable_parquet(path, exc, field) from None


def unreadable_parquet(path: Path, exc: BaseException, field: str = "data.path") -> DataError:
    """The `DataError` for Parquet data pyarrow cannot read: the first line of its reason, cut short."""
    reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return DataError(field, str(path), f"the Parquet data cannot be read ({reason})", FIX_PARQUET)


@contextlib.contextmanager
def arrow_errors(path: Path) -> Iterator[None]:
    """What pyarrow raises while the block reads the data at ``path`` (a file that does not match the
    others' schema, a corrupt page) as the `DataError` naming data.path (`unreadable_parquet`)."""
    try:
        yield
    except (OSError, ValueError, TypeError) as exc:  # ArrowInvalid is a ValueError, ArrowTypeError a TypeError
        raise unreadable_parquet(path, exc) from None


def decoded(values):
    """A pyarrow array, chunked array or table with its dictionary-encoded columns as plain values of their
    value type (a categorical column written by pandas, ``dictionary_encode()``): the run, its model's
    signature and its input example see strings or numbers, never categories."""
    import pyarrow as pa

    if isinstance(values, pa.Table):
        if not any(pa.types.is_dictionary(kind) for kind in values.schema.types):
            return values
        return pa.Table.from_arrays([decoded(column) for column in values.columns], names=values.column_names,
                                    metadata=values.schema.metadata)
    return values.cast(values.type.value_type) if pa.types.is_dictionary(values.type) else values


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
            scalar = pa.scalar(column_bound(bound, kind, window.timezone), type=kind)
            term = keeps(field, scalar)
            part = term if part is None else part & term
        if part is None:
            return None  # a period open at both ends: every row
        keep = part if keep is None else keep | part
    return keep


def column_bound(day: pd.Timestamp, kind, timezone: Optional[str]):
    """A local midnight ``day`` as a bound of a column of pyarrow type ``kind``: a date; for timestamps with a
    zone (pyarrow reads a naive bound as UTC) its UTC time under data.timezone; naive timestamps hold local
    times (or, without data.timezone, the table's own), compared as they are."""
    import pyarrow as pa

    if pa.types.is_date(kind):
        return day.date()
    zoned = kind.tz is not None
    return (table_time(pd.DatetimeIndex([day]), timezone)[0] if zoned else day).to_pydatetime()


def first_date(dataset, column: str, timezone: Optional[str] = None) -> Optional[pd.Timestamp]:
    """The earliest value of the date column over the whole dataset (only that column is read), as the
    table holds it (`tamrun.data.dates.instant`)."""
    import pyarrow.compute as pc

    smallest = pc.min(dataset.to_table(columns=[column]).column(column)).as_py()
    return instant(smallest, timezone)


def naive_utc(dates: pd.Series) -> pd.Series:
    """Timestamps with a time zone converted to UTC and the zone dropped (as the CSV's dates,
    `tamrun.data.dates`); others as they are, as datetime64."""
    dates = pd.to_datetime(dates)
    return dates.dt.tz_convert("UTC").dt.tz_localize(None) if dates.dt.tz is not None else dates


def table_dates(frame: pd.DataFrame, column: str, cfg: DataConfig) -> pd.Series:
    """A column of timestamps or dates as the table holds it: a zone's converted to naive UTC; naive ones,
    under data.timezone, local times converted to UTC (`tamrun.data.dates.LocalClock`, rows counted in the
    order read)."""
    raw = pd.to_datetime(frame[column])
    dates = naive_utc(raw)
    clock = LocalClock.of(cfg)
    if raw.dt.tz is not None:
        warn_utc_calendar(cfg)
    if clock is None or raw.dt.tz is not None:
        return dates
    return clock.utc(dates, np.ones(len(dates), dtype=bool), frame, column, frame[column],
                     lambda row: f"row {row} of the Parquet data (counted from 0, in the order read)")


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
                 chunk: Optional[GroupChunk] = None, dataset=None) -> Tuple[pd.DataFrame, ParquetRead]:
    """The rows of ``window`` (all without one) and the ``usecols`` columns (all: None) of the Parquet data
    at ``path``, the date column as naive timestamps (text dates parsed as a CSV's), and what was read.
    ``chunk``: only its groups' rows (a filter on data.group pushed down beside the dates'). ``dataset``: the
    data's pyarrow dataset, when it is open already (`tamrun.data.table.Table`)."""
    dataset = parquet_dataset(path) if dataset is None else dataset
    column = cfg.date_column
    pushed = window is not None and temporal(dataset, column)
    keep = window_filter(dataset, column, window) if pushed else None
    groups = group_filter(cfg.group, chunk)
    keep = groups if keep is None else keep if groups is None else keep & groups
    with arrow_errors(path):
        table = dataset.to_table(columns=usecols, filter=keep)
        frame = decoded(table).to_pandas()
    if temporal(dataset, column):
        frame = without_blank_dates(frame, column, cfg).reset_index(drop=True)
        frame[column] = table_dates(frame, column, cfg)
        with arrow_errors(path):
            origin = first_date(dataset, column, cfg.timezone) if pushed and window.lower is not None and chunk is None \
                else None
    else:
        frame, dropped = FileDates(cfg).parse(frame)
        if dropped:
            log.warning("dropping %d row(s) without a date in column %r (data.nan_policy=drop)", dropped, column)
        origin = None
    read = ParquetRead(list(table.column_names), table.num_rows, pushed, origin, groups is not None)
    log.info("read %d rows x %d columns (%s) of the Parquet data %s%s", read.rows, len(read.columns),
             ", ".join(read.columns), path, ", the split's dates pushed down" if pushed else "")
    return frame, read
