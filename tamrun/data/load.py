"""Reading a table's file, the helpers of `tamrun.data.table.Table` (which opens the table once and reads
it): where the data lies (`table_path`: the embedded national dataset or data.path), a CSV's header and
rows in blocks, the errors of a file that cannot be read, and the check of the columns a run names."""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import pandas as pd

from tamrun.config.schema import DataConfig, DataSource
from tamrun.data.chunks import GroupChunk, keep_groups
from tamrun.data.dates import FileDates
from tamrun.data.file_kind import (EXCERPT_CHARS, EXCERPT_NAMES, NOT_QUOTED, decode_problem, local_path, quotable,
                                    regular_file, use_one_of)
from tamrun.data.parquet import ParquetRead, is_parquet
from tamrun.errors import DataError, os_reason

log = logging.getLogger(__name__)

EMBEDDED_NATIONAL = "force_national.csv.gz"


def embedded_path() -> Path:
    """Path of the embedded national dataset (see tamrun/data/national/README.md for provenance)."""
    return Path(str(resources.files("tamrun.data") / "national" / EMBEDDED_NATIONAL))


RAW_NATIONAL_COLUMNS = ("date", "Load", "temperature")  # what a raw table of the national load holds


def write_raw_national(path: Path) -> Path:
    """Write the embedded table as a raw one to ``path`` (CSV; compressed as its suffix says, e.g. .gz): its date,
    Load and temperature only (`RAW_NATIONAL_COLUMNS`), every other column left for tamrun to derive
    (conf/derived/national.yaml). Returns ``path``."""
    pd.read_csv(embedded_path(), usecols=list(RAW_NATIONAL_COLUMNS), dtype=str).to_csv(path, index=False)
    return Path(path)


def table_path(cfg: DataConfig) -> Path:
    """The data the config names (data.path, or the embedded dataset): a folder of Parquet files, else a
    regular file; `DataError` otherwise, saying what it is (`tamrun.data.file_kind.regular_file`)."""
    path = local_path(cfg.path) if cfg.source == DataSource.file else embedded_path()
    return path if os.path.isdir(path) and is_parquet(path) else regular_file(path)


# What reading a CSV (optionally .gz) raises for a file that is not one: EOFError and zlib.error are a
# truncated or corrupt .gz.
READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError)
LONGEST_REASON = 200  # characters of a reader's message an error quotes (it may quote the file)


def unreadable(path: Path, exc: BaseException, cfg: DataConfig) -> DataError:
    """The `DataError` for a file that cannot be read as CSV: not in data.encoding (`decode_problem`), or
    the reader's reason, cut short (it may quote a line of the file; the error redacts it)."""
    if isinstance(exc, UnicodeDecodeError):
        return decode_problem(path, exc, cfg.encoding)
    reason = os_reason(exc) if isinstance(exc, OSError) else str(exc).strip()
    reason = reason if len(reason) <= LONGEST_REASON else reason[:LONGEST_REASON] + "..."
    return DataError("data.path", str(path), f"the file cannot be read as CSV ({reason})",
                     "give a readable CSV file (optionally compressed: .gz, .bz2, .xz, .zst, .zip)")


def csv_options(cfg: DataConfig, compression: Optional[str]) -> Dict[str, Any]:
    """pandas' reading options of a CSV: the delimiter and encoding of the config, the ``compression`` its
    content shows (`tamrun.data.file_kind.sniff`, called once when the table is opened)."""
    return {"sep": cfg.delimiter, "encoding": cfg.encoding, "compression": compression}


def read_header(path: Path, cfg: DataConfig, compression: Optional[str]) -> List[str]:
    """The file's column names, none named twice (pandas would rename the copies, and a setting could
    read the wrong one). `DataError` naming data.path otherwise."""
    try:
        header = [str(name) for name in pd.read_csv(path, header=None, nrows=1, dtype=str,
                                                    **csv_options(cfg, compression)).iloc[0].tolist()]
    except pd.errors.EmptyDataError:
        raise DataError("data.path", str(path), "the file is empty", "give a CSV with a header and rows") from None
    except READ_ERRORS as exc:
        raise unreadable(path, exc, cfg) from None
    repeated = sorted({name for name in header if header.count(name) > 1}, key=str)
    if repeated:
        named = [name[:EXCERPT_CHARS] for name in repeated[:EXCERPT_NAMES]] if all(map(quotable, header)) else \
            f"({len(repeated)} of them; {NOT_QUOTED})"
        raise DataError("data.path", str(path), f"the header names column(s) {named} more than once "
                        "(pandas would rename the copies and a setting could read the wrong one)",
                        "give every column a distinct name")
    return header


@dataclass
class LoadedTable:
    """The table a run reads, sorted by (date, group); ``origin``: the first date of the whole data (a
    derived ``time_index`` counts from it; None: the table's own first date); ``parquet``: what a
    Parquet read read (`ParquetRead`), None for a CSV."""

    frame: pd.DataFrame
    origin: Optional[pd.Timestamp] = None
    parquet: Optional[ParquetRead] = None


def read_rows(path: Path, usecols: Optional[List[str]], cfg: DataConfig, compression: Optional[str],
              room: Callable[..., None], chunk: Optional[GroupChunk] = None) -> pd.DataFrame:
    """The file's rows (``usecols`` only, if given; ``chunk``: only its groups' rows, kept from each block
    before its dates are parsed) with the date column parsed in one format, the first
    date's (`tamrun.data.dates`), read in blocks of data.read_chunk_rows so that the text and date strings
    of one block are held at a time. The room for each block is checked before it is read (as big as the
    last one), and for joining them."""
    parts, dropped, rows, last, held, dates = [], 0, 0, 0, 0, FileDates(cfg)
    try:
        with pd.read_csv(path, usecols=usecols, chunksize=cfg.read_chunk_rows,
                         **csv_options(cfg, compression)) as reader:
            while True:
                room(f"parsing the data (rows {rows + 1}-{rows + cfg.read_chunk_rows})", "read", last)
                block = next(reader, None)
                if block is None:
                    break
                rows += len(block)
                block, blank = dates.parse(keep_groups(block, cfg.group, chunk))
                parts.append(block)
                dropped += blank
                last = frame_bytes(block)
                held += last
    except READ_ERRORS as exc:
        raise unreadable(path, exc, cfg) from None
    if dropped:
        log.warning("dropping %d row(s) without a date in column %r (data.nan_policy=drop)", dropped, cfg.date_column)
    room("joining and sorting the data", "join", held)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=usecols)


def frame_bytes(frame: pd.DataFrame) -> int:
    """Bytes of a table's columns (object columns counted by their pointers: a lower bound)."""
    return int(frame.memory_usage(index=False, deep=False).sum())


def require_columns(frame: pd.DataFrame, columns: Mapping[str, str]) -> None:
    """Check that every configured column exists; ``columns`` maps config field -> column name."""
    for field, column in columns.items():
        if column not in frame.columns:
            raise DataError(field, column, "no such column in the data", use_one_of(frame.columns))

