"""python -m tamrun.bench.backtest and its statsforecast child: the windows, the commands, the scores and the
table (no run is timed and no timing is asserted: only that each figure is where the report says)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tamrun.bench.backtest import (STATSFORECAST, TEMPERATURE, main, parse_arguments, pooled, table,
                                   tamrun_arguments, window_bounds, window_rows)
from tamrun.bench.child import RESULT_PREFIX
from tamrun.bench.mstl_child import RESULT_PREFIX as MSTL_PREFIX
from tamrun.bench.mstl_child import window_scores
from tamrun.bench.sites import hourly_sites


def test_windows_are_local_midnights_and_the_week_the_clocks_change_is_an_hour_short():
    bounds = window_bounds("2023-03-20", windows=2, step_days=7, horizon_days=7, timezone="Europe/Paris")
    assert [start.isoformat() for start, _ in bounds] == ["2023-03-20T00:00:00+01:00", "2023-03-27T00:00:00+02:00"]
    frame = hourly_sites(sites=2, start="2023-03-15", end="2023-04-05")
    assert window_rows(frame["date"], bounds) == [2 * 167, 2 * 168]
    last_end = window_bounds("2023-01-01", 52, 7, 7, "Europe/Paris")[-1][1]
    assert last_end.tz_convert("UTC").tz_localize(None) == pd.Timestamp("2023-12-30 23:00")  # statsforecast's end


def test_the_pooled_rmse_weighs_each_window_by_its_rows():
    assert pooled([1.0, 3.0], [1, 1]) == pytest.approx(math.sqrt(5.0))
    assert pooled([2.0, 2.0], [3, 7]) == pytest.approx(2.0)
    assert pooled([1.0, 2.0], [3, 1]) == pytest.approx(math.sqrt(7.0 / 4))


def test_tamruns_runs_are_the_command_a_user_types(tmp_path):
    args = parse_arguments([])
    backtest = tamrun_arguments(tmp_path / "sites.csv", "backtest", args, tmp_path)
    assert {"mode=backtest", "model=calendar", "data.timezone=Europe/Paris", "data.holidays=FR",
            "split.train_end=2022-12-31", "split.test_start=2023-01-01", "split.test_end=2023-12-30",
            "backtest.windows=52", "backtest.step=7D", "backtest.horizon=7D", TEMPERATURE} <= set(backtest)
    bare = tamrun_arguments(tmp_path / "sites.csv", "one fit without temperature", args, tmp_path)
    assert "mode=run" in bare and TEMPERATURE not in bare and not [a for a in bare if a.startswith("backtest.")]
    assert bare[-3] == f"tracking.uri=sqlite:///{tmp_path / 'one_fit_without_temperature'}.db"


def test_statsforecasts_child_scores_each_window_over_every_series():
    cv = pd.DataFrame({"unique_id": ["a", "b", "a", "b"], "cutoff": [1, 1, 2, 2],
                       "ds": pd.to_datetime(["2023-01-01"] * 2 + ["2023-01-08"] * 2),
                       "y": [1.0, 2.0, 3.0, 4.0], "MSTL": [2.0, 1.0, 3.0, 7.0]})
    scores = window_scores(cv)
    assert scores["window_rmse"] == pytest.approx([1.0, math.sqrt(4.5)])
    assert scores["window_rows"] == [2, 2]
    assert scores["rmse_mean_of_windows"] == pytest.approx((1.0 + math.sqrt(4.5)) / 2)
    assert scores["rmse_pooled"] == pytest.approx(math.sqrt(11.0 / 4))
    assert MSTL_PREFIX == RESULT_PREFIX  # the benchmark reads the child's line as it reads tamrun's children


def test_the_table_gives_each_backtest_its_ratio_to_the_one_fit_with_the_same_effects():
    records = [
        {"run": "backtest", "condition": "idle", "status": "ok", "wall_seconds": 40.0, "window_rmse": [1.0] * 52,
         "rmse_mean_of_windows": 1.5, "rmse_pooled": 1.6},
        {"run": "one fit", "condition": "idle", "status": "ok", "wall_seconds": 10.0, "rmse_test": 1.7},
        {"run": "backtest", "condition": "idle", "status": "ok", "wall_seconds": 20.0, "window_rmse": [1.0] * 52,
         "rmse_mean_of_windows": 1.5, "rmse_pooled": 1.6},
        {"run": "one fit", "condition": "idle", "status": "ok", "wall_seconds": 12.0, "rmse_test": 1.7},
        {"run": "backtest", "condition": "loaded", "status": "error", "error": "exit 2"},
        {"run": STATSFORECAST, "condition": "loaded", "status": "ok", "wall_seconds": 600.0,
         "cross_validation_seconds": 590.0, "window_rmse": [2.0] * 52, "rmse_mean_of_windows": 2.5, "rmse_pooled": 2.6}]
    lines = table(records, busy=2)
    assert lines[0].startswith("| condition | run | ok | wall s (median) | / one fit | runs: wall s |")
    assert lines[2] == "| idle | backtest | 2/2 | 30.0 | 2.73 | 40.0, 20.0 | – | 52 | 1.500 | 1.600 | – |"
    assert lines[3] == "| idle | one fit | 2/2 | 11.0 | – | 10.0, 12.0 | – | – | – | – | 1.700 |"
    assert lines[4] == "| beside 2 busy | backtest | 0/1 | – | – | – | – | – | – | – | – |"
    assert lines[5] == f"| beside 2 busy | {STATSFORECAST} | 1/1 | 600.0 | – | 600.0 | 590.0 | 52 | 2.500 | 2.600 | – |"


def test_an_unknown_run_is_refused_before_anything_runs(capsys):
    assert main(["--variants", "backtest,fast"]) == 2
    assert "unknown variant(s) ['fast']" in capsys.readouterr().err
