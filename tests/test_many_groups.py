"""Many small groups: a retailer's SKUs, a spline of k=10 (14 coefficients) on 2 training rows each.

- A real run (``data=csv``, a group column, a real sqlite store) of 3,000 such groups: the dual route
  fits them in one chunk (the recorded plan and metric ``chunk_groups`` say so), each group's
  coefficients equal a float64 dense primal solve of that group alone (relative 1e-7), the logged
  ``fit/coefficients.csv`` holds them exactly, and the per-group figures are one table artifact
  (``predictions/group_metrics.csv``), never one MLflow metric per group.
- `group_metrics` (array reductions) against the per-group `rmse` and `mape` of every part, NaN and
  all-zero targets included; `write_frame` writes numeric tables by pyarrow with pandas' values.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.config.load import typed_config
from tamrun.fit.evaluate import group_metrics, mape, rmse
from tamrun.pipeline import build_features, load_splits
from tamrun.runner import run
from tamrun.tracking.artifacts.tables import arrow_writable, write_frame

from test_dispatcher import max_rel, reference_coefficients

GROUPS = 3000
TOLERANCE = 1e-7  # relative, per group: the batched dual form against the primal float64 solve


def small_groups_frame(groups: int, seed: int = 0) -> pd.DataFrame:
    """``groups`` sites of 4 daily rows: 2 training rows (2024-01-01, 02) at x = 0 and 10, 2 test rows
    (2024-02-01, 02) with x uniform in between; y = 20 + sin(x) + N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, (groups, 4))
    x[:, 0], x[:, 1] = 0.0, 10.0
    dates = np.tile(np.array(["2024-01-01", "2024-01-02", "2024-02-01", "2024-02-02"]), groups)
    y = 20 + np.sin(x) + rng.normal(0, 0.1, x.shape)
    return pd.DataFrame({"date": dates, "site": np.repeat(np.arange(groups), 4), "x": x.reshape(-1),
                         "y": y.reshape(-1)})


def small_groups_overrides(path) -> list:
    """A spline of k=10 per site on the CSV at ``path`` (train January, test February)."""
    return ["data=csv", f"data.path={path}", "data.target=y", "data.group=site", "model=custom",
            "+model.effects.x={kind: spline, column: x, k: 10, ap: 0}", "split.train_end=2024-01-31",
            "split.test_start=2024-02-01", "split.test_end=null", "tracking.log_plots=false",
            "tracking.log_model=false", "progress=off"]


@pytest.fixture(scope="module")
def many_groups_run(tmp_path_factory):
    """One recorded run of `GROUPS` small groups, its config and its store."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tamrun.config.load import config_dir
    from tamrun.config.store import register_configs

    folder = tmp_path_factory.mktemp("many_groups")
    csv = folder / "sites.csv"
    small_groups_frame(GROUPS).to_csv(csv, index=False)
    store = f"sqlite:///{folder / 'mlflow.db'}"
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"tracking.uri={store}", *small_groups_overrides(csv)])
    GlobalHydra.instance().clear()
    return run(cfg), cfg, store, folder


def test_many_small_groups_fit_in_one_chunk_and_match_the_dense_reference(many_groups_run):
    result, cfg, store, folder = many_groups_run
    assert result.plan.route == "direct" and result.plan.dual
    assert result.plan.fit.groups == GROUPS and result.stats.group_chunk == GROUPS  # one batch, not one by one
    client = MlflowClient(tracking_uri=store)
    recorded = client.get_run(result.run_id)
    assert recorded.info.status == "FINISHED" and recorded.data.metrics["system/memory/chunk_groups"] == GROUPS
    report = json.loads(open(client.download_artifacts(result.run_id, "memory/report.json", str(folder))).read())
    assert report["plan"]["dual"] and report["plan"]["fit"]["groups"] == GROUPS  # the recorded plan
    config, specs = typed_config(cfg)
    splits = load_splits(config, specs)
    features = build_features(config, specs, splits.train)
    assert list(features.train.groups) == list(result.groups)
    reference = reference_coefficients(features.train, features.design)
    assert max_rel(result.coef.numpy(), reference) <= TOLERANCE
    logged = pd.read_csv(client.download_artifacts(result.run_id, "fit/coefficients.csv", str(folder)),
                         float_precision="round_trip")  # pandas' default parser may round a 17-digit text off
    assert logged["group"].tolist() == list(result.groups)
    np.testing.assert_array_equal(logged.drop(columns="group").to_numpy(), result.coef.numpy())  # exact round trip


def test_per_group_figures_are_one_table_not_a_metric_per_group(many_groups_run):
    result, _, store, folder = many_groups_run
    client = MlflowClient(tracking_uri=store)
    metrics = client.get_run(result.run_id).data.metrics
    assert len(metrics) < 100 and not any(str(GROUPS - 1) in name for name in metrics)
    table = pd.read_csv(client.download_artifacts(result.run_id, "predictions/group_metrics.csv", str(folder)))
    assert len(table) == 2 * GROUPS and set(table["split"]) == {"train", "test"}
    test_rows = result.predictions[result.predictions["split"] == "test"]
    last = test_rows[test_rows["group"] == GROUPS - 1]
    row = table[(table["split"] == "test") & (table["group"] == GROUPS - 1)].iloc[0]
    assert row["n"] == 2 and row["rmse"] == pytest.approx(rmse(last["actual"].to_numpy(), last["predicted"].to_numpy()),
                                                          rel=1e-12)


def test_group_metrics_equal_the_per_group_formulas():
    rng = np.random.default_rng(1)
    rows = 4000
    table = pd.DataFrame({"split": rng.choice(["test", "train"], rows), "group": rng.integers(0, 250, rows),
                          "actual": rng.normal(size=rows), "predicted": rng.normal(size=rows)})
    table.loc[table["group"] == 5, "actual"] = 0.0  # MAPE undefined there
    table.loc[table["group"] == 7, "predicted"] = table.loc[table["group"] == 7, "actual"]  # RMSE 0
    table.loc[3, "predicted"] = np.nan  # a NaN spreads to its part's RMSE, as `rmse` gives
    expected = pd.DataFrame([{"split": split, "group": group, "n": len(part),
                              "rmse": rmse(part["actual"].to_numpy(), part["predicted"].to_numpy()),
                              "mape": mape(part["actual"].to_numpy(), part["predicted"].to_numpy())}
                             for (split, group), part in table.groupby(["split", "group"], sort=True)])
    pd.testing.assert_frame_equal(group_metrics(table), expected, check_exact=False, rtol=1e-12)
    assert group_metrics(table.iloc[:0]).empty


def test_numeric_tables_are_written_by_pyarrow_with_the_values_pandas_writes(tmp_path):
    rng = np.random.default_rng(2)
    frame = pd.DataFrame(rng.normal(size=(50, 3)) * 10.0 ** rng.integers(-300, 300, (50, 3)), columns=["a", "b[0]", "c"])
    frame.insert(0, "group", [f"site {i}, north" for i in range(50)])
    frame.loc[4, "a"] = np.nan
    assert arrow_writable(frame)
    write_frame(frame, tmp_path / "t.csv")
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    exact = {"float_precision": "round_trip"}  # pandas' default parser may round a 17-digit text off
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "t.csv", **exact), pd.read_csv(tmp_path / "pandas.csv", **exact),
                                  check_exact=True)
    dated = pd.DataFrame({"date": pd.date_range("2024-01-01", periods=3), "flag": [True, False, True]})
    assert not arrow_writable(dated)  # dates and booleans keep pandas' formatting
    write_frame(dated, tmp_path / "d.csv")
    assert (tmp_path / "d.csv").read_text() == dated.to_csv(index=False)
