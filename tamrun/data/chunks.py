"""A table read in chunks of groups, for data larger than memory (`tamrun.jobs.stream`).

    Table.scan(window) -> TableScan   (`tamrun.data.table`) one pass over the group and date columns:
                                      the groups, their rows, the first date
    Table.read(..., chunk=GroupChunk(groups, origin)) then reads only those groups' rows:

- **Parquet**: the chunk's groups are pushed down to pyarrow as a filter (``group in (...)``) beside the
  split's dates, so row groups and partitions of other groups are skipped by their statistics and the
  rows of other groups are never turned into a frame (`tamrun.data.parquet.read_parquet`).
- **CSV**: each chunk reads the file again in blocks of data.read_chunk_rows and keeps the chunk's rows
  of each block before its dates are parsed (`tamrun.data.load.read_rows`): one block of text and one
  chunk of rows are held at a time. A chunk costs a pass over the file (C chunks, C passes); a one-pass
  spill to a temporary Parquet dataset would read the text once, but it needs disk as large as the
  table and a second reader with the CSV's options (delimiter, encoding, the dates' one format, blank
  dates): the CSV is read by the one reader it has, and data this large is better stored as Parquet.

``origin``: the first date of the whole table (a derived ``time_index`` counts from it), so that every
chunk derives the same columns as the whole table would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import pandas as pd



@dataclass(frozen=True)
class GroupChunk:
    """The groups a chunk reads (values of data.group, as the file holds them) and the whole table's
    first date (None: the chunk's own, as an unchunked read)."""

    groups: Sequence
    origin: Optional[pd.Timestamp] = None


@dataclass(frozen=True)
class TableScan:
    """The groups of a table in the order they are chunked (sorted), their rows (in the split's dates
    for Parquet, every row for a CSV), and the first date of the whole table."""

    groups: List
    rows: np.ndarray  # (G,) rows per group
    origin: Optional[pd.Timestamp]

    @property
    def n_rows(self) -> int:
        return int(self.rows.sum())

    def chunks(self, groups_per_chunk: int) -> List[GroupChunk]:
        """The groups in consecutive chunks of ``groups_per_chunk``."""
        step = max(1, groups_per_chunk)
        return [GroupChunk(self.groups[i:i + step], self.origin) for i in range(0, len(self.groups), step)]


def keep_groups(block: pd.DataFrame, group: str, chunk: Optional[GroupChunk]) -> pd.DataFrame:
    """The rows of ``block`` whose group is one of ``chunk``'s (every row without a chunk)."""
    return block if chunk is None else block[block[group].isin(chunk.groups).to_numpy()]


def group_filter(group: str, chunk: Optional[GroupChunk]):
    """pyarrow's filter keeping ``chunk``'s groups (None: every row)."""
    import pyarrow.dataset as ds

    return None if chunk is None else ds.field(group).isin(list(chunk.groups))
