"""Results that are not finite never end FINISHED: out-of-range settings and values are refused before
the fit, a fit or a metric that is not finite ends the run FAILED (exit 2 from the command line), and
metrics do not overflow on large targets. Real runs on the synthetic CSV and a real sqlite store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.errors import ConfigError, DataError, NumericalError
from tamrun.fit.evaluate import rmse
from tamrun.runner import run

from conftest import csv_overrides, synthetic_frame

FAST = ["tracking.log_plots=false", "tracking.log_model=false"]


def scaled_csv(tmp_path: Path, factor: float) -> Path:
    """The synthetic table with its target multiplied by ``factor``."""
    frame = synthetic_frame()
    frame["y"] = frame["y"] * factor
    path = tmp_path / f"scaled_{factor:g}.csv"
    frame.to_csv(path, index=False)
    return path


def only_run_status(store_uri: str) -> str:
    (logged,) = MlflowClient(tracking_uri=store_uri).search_runs(["1"])
    return logged.info.status


def test_rmse_does_not_overflow_and_matches_the_definition():
    rng = np.random.default_rng(0)
    actual, predicted = rng.normal(size=1000), rng.normal(size=1000)
    assert rmse(actual, predicted) == pytest.approx(float(np.sqrt(np.mean((actual - predicted) ** 2))), rel=1e-14)
    big = rmse(actual * 1e200, predicted * 1e200)  # the squares alone would overflow to inf
    assert math.isfinite(big) and big == pytest.approx(1e200 * rmse(actual, predicted), rel=1e-14)


def test_a_non_finite_intercept_penalty_is_refused_before_the_run(compose_cfg, csv_path, store_uri):
    with pytest.raises(ConfigError, match="model.intercept_ap"):
        run(compose_cfg(*csv_overrides(csv_path), "model.intercept_ap=nan"))
    assert not Path(store_uri.removeprefix("sqlite:///")).exists()  # refused before any MLflow run


def test_a_warm_start_of_nan_is_refused_and_the_run_failed(compose_cfg, csv_path, store_uri, tmp_path):
    width = run(compose_cfg(*csv_overrides(csv_path), "mode=plan")).width
    table = pd.DataFrame(np.full((3, width), np.nan), columns=[f"c{i}" for i in range(width)])
    table.insert(0, "group", [0, 1, 2])
    warm = tmp_path / "coefficients.csv"
    table.to_csv(warm, index=False)
    with pytest.raises(ConfigError, match="solver.warm_start.*NaN"):
        run(compose_cfg(*csv_overrides(csv_path), "solver=cg", f"solver.warm_start={warm}", *FAST))
    assert only_run_status(store_uri) == "FAILED"


def test_a_target_beyond_float32_is_refused_naming_the_dtype(compose_cfg, tmp_path, store_uri):
    path = scaled_csv(tmp_path, 1e39)  # finite in float64, infinite in float32
    with pytest.raises(DataError, match="dtype='float32'.*beyond float32's range.*dtype=float64"):
        run(compose_cfg(*csv_overrides(path), "dtype=float32", *FAST))
    assert only_run_status(store_uri) == "FAILED"


def test_a_fit_that_overflows_ends_failed_not_finished(compose_cfg, tmp_path, store_uri):
    """A float32 target of 3e37 fits the dtype, but Phi'y sums thousands of them: inf in float32."""
    path = scaled_csv(tmp_path, 3e37)
    with pytest.raises(NumericalError, match="not finite.*dtype=float64"):
        run(compose_cfg(*csv_overrides(path), "dtype=float32", *FAST))
    assert only_run_status(store_uri) == "FAILED"


def test_a_target_near_1e200_fits_with_a_finite_rmse(compose_cfg, csv_path, tmp_path):
    """The penalised least squares is linear in y: scaling y by 1e200 scales the RMSE by 1e200."""
    plain = run(compose_cfg(*csv_overrides(csv_path), "tracking=none"))
    huge = run(compose_cfg(*csv_overrides(scaled_csv(tmp_path, 1e200)), "tracking=none"))
    assert math.isfinite(huge.metrics["rmse_test"])
    assert huge.metrics["rmse_test"] == pytest.approx(1e200 * plain.metrics["rmse_test"], rel=1e-9)


# --- absurd values (issue 35): finite but meaningless targets, predictions and metrics never end FINISHED

def edited_csv(tmp_path: Path, rows: dict, name: str = "edited.csv") -> Path:
    """The synthetic table with the target of the rows (index -> value) replaced."""
    frame = synthetic_frame()
    for row, value in rows.items():
        frame.loc[row, "y"] = value
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_a_target_of_1e308_among_ordinary_values_is_refused_naming_its_row(compose_cfg, tmp_path, store_uri):
    """Before issue 35 this run ended FINISHED with rmse_train 3.7e306 and ordinary days predicted near 1e302."""
    path = edited_csv(tmp_path, {100: 1e308})
    with pytest.raises(DataError) as refused:
        run(compose_cfg(*csv_overrides(path), *FAST))
    message = str(refused.value)
    assert message.startswith("data.target='y': 1 row(s) lie far outside the rest (farther from the median ")
    assert "2020-01-05 04:00:00 in group 1 (1e+308)" in message and "data.target_outliers=drop" in message
    assert only_run_status(store_uri) == "FAILED"


def test_a_sentinel_value_is_refused_and_every_row_is_counted(compose_cfg, tmp_path):
    path = edited_csv(tmp_path, {row: -999999.0 for row in range(10, 80, 10)})
    with pytest.raises(DataError, match=r"7 row\(s\) lie far outside the rest.*\(-999999\) and 2 more"):
        run(compose_cfg(*csv_overrides(path), "tracking=none"))


def test_dropping_the_outliers_fits_as_the_file_without_them(compose_cfg, tmp_path):
    dropped = run(compose_cfg(*csv_overrides(edited_csv(tmp_path, {100: 1e308})), "tracking=none",
                              "data.target_outliers=drop"))
    frame = synthetic_frame().drop(index=100)
    clean = tmp_path / "clean.csv"
    frame.to_csv(clean, index=False)
    expected = run(compose_cfg(*csv_overrides(clean), "tracking=none"))
    assert dropped.metrics["n_train_rows"] == expected.metrics["n_train_rows"] == 366 * 24 - 1
    assert np.array_equal(dropped.coef.numpy(), expected.coef.numpy())


def test_a_fit_on_an_outlier_let_through_is_not_finished(compose_cfg, tmp_path, store_uri):
    """data.target_outliers=warn fits the 1e308 as it is: the predictions' check refuses the run."""
    path = edited_csv(tmp_path, {100: 1e308})
    with pytest.raises(NumericalError, match=r"predictions=6\.\d+e\+305: the largest train prediction is more than "
                                             r"1e\+06 times the training target's scale"):
        run(compose_cfg(*csv_overrides(path), *FAST, "data.target_outliers=warn"))
    assert only_run_status(store_uri) == "FAILED"


def test_an_absurd_test_value_makes_an_absurd_rmse_and_is_refused(compose_cfg, tmp_path, store_uri):
    """The outlier is in the test year: the fit and its predictions are sound, rmse_test is not."""
    test_row = 366 * 24 + 5
    path = edited_csv(tmp_path, {test_row: 1e300})
    with pytest.raises(NumericalError, match=r"rmse_test=\d\.\d+e\+298: it is more than 1e\+06 times"):
        run(compose_cfg(*csv_overrides(path), *FAST, "data.target_outliers=warn"))
    assert only_run_status(store_uri) == "FAILED"


def test_the_robust_spread_holds_for_targets_that_are_mostly_one_value():
    from tamrun.data.checks import OUTLIER_SPREADS, robust_spread

    intermittent = np.array([0.0] * 60 + [100.0] * 40)  # the median absolute deviation is 0
    spread = robust_spread(intermittent, float(np.median(intermittent)))
    assert spread == pytest.approx(1.2533 * 40) and 100 < OUTLIER_SPREADS * spread
    assert robust_spread(np.ones(10), 1.0) == 0.0
    heavy = np.random.default_rng(0).lognormal(0, 1.5, 100_000)  # a heavy but real tail: nothing flagged
    median = float(np.median(heavy))
    assert np.abs(heavy - median).max() < OUTLIER_SPREADS * robust_spread(heavy, median)


def test_an_adaptive_run_on_an_outlier_let_through_is_not_finished(compose_cfg, tmp_path, store_uri):
    """mode=adaptive (sliding windows) checks its forecasts as the plain run does."""
    path = edited_csv(tmp_path, {100: 1e308})
    with pytest.raises(NumericalError, match=r"predictions=.*: the largest test \((adaptive|static)\) prediction is "
                                             r"more than 1e\+06 times the training target's scale"):
        run(compose_cfg(*csv_overrides(path), *FAST, "data.target_outliers=warn", "mode=adaptive", "adaptive.step=7",
                        "adaptive.horizon=10", "adaptive.window=30"))
    assert only_run_status(store_uri) == "FAILED"
