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
from tamrun.data.dates import FileDates
from tamrun.data.load import READ_ERRORS, csv_options, unreadable
from tamrun.data.parquet import DateWindow, naive_utc, parquet_dataset, temporal, window_filter

log = logging.getLogger(__name__)


def scan_table(path: Path, parquet: bool, cfg: DataConfig, window: Optional[DateWindow]) -> TableScan:
    """The groups, their rows and the first date of the table at ``path``, reading only the group and date
    columns (Parquet: with the split's dates pushed down; a CSV in blocks of data.read_chunk_rows)."""
    counts = scan_parquet(path, cfg, window) if parquet else scan_csv(path, cfg)
    groups, rows, origin = counts
    log.info("scanned %d rows of %d groups (columns %s and %s only)", int(rows.sum()), len(groups), cfg.group,
             cfg.date_column)
    return TableScan(groups, rows, origin)


def scan_parquet(path: Path, cfg: DataConfig, window: Optional[DateWindow]):
    """(groups, rows per group, first date) of Parquet data: two columns read, the dates pushed down."""
    import pyarrow.compute as pc

    dataset = parquet_dataset(path)
    dates = temporal(dataset, cfg.date_column)
    keep = window_filter(dataset, cfg.date_column, window) if window is not None and dates else None
    counts = pc.value_counts(dataset.to_table(columns=[cfg.group], filter=keep).column(cfg.group)).flatten()
    groups, rows = counts[0].to_numpy(zero_copy_only=False), counts[1].to_numpy(zero_copy_only=False)
    order = np.argsort(groups, kind="stable")
    origin = None
    if dates:
        smallest = pc.min(dataset.to_table(columns=[cfg.date_column]).column(cfg.date_column)).as_py()
        origin = None if smallest is None else naive_utc(pd.Series([pd.Timestamp(smallest)])).iloc[0]
    return groups[order].tolist(), rows[order].astype(np.int64), origin


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
