"""Results and metrics that mean something (issue 44; docs/reliability.md).

- 200 groups of 2 training rows with a spline of k=10 (14 coefficients), target near 20: the forecasts
  reach thousands; most groups (148) are unsupported, more than evaluate.max_unsupported_share allows,
  so the run ends FAILED (exit 2) with a numerical error naming the groups, the cause (fewer training rows
  than coefficients) and the fix, never FINISHED as if fine; the same data grouped more coarsely (the fix)
  ends FINISHED;
- one bad group does not sink the run (issue 58): 200 groups of 60 days, one with its test x far outside its
  training range: FINISHED, the group named in the log, withheld from the predictions and the metrics
  (rmse_test equals the float64 RMSE of the logged predictions and the run without that group) and from
  the logged model's input example, counted in groups_unsupported and described in
  predictions/groups_unsupported.csv; three such groups (1.5%, over the default 1%) or a run of one group:
  FAILED naming the setting and the fix; only finite far forecasts are withheld; a share of 1 is refused;
- a target that is 0 (all of it, or all of the test period): MAPE is undefined there, logged as NaN with
  a warning, and the valid fit ends FINISHED (its RMSE finite).
Real CSV files, real commands, a real sqlite store.
"""

from __future__ import annotations

import math
import re

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides, synthetic_frame
from test_secrets import tamrun

QUICK = ["tracking.log_plots=false", "tracking.log_model=false", "progress=off"]
SPLIT = ["split.train_end=2024-01-31", "split.test_start=2024-02-01", "split.test_end=null"]


def small_groups_csv(path, groups: int = 200) -> None:
    """``groups`` groups of 2 training rows (January 2024) and 5 test rows (February), y = 20 + sin(x) + noise."""
    rng = np.random.default_rng(0)
    dates = [f"2024-01-0{d}" for d in (1, 2)] + [f"2024-02-0{d}" for d in range(1, 6)]
    frame = pd.DataFrame([(date, g, rng.uniform(0, 10)) for g in range(groups) for date in dates],
                         columns=["date", "g", "x"])
    frame["y"] = 20 + np.sin(frame.x) + rng.normal(0, 0.1, len(frame))
    frame.to_csv(path, index=False)


def only_run(store: str):
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


def test_forecasts_far_outside_the_training_data_fail_naming_groups_cause_and_fix(tmp_path):
    data = tmp_path / "small.csv"
    small_groups_csv(data)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    model = ["data=csv", f"data.path={data}", "data.target=y", "model=custom",
             "+model.effects.x={kind: spline, column: x, k: 10}", *SPLIT, *QUICK]
    done = tamrun([*model, "data.group=g", f"tracking.uri={store}"], tmp_path / "cwd", {})
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("tamrun:")]
    assert line.startswith("tamrun: numerical error: data.group=[")
    assert "the test forecasts of" in line and "not supported by the training data" in line
    assert "fewer training rows (as few as 2) than the model's 14 coefficients" in line
    share = re.search(r"; (\d+) of 200 group\(s\) \([\d.]+%\) are more than evaluate.max_unsupported_share=0.01 ", line)
    assert share and int(share.group(1)) > 100  # most groups (148): withholding them would leave no forecast to speak of
    assert "Fix: raise the penalties" in line and "give those groups more training rows" in line
    assert only_run(store).info.status == "FAILED"
    coarser = f"sqlite:///{tmp_path / 'coarser.db'}"
    done = tamrun([*model, "data.group=null", "data.duplicate_dates=warn", f"tracking.uri={coarser}"], tmp_path / "cwd",
                  {})
    assert done.returncode == 0, done.stderr[-3000:]
    assert only_run(coarser).data.metrics["rmse_test"] < 1.0


@pytest.mark.parametrize("zero", ["everywhere", "test period"])
def test_a_zero_target_leaves_mape_undefined_and_the_fit_finished(tmp_path, zero):
    frame = synthetic_frame(days=60)
    frame["y"] = 0.0 if zero == "everywhere" else np.where(frame.date >= "2020-02-16", 0.0, frame.y)
    data = tmp_path / "zero.csv"
    frame.to_csv(data, index=False)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [o if not o.startswith("data.path=") else f"data.path={data}" for o in csv_overrides(data)]
    overrides = [o for o in overrides if not o.startswith("split.")] + \
        ["split.train_end=2020-02-15", "split.test_start=2020-02-16", "split.test_end=null"]
    done = tamrun([*overrides, f"tracking.uri={store}", *QUICK], tmp_path / "cwd", {})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mape_test undefined (every target of the split is 0" in done.stdout + done.stderr
    run = only_run(store)
    assert run.info.status == "FINISHED" and math.isnan(run.data.metrics["mape_test"])
    assert math.isfinite(run.data.metrics["rmse_test"])
    assert math.isnan(run.data.metrics["mape_train"]) == (zero == "everywhere")


FAR_X = 1e4  # an unsupported group's test x: the training x lie in [0, 10]
LINEAR = ["data=csv", "data.target=y", "data.group=g", "model=custom", "+model.effects.x={kind: linear, column: x}",
          "split.train_end=2024-02-14", "split.test_start=2024-02-15", "split.test_end=null", *QUICK]


def far_groups_csv(path, groups: int, far: tuple) -> pd.DataFrame:
    """``groups`` groups of 60 days (45 training, 15 test), y = 20 + 0.5 x + N(0, 0.1^2) with x uniform in
    [0, 10]; the groups ``far`` have their test x at `FAR_X` (their y as the others')."""
    rng = np.random.default_rng(0)
    dates = pd.date_range("2024-01-01", periods=60, freq="D")
    frame = pd.DataFrame({"date": np.tile(dates, groups), "g": np.repeat(np.arange(groups), 60),
                          "x": rng.uniform(0, 10, groups * 60)})
    frame["y"] = 20 + 0.5 * frame.x + rng.normal(0, 0.1, len(frame))
    frame.loc[(frame.date >= "2024-02-15") & frame.g.isin(far), "x"] = FAR_X
    frame.to_csv(path, index=False)
    return frame


def test_one_group_far_outside_its_training_data_is_withheld_and_the_run_finishes(compose_cfg, store_uri, tmp_path,
                                                                                   caplog):
    from tamrun.fit.unsupported import BEYOND
    from tamrun.runner import run

    far_groups_csv(tmp_path / "far.csv", 200, (0,))  # the first group: its rows open the test split
    with caplog.at_level("WARNING", logger="tamrun"):
        result = run(compose_cfg(*LINEAR, f"data.path={tmp_path / 'far.csv'}", "tracking.log_model=true"))
    client = MlflowClient(tracking_uri=store_uri)
    recorded = client.get_run(result.run_id)
    assert recorded.info.status == "FINISHED" and recorded.data.metrics["groups_unsupported"] == 1
    assert recorded.data.metrics["system/data/n_test_rows"] == 200 * 15  # the split's rows, withheld ones included
    (line,) = [r.getMessage() for r in caplog.records if "withheld from the forecast" in r.getMessage()]
    assert line.startswith("1 of 200 group(s) withheld from the forecast and the metrics") and "up to 2): 0; the test " \
        "forecasts of 1 group(s) reach" in line and "predictions/groups_unsupported.csv says why" in line
    folder = tmp_path / "artifacts"
    why = pd.read_csv(client.download_artifacts(result.run_id, "predictions/groups_unsupported.csv", str(folder)))
    assert why[["group", "split", "reason", "training_rows", "coefficients"]].values.tolist() == \
        [[0, "test", BEYOND, 45, 2]]
    assert why["spreads"].iloc[0] > 100 and abs(why["forecast"].iloc[0]) > 1000
    table = pd.read_parquet(client.download_artifacts(result.run_id, "predictions/predictions.parquet", str(folder)))
    assert 0 not in set(table["group"]) and table["group"].nunique() == 199 and table.notna().all().all()
    per_group = pd.read_csv(client.download_artifacts(result.run_id, "predictions/group_metrics.csv", str(folder)))
    assert 0 not in set(per_group["group"]) and len(per_group) == 2 * 199
    test = table[table["split"] == "test"]
    error = test["actual"].to_numpy(np.float64) - test["predicted"].to_numpy(np.float64)
    reference = float(np.sqrt(np.mean(error ** 2)))  # float64, the other 199 groups' 2,985 test rows
    assert len(test) == 199 * 15 and recorded.data.metrics["rmse_test"] == pytest.approx(reference, rel=1e-12)
    assert recorded.data.metrics["rmse_test"] < 0.2  # the noise's 0.1, not the withheld group's thousands
    without = tmp_path / "without.csv"
    frame = pd.read_csv(tmp_path / "far.csv")
    frame[frame.g != 0].to_csv(without, index=False)
    alone = run(compose_cfg(*LINEAR, f"data.path={without}"))  # groups are independent systems: the same fits
    assert alone.metrics["groups_unsupported"] == 0
    for name in ("rmse_test", "mape_test", "rmse_train", "coverage_80_test"):
        assert result.metrics[name] == pytest.approx(alone.metrics[name], rel=1e-9), name
    with pytest.MonkeyPatch.context() as patch:  # not set_tracking_uri: it would outlive the test in its worker
        patch.setenv("MLFLOW_TRACKING_URI", store_uri)
        # the logged model's input example: the supported groups' rows (the withheld group's open the split)
        example = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model").input_example
    assert len(example) == 5 and 0 not in set(example["g"]) and example["x"].max() <= 10


@pytest.mark.parametrize("groups, far", [(200, (7, 20, 33)), (1, (0,))], ids=["3 of 200", "a single group"])
def test_more_unsupported_groups_than_the_setting_allows_fail_naming_it_and_the_fix(tmp_path, groups, far):
    far_groups_csv(tmp_path / "far.csv", groups, far)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun([*LINEAR, f"data.path={tmp_path / 'far.csv'}", f"tracking.uri={store}"], tmp_path / "cwd", {})
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("tamrun:")]
    assert line.startswith(f"tamrun: numerical error: data.group={list(far)}: the test forecasts of {len(far)} group(s)")
    assert "not supported by the training data (the penalties are too weak for these groups' data, or their " \
        "features lie far outside the training range)" in line
    share = f"{len(far)} of {groups} group(s) ({len(far) / groups:.2%}) are more than evaluate.max_unsupported_share=0.01"
    assert share in line and "Fix: raise the penalties" in line
    assert "; check those groups' features where they are forecast (a value far outside their training range" in line
    assert ("or set evaluate.max_unsupported_share=0.015 to withhold them and finish with the other groups" in line) \
        == (groups > 1)  # a single group's run has no other group to finish with
    assert only_run(store).info.status == "FAILED" and "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_a_share_that_would_let_every_group_go_is_refused_before_the_run(tmp_path, monkeypatch, capsys, value):
    """evaluate.max_unsupported_share lies in [0, 1): 1 would let a run whose every group is unsupported finish
    with no forecast at all."""
    from tamrun.__main__ import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main([f"evaluate.max_unsupported_share={value}", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    output = "".join(capsys.readouterr())
    assert ended.value.code == 2 and "tamrun: config error: evaluate.max_unsupported_share=" in output, output
    assert "the share of the groups must be a finite number in [0, 1). Fix: set evaluate.max_unsupported_share=0.01" \
        in output and "Traceback" not in output and not (tmp_path / "mlflow.db").exists()


def test_only_finite_far_forecasts_are_withheld_and_withholding_leaves_their_rows_out():
    """Four groups of 3 training and 2 test rows (target 20 +- 1): a finite forecast 10 spreads away is withheld
    (listed once per split, with its figures); a NaN or infinite one never is (the metrics stay non-finite and
    the run fails); `withhold` marks the withheld group's rows as padding, the others' as they were."""
    import torch

    from tamrun.data.batch import build_batch
    from tamrun.fit.evaluate import scored
    from tamrun.fit.unsupported import FEWER_ROWS, find_unsupported, withhold

    frame = pd.DataFrame({"g": np.repeat(["a", "b", "c", "d"], 5), "x": 0.0, "y": np.tile([19, 20, 21, 20, 20], 4)})
    train = build_batch(frame[frame.index % 5 < 3], ["x"], "y", "g", torch.float64)
    test = build_batch(frame[frame.index % 5 >= 3], ["x"], "y", "g", torch.float64, groups=train.groups)
    predicted = torch.tensor([[20.0, 21.0], [20.0, 500.0], [float("nan"), 900.0], [float("inf"), 20.0]],
                             dtype=torch.float64)
    found = find_unsupported({"validation": (test, predicted), "test": (test, predicted)}, train, width=4)
    assert found.indices == [1]
    assert found.table[["group", "split", "reason", "forecast", "training_rows", "coefficients"]].values.tolist() == [
        ["b", "validation", FEWER_ROWS, 500.0, 3, 4], ["b", "test", FEWER_ROWS, 500.0, 3, 4]]
    assert found.table["spreads"].iloc[0] == pytest.approx(480 / found.table["training_spread"].iloc[0])
    kept = withhold(test, found.indices)
    actual, forecast = scored(kept, predicted)
    assert len(actual) == 6 and 500.0 not in forecast and np.isnan(forecast).sum() == 1 and np.isinf(forecast).sum() == 1
    assert kept.counts.tolist() == [2, 0, 2, 2] and test.counts.tolist() == [2, 2, 2, 2]  # the batch itself untouched
