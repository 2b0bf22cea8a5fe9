"""Results and metrics that mean something (issue 44; docs/reliability.md).

- 200 groups of 2 training rows with a spline of k=10 (14 coefficients), target near 20: the forecasts
  reach thousands; the run ends FAILED (exit 2) with a numerical error naming the groups, the cause
  (fewer training rows than coefficients) and the fix, never FINISHED as if fine; the same data grouped
  more coarsely (the fix) ends FINISHED;
- a target that is 0 (all of it, or all of the test period): MAPE is undefined there, logged as NaN with
  a warning, and the valid fit ends FINISHED (its RMSE finite).
Real CSV files, real commands, a real sqlite store.
"""

from __future__ import annotations

import math

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
