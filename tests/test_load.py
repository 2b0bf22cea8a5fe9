"""Reading the table: only the columns the run uses, in blocks of data.read_chunk_rows rows, with
the same result whatever the block size. Real files in tmp_path, real pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tamrun.config.schema import DataConfig, DataSource, DerivedColumn
from tamrun.data.derive import derived_sources
from tamrun.data.table import load_table
from tamrun.errors import DataError

from conftest import synthetic_frame


@pytest.fixture
def wide_csv(tmp_path):
    """The synthetic table with two columns no run below uses."""
    frame = synthetic_frame(days=30)
    frame["unused_a"] = np.arange(len(frame), dtype=float)
    frame["unused_b"] = "text"
    path = tmp_path / "wide.csv"
    frame.to_csv(path, index=False)
    return path, frame


def data_config(path, **fields) -> DataConfig:
    return DataConfig(name="csv", source=DataSource.file, path=str(path), target="y", group="g", **fields)


@pytest.mark.parametrize("block", [1, 7, 100, 65536])
def test_the_table_is_the_same_whatever_the_read_block(wide_csv, block):
    path, frame = wide_csv
    whole = load_table(data_config(path, read_chunk_rows=10**9))
    blocked = load_table(data_config(path, read_chunk_rows=block))
    pd.testing.assert_frame_equal(blocked, whole)
    assert len(blocked) == len(frame) and blocked["date"].dtype.kind == "M"


def test_only_the_required_and_mentioned_columns_are_read(wide_csv):
    path, _ = wide_csv
    derived = {"x2": DerivedColumn(kind="expr", expr="x * 2 + nothing_here"),
               "weekend": DerivedColumn(kind="isin", column="dow", values=[5.0, 6.0])}
    required, mentioned = derived_sources(derived)
    assert required == {"data.derived.weekend.column": "dow"} and {"x", "nothing_here"} <= mentioned
    table = load_table(data_config(path), {"data.target": "y", "data.group": "g", **required}, mentioned)
    assert list(table.columns) == ["date", "x", "dow", "g", "y"]  # in file order; unused_a/b never read


def test_a_missing_required_column_names_every_column_of_the_file(wide_csv):
    path, _ = wide_csv
    with pytest.raises(DataError, match=r"model.effects.t.column='temp': no such column in the data\. "
                                        r"Fix: use one of: date, x, dow, g, y, unused_a, unused_b"):
        load_table(data_config(path), {"model.effects.t.column": "temp"})


def test_the_room_check_runs_before_every_block_and_can_stop_the_read(wide_csv):
    """The memory check (`HostRoomWatch` in a run) is called before each block, with the bytes of the
    block before it, and before the join; when it refuses, the read stops there with its error (here a
    DataError raised on purpose by the test's check)."""
    path, frame = wide_csv
    seen = []

    def room(what: str, step: str = "", nbytes: int = 0) -> None:
        seen.append((what, step, nbytes))
        if len(seen) == 3:
            raise DataError("data.path", str(path), "stopped by the test's room check", "none")

    with pytest.raises(DataError, match="stopped by the test's room check"):
        load_table(data_config(path, read_chunk_rows=100), {"data.target": "y"}, room=room)
    assert [what for what, _, _ in seen] == ["parsing the data (rows 1-100)", "parsing the data (rows 101-200)",
                                             "parsing the data (rows 201-300)"]
    # the first block is unknown; then the last block's bytes: 100 rows x (date, y) x 8 bytes
    assert [(step, nbytes) for _, step, nbytes in seen] == [("read", 0), ("read", 100 * 2 * 8), ("read", 100 * 2 * 8)]
    blocks = []
    load_table(data_config(path, read_chunk_rows=100), {"data.target": "y"},
               room=lambda what, step="", nbytes=0: blocks.append((what, step, nbytes)))
    n_blocks = -(-len(frame) // 100)
    assert len(blocks) == n_blocks + 2  # one per block, one that finds the end, the join
    assert blocks[-1] == ("joining and sorting the data", "join", len(frame) * 2 * 8)
