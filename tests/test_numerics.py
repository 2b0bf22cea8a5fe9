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
from tamrun.evaluate import rmse
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
