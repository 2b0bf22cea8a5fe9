"""The data stage (tamrun/data/table.py): a run opens its table once and every later step (the memory plan,
the read, a streamed chunk, the shards' reopening, the record) reuses it. Counted with Python's own audit
events ("open", PEP 578): every file Python or pandas opens raises one, whoever opens it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Iterator, List

import pandas as pd

from tamrun.bench.stream import STREAM_ARGS, split_args, write_hourly
from tamrun.config.schema import DataConfig, DataSource
from tamrun.data.table import Table, TableRef
from tamrun.runner import run
from conftest import csv_overrides

QUICK = ("tracking.log_plots=false", "tracking.log_model=false")
STREAMED = ("memory.limit=1MiB", "memory.data_in_limit=true")  # tests/test_stream.py: one site a chunk
GROUPS, HOURS = 6, 24 * 20
# A CSV run's opens of its file: its kind (`is_parquet` reads 4 bytes), its compression (`sniff`), its header,
# and its rows; before the data stage a run opened it 9 times (the stream plan and the read each found the
# kind, sniffed and read the header again, and the read sniffed once more).
OPENS_WHOLE = 4


class OpenCounter:
    """Counts the "open" audit events of one path while `watching` (audit hooks cannot be removed: the hook
    stays and does nothing outside a `watching` block)."""

    def __init__(self) -> None:
        self.path: str = ""
        self.opens: List[str] = []
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple) -> None:
        if self.path and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            if os.fsdecode(args[0]) == self.path:
                self.opens.append(str(args[1]))

    @contextlib.contextmanager
    def watching(self, path: Path) -> Iterator[List[str]]:
        self.path, self.opens = str(path), []
        try:
            yield self.opens
        finally:
            self.path = ""


COUNTER = OpenCounter()


def test_a_run_opens_its_csv_once_for_kind_compression_header_and_rows(compose_cfg, csv_path):
    """A grouped CSV run that fits in memory: the stream plan and the read share the job's `Table`, so the
    file is opened `OPENS_WHOLE` times in all (each for reading), recording included."""
    with COUNTER.watching(csv_path) as opens:
        result = run(compose_cfg(*csv_overrides(csv_path), *QUICK))
    assert result.metrics["rmse_test"] > 0
    assert len(opens) == OPENS_WHOLE and all("w" not in mode and "a" not in mode for mode in opens), opens


def test_a_streamed_run_scans_once_and_reads_each_chunk_once(compose_cfg, tmp_path):
    """A streamed CSV run (one site a chunk): the whole run's opens, one scan of the group and date columns,
    one read per chunk; never the kind, compression or header again."""
    csv = tmp_path / "hourly.csv"
    pd.read_parquet(write_hourly(tmp_path / "hourly.parquet", GROUPS, HOURS)).to_csv(csv, index=False)
    with COUNTER.watching(csv) as opens:
        streamed = run(compose_cfg(f"data.path={csv}", *STREAM_ARGS, *split_args(HOURS), "hw=cpu", *STREAMED,
                                   *QUICK))
    chunks = int(streamed.metrics["stream_chunks"])
    assert chunks == GROUPS
    assert len(opens) == OPENS_WHOLE - 1 + 1 + chunks, opens  # kind, compression, header; the scan; each chunk


def test_a_reopened_table_reads_what_the_opened_one_reads_without_opening_the_file(tmp_path):
    """`Table.ref` is plain data (a Ray task's argument); `Table.reopen` from it opens nothing until it
    reads, and reads the same frame; a scan is done once per window."""
    csv = tmp_path / "hourly.csv"
    pd.read_parquet(write_hourly(tmp_path / "hourly.parquet", 3, 48)).to_csv(csv, index=False)
    cfg = DataConfig(name="hourly", source=DataSource.file, path=str(csv), target="y", group="site")
    table = Table.open(cfg)
    ref = table.ref()
    assert dataclasses.asdict(ref) == {"path": str(csv.resolve()), "parquet": False, "compression": None,
                                       "columns": tuple(pd.read_csv(csv, nrows=0).columns)}
    with COUNTER.watching(csv) as opens:
        again = Table.reopen(cfg, TableRef(**dataclasses.asdict(ref)))
        assert opens == []
        pd.testing.assert_frame_equal(again.read().frame, table.read().frame)
    assert len(opens) == 2  # one read each
    first = table.scan()
    assert table.scan() is first and first.groups == [0, 1, 2] and first.rows.tolist() == [48, 48, 48]
