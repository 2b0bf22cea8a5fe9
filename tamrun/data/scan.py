"""One pass over a table's group and date columns (`TableScan`): what a run streamed in chunks of groups
plans with (`tamrun.data.chunks`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from tamrun.config.schema import DataConfig
from tamrun.data.chunks import TableScan
from tamrun.data.dates import FileDates, instant
from tamrun.data.load import READ_ERRORS, csv_options, unreadable
from tamrun.data.parquet import DateWindow, arrow_errors, decoded, parquet_dataset, temporal, window_filter

log = logging.getLogger(__name__)

SCAN_BATCH_ROWS = 1 << 20  # rows of the group or date column a Parquet scan holds at a time


def scan_table(path: Path, parquet: bool, cfg: DataConfig, window: Optional[DateWindow]) -> TableScan:
    """The groups, their rows and the first date of the table at ``path``, reading only the group and date
    columns (Parquet: with the split's dates pushed down; a CSV in blocks of data.read_chunk_rows)."""
    if parquet:
        with arrow_errors(path):
            counts = scan_parquet(path, cfg, window)
    else:
        counts = scan_csv(path, cfg)
    groups, rows, origin = counts
    log.info("scanned %d rows of %d groups (columns %s and %s only)", int(rows.sum()), len(groups), cfg.group,
             cfg.date_column)
    return TableScan(groups, rows, origin)


def scan_parquet(path: Path, cfg: DataConfig, window: Optional[DateWindow]):
    """(groups, rows per group, first date) of Parquet data: the group column read in batches with the
    split's dates pushed down, then the date column in batches for its first date (a batch of
    `SCAN_BATCH_ROWS` rows held at a time, whatever the table's size)."""
    import pyarrow.compute as pc

    dataset = parquet_dataset(path)
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
        least = min((value for value in smallest if value is not None), default=None)
        origin = instant(least, cfg.timezone)
    totals = totals.sort_index()
    return totals.index.tolist(), totals.to_numpy(dtype=np.int64), origin


def scan_csv(path: Path, cfg: DataConfig):
    """(groups, rows per group, first date) of a CSV: its group and date columns read in blocks."""
    totals: pd.Series = pd.Series(dtype=np.int64)
    first, dates = None, FileDates(cfg)
    try:
        with pd.read_csv(path, usecols=[cfg.group, cfg.date_column], chunksize=cfg.read_chunk_rows,
                         **csv_options(path, cfg)) as reader:
            for block in reader:
                block, _ = dates.parse(block)
                totals = totals.add(block[cfg.group].value_counts(), fill_value=0)
                smallest = block[cfg.date_column].min()
                first = smallest if first is None or smallest < first else first
    except READ_ERRORS as exc:
        raise unreadable(path, exc, cfg) from None
    totals = totals.sort_index()
    return totals.index.tolist(), totals.to_numpy(dtype=np.int64), first
