"""Parquet as data.path (a file or a hive-partitioned folder): only the columns the run reads, only the
rows of the split's dates (the filter pushed down to pyarrow), checked by what the loader reports it read
(`tamrun.data.parquet.ParquetRead`: the pyarrow table's columns and rows); a whole run on Parquet gives
the CSV run's numbers. Real files in tmp_path, real Hydra composition, a real sqlite store."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from tamrun.config.load import config_dir
from tamrun.config.schema import DataConfig, DataSource, SplitConfig
from tamrun.config.store import register_configs
from tamrun.data.table import read_table
from tamrun.data.parquet import DateWindow
from tamrun.errors import DataError
from tamrun.runner import run

from conftest import csv_overrides, synthetic_frame

# Training February to December 2020, test 1 to 20 January 2021: the data (2020-01-01 to 2021-02-04) has
# rows before and after the split's dates.
SPLIT = SplitConfig(train_start="2020-02-01", train_end="2020-12-31", test_start="2021-01-01", test_end="2021-01-20")
USED = ["date", "x", "dow", "g", "y"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The synthetic frame with two columns no run reads, as CSV, a Parquet file, a Parquet file whose
    dates are text, and a Parquet folder partitioned by group."""
    folder = tmp_path_factory.mktemp("parquet")
    frame = synthetic_frame()
    frame["unused_text"] = "a comment no effect reads"
    frame["unused_number"] = np.arange(len(frame), dtype=np.float64)
    frame.to_csv(folder / "data.csv", index=False)
    frame.to_parquet(folder / "data.parquet", index=False, row_group_size=24 * 30)
    frame.assign(date=frame["date"].dt.strftime("%Y-%m-%d %H:%M:%S")).to_parquet(folder / "text_dates.parquet",
                                                                                 index=False)
    frame.to_parquet(folder / "by_group", partition_cols=["g"], index=False)
    return frame, folder


def in_split(frame: pd.DataFrame) -> int:
    """Rows of ``frame`` inside SPLIT's two periods."""
    day = frame["date"].dt.normalize()
    return int(((day >= "2020-02-01") & (day <= "2020-12-31")).sum() + ((day >= "2021-01-01") & (day <= "2021-01-20")).sum())


def data_config(path) -> DataConfig:
    return DataConfig(name="csv", source=DataSource.file, path=str(path), target="y", group="g")


def required() -> dict:
    return {"data.target": "y", "data.group": "g", "model.effects.sx.column": "x", "model.effects.dow.column": "dow"}


@pytest.mark.parametrize("name", ["data.parquet", "by_group"])
def test_only_the_used_columns_and_the_splits_rows_are_read(tables, name):
    frame, folder = tables
    loaded = read_table(data_config(folder / name), required(), window=DateWindow.of(SPLIT))
    read = loaded.parquet
    assert read.pushed_down and sorted(read.columns) == sorted(USED)  # the unused columns never read
    assert read.rows == in_split(frame) < len(frame)  # only the split's rows
    assert sorted(loaded.frame.columns) == sorted(USED) and len(loaded.frame) == read.rows
    assert loaded.origin == frame["date"].min()  # a time_index counts from the data's first date
    expected = frame[USED].astype({"g": np.int64}).set_index(["date", "g"]).sort_index()
    got = loaded.frame[USED].astype({"g": np.int64}).set_index(["date", "g"]).sort_index()
    pd.testing.assert_frame_equal(got, expected.loc[got.index], check_dtype=False)


def test_text_dates_are_read_whole_and_parsed_as_a_csvs(tables):
    frame, folder = tables
    loaded = read_table(data_config(folder / "text_dates.parquet"), required(), window=DateWindow.of(SPLIT))
    assert not loaded.parquet.pushed_down and loaded.parquet.rows == len(frame)
    assert sorted(loaded.parquet.columns) == sorted(USED)
    pd.testing.assert_series_equal(loaded.frame["date"], frame["date"], check_names=False, check_dtype=False)


def test_a_missing_column_and_a_corrupt_file_are_named(tables, tmp_path):
    _, folder = tables
    with pytest.raises(DataError) as missing:
        read_table(data_config(folder / "data.parquet"), {**required(), "data.target": "load"})
    assert missing.value.field == "data.target" and "unused_text" in missing.value.fix
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1" + b"\x00" * 64)
    with pytest.raises(DataError) as corrupt:
        read_table(data_config(broken), required())
    assert corrupt.value.field == "data.path" and "Parquet" in corrupt.value.problem


def composed(store: str, path, extra=()) -> object:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"tracking.uri={store}", *csv_overrides(path), *extra])
    GlobalHydra.instance().clear()
    return cfg


def test_a_parquet_run_gives_the_csv_runs_numbers(tables, tmp_path):
    _, folder = tables
    extra = ["split.train_start=2020-02-01", "split.test_end=2021-01-20", "tracking=none", "progress=off", "+data.derived.t={kind: time_index, unit: D}",
             "+model.effects.trend={kind: linear, column: t, ap: -6}"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    from_csv = run(composed(store, folder / "data.csv", extra))
    from_parquet = run(composed(store, folder / "by_group", extra))
    assert from_parquet.groups == from_csv.groups
    np.testing.assert_allclose(from_parquet.coef.numpy(), from_csv.coef.numpy(), rtol=1e-12, atol=1e-12)
    for name in ("rmse_train", "rmse_test", "mape_test"):
        assert from_parquet.metrics[name] == pytest.approx(from_csv.metrics[name], rel=1e-12)
    assert from_parquet.metrics["n_train_rows"] == from_csv.metrics["n_train_rows"]
