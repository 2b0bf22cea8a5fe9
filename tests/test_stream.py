"""A table larger than memory streamed in chunks of groups (tamrun/jobs/stream.py): the same predictions and
metrics as the run that reads it whole (relative 1e-9), only each chunk's groups read from Parquet, what
needs every group at once refused by name, and a real memory cgroup below the whole run's peak that the
streamed run finishes in with the uncapped run's numbers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from tamrun.bench.stream import STREAM_ARGS, split_args, write_hourly
from tamrun.config.schema import DataConfig, DataSource
from tamrun.data.chunks import GroupChunk
from tamrun.data.table import Table, read_table
from tamrun.data.parquet import DateWindow
from tamrun.errors import ConfigError, NumericalError
from tamrun.runner import run
from test_limits import cgroup_writable, tamrun_under

GROUPS, HOURS = 12, 24 * 30
RELATIVE = 1e-9
STREAMED = ("memory.limit=1MiB", "memory.data_in_limit=true")  # the table needs ~4.4 MiB at once: 1 site a chunk


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict:
    """The bench's hourly table (GROUPS sites x HOURS hours) as Parquet and as CSV."""
    folder = tmp_path_factory.mktemp("stream")
    parquet = write_hourly(folder / "hourly.parquet", GROUPS, HOURS)
    csv = folder / "hourly.csv"
    pd.read_parquet(parquet).to_csv(csv, index=False)
    return {"parquet": parquet, "csv": csv}


def overrides(path: Path) -> list:
    """On the CPU: what streams is the host's table, under a 1 MiB limit no GPU's allocator could plan in."""
    return [f"data.path={path}", *STREAM_ARGS, *split_args(HOURS), "hw=cpu"]


def logged_predictions(run_id: str, store: str) -> pd.DataFrame:
    """A run's predictions artifact, sorted by split, date and group."""
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/predictions.parquet",
                                               tracking_uri=store)  # not set for the process: later tests have their own
    return pd.read_parquet(path).sort_values(["split", "date", "group"]).reset_index(drop=True)


def assert_close(left: float, right: float) -> None:
    assert abs(left - right) <= RELATIVE * max(abs(left), abs(right)), (left, right)


@pytest.mark.parametrize("form", ["parquet", "csv"])
def test_a_streamed_run_equals_the_run_that_reads_the_table_whole(compose_cfg, store_uri, tables, form):
    """memory.limit=1MiB with memory.data_in_limit=true streams the table in chunks of groups: each split's
    RMSE and MAPE, the interval metrics, every prediction and interval bound and every coefficient equal
    the whole run's to 1e-9 relative; the run records how it streamed."""
    whole = run(compose_cfg(*overrides(tables[form])))
    streamed = run(compose_cfg(*overrides(tables[form]), *STREAMED))
    assert "stream_chunks" not in whole.metrics and streamed.metrics["stream_chunks"] > 2
    assert streamed.groups == whole.groups and streamed.coef.shape == whole.coef.shape
    assert np.allclose(streamed.coef.numpy(), whole.coef.numpy(), rtol=RELATIVE, atol=1e-12)
    names = [name for name in whole.metrics if re.match(r"(rmse|mape|coverage|width|pinball)_", name)]
    assert {"rmse_train", "rmse_test", "mape_test", "coverage_80_test", "pinball_test"} <= set(names)
    for name in names:
        assert_close(streamed.metrics[name], whole.metrics[name])
    left, right = logged_predictions(whole.run_id, store_uri), logged_predictions(streamed.run_id, store_uri)
    assert list(left.columns) == list(right.columns) and len(left) == len(right) == GROUPS * HOURS
    assert (left[["split", "date", "group"]] == right[["split", "date", "group"]]).all().all()
    for column in left.columns.drop(["split", "date", "group"]):
        assert np.allclose(right[column], left[column], rtol=RELATIVE, atol=0), column
    record = mlflow.MlflowClient(store_uri).get_run(streamed.run_id).data
    assert record.params["stream_chunks"] == str(int(streamed.metrics["stream_chunks"]))
    assert record.tags["data_streamed"].startswith(f"data: streamed in {record.params['stream_chunks']} chunks of ")


def test_the_parquet_reader_reads_only_the_chunks_groups(tables):
    """A chunk's read pushes its groups down beside the split's dates: only their rows are read, and the
    scan reads the group and date columns of every group."""
    cfg = DataConfig(name="hourly", source=DataSource.file, path=str(tables["parquet"]), target="y", group="site")
    window = DateWindow(((None, pd.Timestamp("2020-01-20")),))
    scan = Table.open(cfg).scan(window)
    assert scan.groups == list(range(GROUPS)) and (scan.rows == 20 * 24).all()
    assert scan.origin == pd.Timestamp("2020-01-01")
    chunk = GroupChunk([3, 7], scan.origin)
    loaded = read_table(cfg, {"data.target": "y", "data.group": "site"}, window=window, chunk=chunk)
    assert loaded.parquet.groups_pushed_down and loaded.parquet.pushed_down
    assert loaded.parquet.rows == 2 * 20 * 24 and sorted(loaded.frame["site"].unique()) == [3, 7]
    assert loaded.parquet.columns == ["date", "site", "y"] and loaded.origin == scan.origin


@pytest.mark.parametrize("setting,field", [("model.penalties=gcv", "model.penalties"),
                                           ("mode=adaptive", "mode"),
                                           ("intervals.min_group_rows=100000", "intervals.min_group_rows")])
def test_what_needs_every_group_at_once_is_refused_when_the_table_streams(compose_cfg, tables, setting, field):
    """GCV's pooled score, another mode, and intervals that would pool the groups' residuals: one error
    naming the setting and the fix, before anything is fitted."""
    with pytest.raises(ConfigError) as raised:
        run(compose_cfg(*overrides(tables["parquet"]), *STREAMED, setting))
    assert raised.value.field == field and "streamed in chunks of groups" in str(raised.value)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or not cgroup_writable(), reason="needs a writable cgroup v1 memory controller")
def test_a_run_in_a_cgroup_below_its_whole_peak_streams_and_finishes_with_the_uncapped_numbers(tmp_path):
    """160 sites x 5,000 hours (800,000 rows) in a real memory cgroup at 3/4 of the uncapped run's peak (no
    memory.limit): the run streams, FINISHES within the cgroup and logs the uncapped run's RMSE and MAPE."""
    groups, hours = 160, 5000
    path = write_hourly(tmp_path / "big.parquet", groups, hours)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = (f"data.path={path}", *STREAM_ARGS, *split_args(hours), f"tracking.uri={store}")
    code, output, peak = tamrun_under(8 * 2**30, *args, cwd=tmp_path)
    assert code == 0 and "streamed in" not in output, output[-3000:]
    limit = int(0.75 * peak)
    capped, text, used = tamrun_under(limit, *args, cwd=tmp_path)
    assert capped == 0, text[-3000:]
    assert "data: streamed in" in text and used <= limit
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("tamrun")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    for name in ("rmse_train", "rmse_test", "mape_test"):
        assert_close(runs[1].data.metrics[name], runs[0].data.metrics[name])


def test_a_group_withheld_by_a_streamed_run_is_counted_and_left_out_as_by_the_whole_run(
        compose_cfg, store_uri, tables, tmp_path):
    """One site's test x (the first chunk's: nothing of that chunk is written) far outside the training range
    (the spline continues linearly there: forecasts in the thousands), 1 of 12 sites
    (evaluate.max_unsupported_share=0.1 lets it through): the streamed run (one site a chunk) withholds it as
    the whole run does: the same groups_unsupported, the same table of it, the same metrics over the other
    sites, the same rows counted. Under the default share (0.01) the streamed run fails as the whole run does:
    the share is counted over every chunk, not per chunk (where it is 1 of 1)."""
    frame = pd.read_parquet(tables["parquet"])
    test_start = pd.Timestamp(split_args(HOURS)[1].split("=", 1)[1])
    frame.loc[(frame["site"] == 0) & (frame["date"] >= test_start), "x"] = 1e4
    path = tmp_path / "far.parquet"
    frame.to_parquet(path, index=False)
    whole = run(compose_cfg(*overrides(path), "evaluate.max_unsupported_share=0.1"))
    streamed = run(compose_cfg(*overrides(path), *STREAMED, "evaluate.max_unsupported_share=0.1"))
    assert streamed.metrics["stream_chunks"] > 2
    for name in ("groups_unsupported", "n_train_rows", "n_test_rows"):
        assert streamed.metrics[name] == whole.metrics[name], name
    assert whole.metrics["groups_unsupported"] == 1 and whole.metrics["n_test_rows"] == (frame["date"] >= test_start).sum()
    names = [name for name in whole.metrics if re.match(r"(rmse|mape|coverage|width|pinball)_", name)]
    for name in names:
        assert_close(streamed.metrics[name], whole.metrics[name])
    why = [pd.read_csv(mlflow.artifacts.download_artifacts(run_id=result.run_id, tracking_uri=store_uri,
                                                           artifact_path="predictions/groups_unsupported.csv"))
           for result in (whole, streamed)]
    key = ["group", "split", "reason", "training_rows", "coefficients"]  # the spreads: each chunk's own support
    assert why[0][key].values.tolist() == why[1][key].values.tolist() and why[0]["group"].tolist() == [0]
    left, right = logged_predictions(whole.run_id, store_uri), logged_predictions(streamed.run_id, store_uri)
    assert 0 not in set(left["group"]) and len(left) == len(right) == (GROUPS - 1) * HOURS
    with pytest.raises(NumericalError, match=r"data.group=\[0\]: the test forecasts of 1 group\(s\) .*; 1 of 12 group\(s\) "
                                             r"\(8.33%\) are more than evaluate.max_unsupported_share=0.01 "):
        run(compose_cfg(*overrides(path), *STREAMED))
