"""Prediction intervals (tamrun/fit/intervals.py, tamrun/jobs/bands.py): the quantiles against numpy's, the
scores against their formulas, the online adaptation worked by hand, and a run's intervals end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.config.load import typed_config
from tamrun.errors import ConfigError
from tamrun.fit.intervals import (band_columns, calibrate, grouped_quantiles, interval_metrics, level_label,
                              online_bands, pinball, quantile_levels)
from tamrun.runner import run

from conftest import by_name, csv_overrides

TOL = 1e-12  # float64 quantiles and means of a few hundred numbers


def test_level_labels_and_columns():
    assert [level_label(p) for p in (0.8, 0.95, 0.975, 0.5)] == ["80", "95", "97.5", "50"]
    assert band_columns(0.9) == ("lower_90", "upper_90")
    assert np.allclose(quantile_levels([0.8, 0.95]), [[0.1, 0.9], [0.025, 0.975]], atol=TOL)


def test_grouped_quantiles_equal_numpys_per_group():
    """One sort for every group against np.quantile (linear interpolation) group by group, groups of 1 to
    200 values and an empty one (NaN)."""
    rng = np.random.default_rng(3)
    sizes = [1, 2, 7, 200, 0, 31]
    codes = np.repeat(np.arange(len(sizes)), sizes)
    values = rng.standard_t(3, codes.size) * 10
    order = rng.permutation(codes.size)
    taus = quantile_levels([0.5, 0.8, 0.99])
    found, counts = grouped_quantiles(values[order], codes[order], len(sizes), taus)
    assert counts.tolist() == sizes
    for group, size in enumerate(sizes):
        if size == 0:
            assert np.isnan(found[group]).all()
        else:
            assert np.allclose(found[group], np.quantile(values[codes == group], taus), rtol=0, atol=TOL)


def test_calibrate_takes_every_groups_quantiles_for_a_group_short_of_rows():
    rng = np.random.default_rng(4)
    codes = np.r_[np.zeros(100, int), np.ones(5, int)]
    residuals = np.r_[rng.normal(0, 1, 100), rng.normal(50, 1, 5)]
    bands = calibrate(residuals, codes, 2, [0.8], min_group_rows=50)
    assert np.allclose(bands.lower[0].numpy(), np.quantile(residuals[:100], 0.1), atol=TOL)
    assert np.allclose(bands.upper[1].numpy(), np.quantile(residuals, 0.9), atol=TOL)  # 5 rows < 50: pooled
    columns = bands.columns(np.array([10.0, 20.0]), np.array([0, 1]))
    assert np.allclose(columns["lower_80"], [10 + np.quantile(residuals[:100], 0.1), 20 + np.quantile(residuals, 0.1)],
                       atol=TOL)


def test_scores_follow_their_formulas():
    """coverage = % inside, width = mean(upper - lower), pinball over both bounds, worked by hand."""
    actual = np.array([0.0, 1.0, 2.0, 10.0])
    bands = {"lower_80": np.array([-1.0, 1.5, 0.0, 0.0]), "upper_80": np.array([1.0, 2.5, 2.0, 4.0])}
    metrics = interval_metrics(actual, bands, [0.8], "test")
    assert metrics["coverage_80_test"] == pytest.approx(50.0, abs=TOL)  # rows 0 and 2 inside
    assert metrics["width_80_test"] == pytest.approx((2 + 1 + 2 + 4) / 4, abs=TOL)
    # L_0.1(y, lower): errors y - lower = 1, -0.5, 2, 10 -> 0.1, 0.45, 0.2, 1.0; L_0.9(y, upper): -1, -1.5, 0, 6 ->
    # 0.1, 0.15, 0, 5.4
    low, high = (0.1 + 0.45 + 0.2 + 1.0) / 4, (0.1 + 0.15 + 0.0 + 5.4) / 4
    assert pinball(actual, bands["lower_80"], 0.1) == pytest.approx(low, abs=TOL)
    assert metrics["pinball_test"] == pytest.approx((low + high) / 2, abs=TOL)


def day_frame(days, values, forecast=0.0) -> pd.DataFrame:
    """Two rows a day (00:00, 12:00) of group "a": date, group, actual, f."""
    dates = pd.DatetimeIndex([pd.Timestamp(d) + pd.Timedelta(hours=h) for d in days for h in (0, 12)])
    return pd.DataFrame({"date": dates, "group": "a", "actual": np.asarray(values, float), "f": forecast})


def test_online_bands_worked_by_hand():
    """Day 1's quantiles from the window of calibration residuals before it; day 2's from the window that
    day 1's truth joined, at the level ACI moved: a_2 = a_1 + gamma (1 - p - miss_1)."""
    history = day_frame(["2024-01-01", "2024-01-02"], [1.0, -1.0, 2.0, -2.0]).rename(columns={"actual": "residual"})
    table = day_frame(["2024-01-03", "2024-01-04"], [3.0, 0.5, 0.0, 0.0])
    level, gamma = 0.5, 0.2
    bands = online_bands(history, table, "f", [level], window_days=2, gamma=gamma)
    window1 = np.array([1.0, -1.0, 2.0, -2.0])
    q1 = np.quantile(window1, [0.25, 0.75])
    assert np.allclose(bands["lower_50"][:2], q1[0], atol=TOL) and np.allclose(bands["upper_50"][:2], q1[1], atol=TOL)
    miss1 = np.mean([(y < q1[0]) or (y > q1[1]) for y in (3.0, 0.5)])  # 3.0 is outside, 0.5 inside
    alpha2 = (1 - level) + gamma * ((1 - level) - miss1)
    window2 = np.array([2.0, -2.0, 3.0, 0.5])  # 2024-01-02 and 2024-01-03: two days before 2024-01-04
    q2 = np.quantile(window2, [alpha2 / 2, 1 - alpha2 / 2])
    assert np.allclose(bands["lower_50"][2:], q2[0], atol=TOL) and np.allclose(bands["upper_50"][2:], q2[1], atol=TOL)


def test_online_bands_hold_their_coverage_through_a_drift_that_fixed_ones_miss():
    """Seeded errors whose spread doubles on the test period's first day: quantiles fixed on the
    calibration year cover far less than nominal; the online ones come back within 3 points over a year
    (and within adaptive conformal inference's guarantee, (max(a, 1 - a) + gamma) / (gamma T) for any data)."""
    rng = np.random.default_rng(7)
    days = pd.date_range("2023-01-01", "2024-12-30", freq="D")
    values = rng.normal(0, 1, 2 * len(days)) * np.repeat(np.where(days >= "2024-01-01", 2.0, 1.0), 2)
    frame = day_frame(days.strftime("%Y-%m-%d"), values)
    test = frame["date"] >= "2024-01-01"
    history = frame[~test].rename(columns={"actual": "residual"})
    table = frame[test].reset_index(drop=True)
    gamma = 0.01
    online = online_bands(history, table, "f", [0.8, 0.95], window_days=365, gamma=gamma)
    fixed = calibrate(history["residual"].to_numpy(), np.zeros(len(history), int), 1, [0.8, 0.95], 1)
    online_scores = interval_metrics(table["actual"].to_numpy(), online, [0.8, 0.95], "test")
    fixed_scores = interval_metrics(table["actual"].to_numpy(), fixed.columns(np.zeros(len(table)),
                                                                             np.zeros(len(table), int)),
                                    [0.8, 0.95], "test")
    days_scored = len(table) // 2
    for level in (80, 95):
        alpha = 1 - level / 100
        assert abs(online_scores[f"coverage_{level}_test"] - level) <= 3.0
        assert abs(online_scores[f"coverage_{level}_test"] - level) <= 100 * (max(alpha, 1 - alpha) + gamma) / (
            gamma * days_scored)
        assert fixed_scores[f"coverage_{level}_test"] < level - 10
    assert online_scores["pinball_test"] < fixed_scores["pinball_test"]


@pytest.mark.parametrize("overrides, field", [
    (["intervals.levels=[0.8,1.0]"], "intervals.levels"),
    (["intervals.levels=[0.8,0.8]"], "intervals.levels"),
    (["intervals.method=online"], "intervals.method"),  # mode=run forecasts its test period at once
    (["intervals.gamma=0"], "intervals.gamma"),
])
def test_bad_interval_settings_are_refused_naming_the_field(compose_cfg, overrides, field):
    with pytest.raises(ConfigError) as caught:
        typed_config(compose_cfg(*overrides))
    assert caught.value.field == field


def test_a_runs_intervals_are_calibrated_on_its_validation_split_and_scored_on_every_split(compose_cfg, store_uri,
                                                                                          csv_path):
    """The synthetic data's noise is N(0, 0.1^2): the 80 % interval's width is close to 2 x 1.2816 x 0.1;
    every split's rows lie inside their 80 % bounds about 80 % of the time; the bounds bracket the forecast."""
    result = run(compose_cfg(*csv_overrides(csv_path), "split.validation_start=2020-10-01", "tracking.log_plots=false"))
    metrics = by_name(MlflowClient(store_uri).get_run(result.run_id).data.metrics)
    assert metrics["coverage_80_validation"] == pytest.approx(80.0, abs=1.0)  # its calibration rows: 80 % by construction
    for split in ("train", "test"):
        assert metrics[f"coverage_80_{split}"] == pytest.approx(80.0, abs=5.0)
        assert metrics[f"coverage_95_{split}"] == pytest.approx(95.0, abs=3.0)
    assert metrics["width_80_test"] == pytest.approx(2 * 1.2816 * 0.1, rel=0.15)
    table = result.predictions
    assert (table["lower_95"] <= table["lower_80"]).all() and (table["lower_80"] <= table["predicted"]).all()
    assert (table["predicted"] <= table["upper_80"]).all() and (table["upper_80"] <= table["upper_95"]).all()


def test_no_levels_no_intervals(compose_cfg, store_uri, csv_path):
    result = run(compose_cfg(*csv_overrides(csv_path), "intervals.levels=[]", "tracking.log_plots=false",
                             "tracking.log_model=false"))
    metrics = by_name(MlflowClient(store_uri).get_run(result.run_id).data.metrics)
    assert not [name for name in metrics if name.startswith(("coverage_", "width_", "pinball_"))]
    assert not [column for column in result.predictions.columns if column.startswith(("lower_", "upper_"))]
