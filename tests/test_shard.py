"""Groups sharded over a Ray cluster (shard.over=ray, tamrun/jobs/shard.py): on a real two-node local
cluster (tests/local_cluster.py), each chunk of groups a task, gathered into one MLflow run whose
metrics, predictions and coefficients equal the one-machine run's (relative 1e-9); what cannot be
fitted in chunks of groups is refused by name before any cluster is joined."""

from __future__ import annotations

import re

import mlflow
import numpy as np
import pandas as pd
import pytest

from local_cluster import ray_cluster
from tamrun.errors import ConfigError, DataError
from tamrun.runner import run
from tamrun.bench.stream import write_hourly
from test_stream import GROUPS, HOURS, RELATIVE, assert_close, logged_predictions, overrides

GROUPS_PER_TASK = 3  # 12 groups: 4 tasks over the cluster's 2 CPUs


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """The streaming tests' hourly table (GROUPS sites x HOURS hours) as Parquet."""
    return write_hourly(tmp_path_factory.mktemp("shard") / "hourly.parquet", GROUPS, HOURS)


def test_groups_sharded_over_a_two_node_ray_cluster_equal_one_machine(compose_cfg, store_uri, table, tmp_path):
    """Four tasks of 3 groups spread over the two nodes: the one-machine run's numbers; then a table with a
    NaN in one group: the task's data error raised as itself, naming the column, the run FAILED."""
    import ray

    whole = run(compose_cfg(*overrides(table)))
    bad = tmp_path / "bad.parquet"
    frame = pd.read_parquet(table)
    frame.loc[frame.index[len(frame) // 2], "x"] = np.nan
    frame.to_parquet(bad)
    with ray_cluster() as cluster:
        sharding = ("shard.over=ray", f"shard.address={cluster['address']}", f"shard.groups_per_task={GROUPS_PER_TASK}")
        try:
            sharded = run(compose_cfg(*overrides(table), *sharding))
            with pytest.raises(DataError, match="'x'") as refused:
                run(compose_cfg(*overrides(bad), *sharding))
        finally:
            ray.shutdown()
    assert mlflow.MlflowClient(store_uri).get_run(refused.value.run_id).info.status == "FAILED"
    assert sharded.metrics["stream_chunks"] == GROUPS // GROUPS_PER_TASK
    assert sharded.metrics["shard_nodes"] == 2  # the tasks were spread over both nodes
    assert sharded.groups == whole.groups and sharded.coef.shape == whole.coef.shape
    assert np.allclose(sharded.coef.numpy(), whole.coef.numpy(), rtol=RELATIVE, atol=1e-12)
    names = [name for name in whole.metrics if re.match(r"(rmse|mape|coverage|width|pinball)_", name)]
    assert {"rmse_train", "rmse_test", "mape_test", "coverage_80_test"} <= set(names)
    for name in names:
        assert_close(sharded.metrics[name], whole.metrics[name])
    left, right = logged_predictions(whole.run_id, store_uri), logged_predictions(sharded.run_id, store_uri)
    assert len(left) == len(right) == GROUPS * HOURS
    assert (left[["split", "date", "group"]] == right[["split", "date", "group"]]).all().all()
    for column in left.columns.drop(["split", "date", "group"]):
        assert np.allclose(right[column], left[column], rtol=RELATIVE, atol=0), column
    record = mlflow.MlflowClient(store_uri).get_run(sharded.run_id)
    assert record.info.status == "FINISHED"
    assert record.data.tags["shard"] == f"ray: {GROUPS // GROUPS_PER_TASK} tasks of up to {GROUPS_PER_TASK} groups"
    assert record.data.params["shard.over"] == "ray"


@pytest.mark.parametrize("setting,field", [("model.penalties=gcv", "model.penalties"),
                                           ("data.group=null", "data.group"),
                                           ("mode=adaptive", "mode")])
def test_what_needs_every_group_at_once_is_refused_before_joining_a_cluster(compose_cfg, table, setting, field):
    import ray

    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}=.*shard.over=ray fits chunks of groups"):
        run(compose_cfg(*overrides(table), "shard.over=ray", "shard.address=127.0.0.1:1", setting))
    assert not ray.is_initialized()
