"""The table a run reads, opened once (docs/architecture.md, "The data stage").

    Table.open(cfg) -> Table            where the data lies and what it is (a Parquet file or folder; a CSV
                                        and its compression), its columns: one stat, one sniff, one header
    table.reach                         how far back its derived columns read (`tamrun.data.history.lookback`)
    table.window(split) -> DateWindow   the split's days, widened by that reach
    table.rows_bound() -> int           its rows at most, without reading them
    table.scan(window) -> TableScan     one pass over the group and date columns (kept: asked once)
    table.read(required, ...) -> LoadedTable   the columns and rows a run (or a chunk of groups) reads
    table.ref() -> TableRef             what a Ray task opens it again from, without sniffing

The memory plan (`tamrun.jobs.stream.stream_plan`), the in-memory load (`tamrun.pipeline.load_splits`), a
streamed chunk, the shards and the run's record (`tamrun.jobs.record.record_inputs`) all take the one
`Table` the job opened; a run never sniffs, stats or re-reads its file's header again. Derived columns are
computed after the read, by `tamrun.data.derive` (row-local kinds, the calendar) and `tamrun.data.history`
(lag, rolling, smooth), for whole groups: a chunk of groups reads its rows widened by `reach`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np
import pandas as pd

from tamrun.config.schema import DataConfig, SplitConfig
from tamrun.data.chunks import GroupChunk, TableScan
from tamrun.data.dates import FileDates, instant
from tamrun.data.file_kind import header_problem, sniff
from tamrun.data.history import lookback
from tamrun.data.load import (READ_ERRORS, LoadedTable, csv_options, read_header, read_rows, require_columns,
                              table_path, unreadable)
from tamrun.data.parquet import (DateWindow, arrow_errors, decoded, is_parquet, parquet_dataset, parquet_header,
                                 read_parquet, temporal, window_filter)
from tamrun.errors import DataError

log = logging.getLogger(__name__)

SCAN_BATCH_ROWS = 1 << 20  # rows of the group or date column a Parquet scan holds at a time
# The most rows a CSV can hold per byte of text: each cell is at least one character and a separator (an
# upper bound that spares the scan of a table that surely fits); a compressed CSV's text is taken as
# COMPRESSED_TEXT_RATIO times its file.
CSV_CELL_CHARS = 2
COMPRESSED_TEXT_RATIO = 10


@dataclass(frozen=True)
class TableRef:
    """What opens a `Table` again elsewhere without sniffing it (a Ray task's: plain, picklable data)."""

    path: str
    parquet: bool
    compression: Optional[str]
    columns: Tuple[str, ...]


class Table:
    """One table, opened once (module doc). ``columns``: the file's (a Parquet dataset's partition keys
    included); ``compression``: a CSV's, by its leading bytes (None: plain text, or Parquet)."""

    def __init__(self, cfg: DataConfig, path: Path, parquet: bool, compression: Optional[str],
                 columns: Tuple[str, ...], dataset=None) -> None:
        self.cfg, self.path, self.parquet, self.compression, self.columns = cfg, path, parquet, compression, columns
        self._dataset = dataset
        self._scans: Dict[Optional[DateWindow], TableScan] = {}

    @classmethod
    def open(cls, cfg: DataConfig) -> "Table":
        """The table data.path names (or the embedded one). `DataError` naming data.path when it is missing,
        not a data file, unreadable or empty (`tamrun.data.file_kind`, `tamrun.data.parquet`)."""
        path = table_path(cfg)
        if is_parquet(path):
            dataset = parquet_dataset(path)
            return cls(cfg, path, True, None, tuple(parquet_header(dataset)), dataset)
        compression = sniff(path)
        return cls(cfg, path, False, compression, tuple(read_header(path, cfg, compression)))

    @classmethod
    def reopen(cls, cfg: DataConfig, ref: TableRef) -> "Table":
        """The table of ``ref`` (`ref`), without sniffing its file nor reading its header again."""
        return cls(cfg, Path(ref.path), ref.parquet, ref.compression, tuple(ref.columns))

    def ref(self) -> TableRef:
        """What `reopen` takes: the absolute path, the kind, the compression, the columns."""
        return TableRef(str(self.path.resolve()), self.parquet, self.compression, self.columns)

    @property
    def dataset(self):
        """The pyarrow dataset of Parquet data (discovered once)."""
        if self._dataset is None:
            self._dataset = parquet_dataset(self.path)
        return self._dataset

    @property
    def reach(self) -> Optional[pd.Timedelta]:
        """How far back the derived columns read (None: no history column; `tamrun.data.history.UNBOUNDED`)."""
        return lookback(self.cfg.derived)

    def window(self, split: SplitConfig) -> DateWindow:
        """The days a run reads: ``split``'s periods, each widened by `reach`."""
        return DateWindow.of(split, self.cfg.timezone).widened(self.reach)

    def rows_bound(self) -> int:
        """An upper bound of the rows, read without reading them: Parquet's metadata (exact), or a CSV's
        size over `CSV_CELL_CHARS` per cell (x `COMPRESSED_TEXT_RATIO` when compressed)."""
        if self.parquet:
            with arrow_errors(self.path):
                return int(self.dataset.count_rows())
        text = self.path.stat().st_size * (1 if self.compression is None else COMPRESSED_TEXT_RATIO)
        return int(text // (CSV_CELL_CHARS * max(1, len(self.columns))))

    def scan(self, window: Optional[DateWindow] = None) -> TableScan:
        """The groups, their rows and the first date, reading only the group and date columns (Parquet: with
        ``window`` pushed down; a CSV in blocks of data.read_chunk_rows). Scanned once per window."""
        if window not in self._scans:
            if self.parquet:
                with arrow_errors(self.path):
                    groups, rows, origin = self._scan_parquet(window)
            else:
                groups, rows, origin = self._scan_csv()
            log.info("scanned %d rows of %d groups (columns %s and %s only)", int(rows.sum()), len(groups),
                     self.cfg.group, self.cfg.date_column)
            self._scans[window] = TableScan(groups, rows, origin)
        return self._scans[window]

    def _scan_parquet(self, window: Optional[DateWindow]):
        """(groups, rows per group, first date): the group column in batches with ``window`` pushed down,
        then the date column in batches for its first date (`SCAN_BATCH_ROWS` rows held at a time)."""
        import pyarrow.compute as pc

        cfg, dataset = self.cfg, self.dataset
        dates = temporal(dataset, cfg.date_column)
        keep = window_filter(dataset, cfg.date_column, window) if window is not None and dates else None
        totals: pd.Series = pd.Series(dtype=np.int64)
        for batch in dataset.to_batches(columns=[cfg.group], filter=keep, batch_size=SCAN_BATCH_ROWS):
            counts = pc.value_counts(decoded(batch.column(0))).flatten()
            part = pd.Series(counts[1].to_numpy(zero_copy_only=False), index=counts[0].to_numpy(zero_copy_only=False))
            totals = totals.add(part, fill_value=0)
        origin = None
        if dates:
            smallest = [pc.min(batch.column(0)).as_py() for batch in
                        dataset.to_batches(columns=[cfg.date_column], batch_size=SCAN_BATCH_ROWS)]
            origin = instant(min((value for value in smallest if value is not None), default=None), cfg.timezone)
        totals = totals.sort_index()
        return totals.index.tolist(), totals.to_numpy(dtype=np.int64), origin

    def _scan_csv(self):
        """(groups, rows per group, first date) of a CSV: its group and date columns read in blocks."""
        cfg = self.cfg
        totals: pd.Series = pd.Series(dtype=np.int64)
        first, dates = None, FileDates(cfg)
        try:
            with pd.read_csv(self.path, usecols=[cfg.group, cfg.date_column], chunksize=cfg.read_chunk_rows,
                             **csv_options(cfg, self.compression)) as reader:
                for block in reader:
                    block, _ = dates.parse(block)
                    totals = totals.add(block[cfg.group].value_counts(), fill_value=0)
                    smallest = block[cfg.date_column].min()
                    first = smallest if first is None or smallest < first else first
        except READ_ERRORS as exc:
            raise unreadable(self.path, exc, cfg) from None
        totals = totals.sort_index()
        return totals.index.tolist(), totals.to_numpy(dtype=np.int64), first

    def read(self, required: Optional[Mapping[str, str]] = None, optional: Iterable[str] = (),
             room: Callable[..., None] = lambda *step: None, window: Optional[DateWindow] = None,
             chunk: Optional[GroupChunk] = None) -> LoadedTable:
        """Read the table, parse the date column and sort rows by (date, group).

        ``required`` (config field -> column): the columns the run reads from the file, checked against
        its header before anything else is read; with it, only those, the date and ``optional`` (read
        when present) are loaded: the columns no effect uses never take memory. Without it, every column.
        ``room(what, step, nbytes)`` is called before each block of a CSV is read and before the blocks are
        joined (a check of the memory left, `tamrun.memory.guard.RoomCheck`; it may raise). ``window``: the
        split's days; Parquet data reads only their rows (a CSV is read whole, the split drops the rest).
        ``chunk``: only these groups' rows are read (`tamrun.data.chunks`; data.group names their column),
        and a derived ``time_index`` counts from its origin, the whole table's first date.

        Raises:
            DataError: a required column is absent, the date column is absent or unparseable, no rows.
        """
        cfg, path = self.cfg, self.path
        header = list(self.columns)
        needed = {"data.date_column": cfg.date_column, **(required or {})}
        split_wrong = None if self.parquet else header_problem(path, header, cfg.delimiter)
        if split_wrong is not None and any(column not in header for column in needed.values()):
            raise split_wrong
        require_columns(pd.DataFrame(columns=header), needed)
        wanted = None if required is None else {cfg.date_column, *required.values(), *optional}
        usecols = None if wanted is None else [c for c in header if c in wanted]
        read = None
        if self.parquet:
            frame, read = read_parquet(path, usecols, cfg, window, chunk, self.dataset)
        else:
            frame = read_rows(path, usecols, cfg, self.compression, room, chunk)
        if frame.empty:
            raise DataError("data.path", str(path), "the file has no rows" if read is None else "no rows in the "
                            "split's dates", "give a table with at least one data row" if read is None else
                            "move split.train_*/test_* inside the data's dates")
        sort_by = [cfg.date_column] + ([cfg.group] if cfg.group and cfg.group in frame.columns else [])
        frame = frame.sort_values(sort_by, kind="stable").reset_index(drop=True)
        log.info("loaded %d rows x %d columns from %s", len(frame), frame.shape[1], path)
        origin = chunk.origin if chunk is not None and chunk.origin is not None else read.first_date if read else None
        return LoadedTable(frame, origin, read)


def read_table(cfg: DataConfig, required: Optional[Mapping[str, str]] = None, optional: Iterable[str] = (),
               room: Callable[..., None] = lambda *step: None, window: Optional[DateWindow] = None,
               chunk: Optional[GroupChunk] = None) -> LoadedTable:
    """The table of ``cfg`` opened and read once (`Table.read`)."""
    return Table.open(cfg).read(required, optional, room, window, chunk)


def load_table(cfg: DataConfig, required: Optional[Mapping[str, str]] = None,
               optional: Iterable[str] = (), room: Callable[..., None] = lambda *step: None) -> pd.DataFrame:
    """The table's frame (`read_table` without a date window): every row."""
    return read_table(cfg, required, optional, room).frame
