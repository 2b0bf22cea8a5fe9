"""mode=backtest: every window against a plain run (mode=run) trained up to its cut-off and tested on its
horizon, what MLflow records, bad input, and sweeps on rmse_backtest. A raw hourly table of 2 sites
(`tamrun.bench.sites`), real Hydra composition, real sqlite stores, real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tamrun.bench.sites import hourly_sites, write_sites
from tamrun.errors import TamrunError
from tamrun.runner import run
from tamrun.tracking.sweep_record.sweep_files import SWEEP_FILE

from test_cli import tamrun

# |backtest - plain run| <= TOLERANCE x the largest |actual| of the horizon: the two differ only in the order
# the rows' sums are taken (up/down-dated Grams against Grams from the rows).
TOLERANCE = 1e-6
# A scaler-dependent spline (temperature), categorical hours and days of week, a Fourier day of year.
MODEL = ["model=custom", "+model.effects.temp={kind: spline, column: temperature, k: 8, ap: -4}",
         "+model.effects.hour={kind: categorical, column: hour, topo: nominal, ap: -6}",
         "+model.effects.dow={kind: categorical, column: dow, topo: nominal, ap: -6}",
         "+model.effects.doy={kind: fourier, column: doy, m: 3, ap: -6}"]
# A forest on quantile thresholds: each window's thresholds differ (separate segments of windows).
FOREST = ["+model.effects.heat={kind: forest, column: temperature, others: [doy], n_trees: 4, max_depth: 3, "
          "split: quantile, ap: -3}"]
# A linear effect on the ramp: the feature ranges of site_1 change from window to window, site_2's do not.
RAMP = ["+model.effects.ramp={kind: linear, column: ramp, ap: -6}"]
TEST_START = "2023-02-06"
SITES_MODEL = """name: sites
effects:
  temp: {kind: spline, column: temperature, k: 8, ap: -4}
  hour: {kind: categorical, column: hour, topo: nominal, ap: -6}
"""


@pytest.fixture(scope="module")
def sites_csv(tmp_path_factory) -> Path:
    """2 sites, hourly, 2022-01-01 to 2023-04-30, with hour / day of week / day of year columns."""
    frame = hourly_sites(sites=2, start="2022-01-01", end="2023-04-30")
    frame["hour"], frame["dow"] = frame["date"].dt.hour, frame["date"].dt.day_of_week
    frame["doy"] = frame["date"].dt.day_of_year
    # site_1's ramp grows with time (its range, and so its scaling, changes in every window); site_2's is
    # periodic (the same range in every window): the Grams of both kinds of system in one batch
    hours = (frame["date"] - frame["date"].min()).dt.total_seconds() / 3600
    frame["ramp"] = np.where(frame["site"] == "site_1", hours / 1000, np.sin(hours * np.pi / 12))
    return write_sites(frame, tmp_path_factory.mktemp("sites") / "sites.csv")


def data(path: Path) -> List[str]:
    return ["data=csv", f"data.path={path}", "data.target=load", "data.group=site", "tracking.log_model=false",
            "tracking.log_plots=false", "hw.threads=1"]


def plain_forecast(compose_cfg, path: Path, extra: List[str], train_start, trained_to: str, cutoff: str,
                   end: str) -> pd.DataFrame:
    """(date, group, predicted) of a plain run trained from ``train_start`` (None: the first row) to the day
    before ``trained_to`` and tested from ``cutoff`` to ``end``."""
    day_before = f"{pd.Timestamp(trained_to) - pd.Timedelta(days=1):%Y-%m-%d}"
    start = f"split.train_start={train_start}" if train_start else "split.train_start=null"
    cfg = compose_cfg(*data(path), *MODEL, *extra, "mode=run", start, f"split.train_end={day_before}",
                      f"split.test_start={cutoff}", f"split.test_end={end}", "tracking.log_predictions=false")
    table = run(cfg).predictions
    return table[table["split"] == "test"][["date", "group", "predicted"]]


CASES = {  # settings, the effects added to MODEL, each window's first training day (None: the first row)
    "expanding": ([], RAMP, lambda cutoff: None),
    "sliding": (["backtest.refit=sliding", "backtest.length=120D"], [*RAMP, "data.timezone=Europe/Paris"],
                lambda cutoff: f"{pd.Timestamp(cutoff) - pd.Timedelta(days=120):%Y-%m-%d}"),
    "once": (["backtest.refit=once"], [], lambda cutoff: None),
    "forest": ([], FOREST, lambda cutoff: None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_window_equals_a_plain_run_up_to_its_cutoff(compose_cfg, sites_csv, case):
    """3 weekly windows (horizon 10 days: they overlap); window k's forecasts against a plain run's with
    split.train_end the day before its cut-off (refit=once: the first cut-off's) and its horizon as test
    (sliding: in local days of data.timezone, the splits' and the cut-offs' alike)."""
    settings, extra, train_start = CASES[case]
    cfg = compose_cfg(*data(sites_csv), *MODEL, *extra, *settings, "mode=backtest", f"split.test_start={TEST_START}",
                      "backtest.windows=3", "backtest.step=7D", "backtest.horizon=10D")
    result = run(cfg)
    table = result.predictions
    assert sorted(table["window"].unique()) == [0, 1, 2]
    for k in range(3):
        cutoff = f"{pd.Timestamp(TEST_START) + pd.Timedelta(days=7 * k):%Y-%m-%d}"
        end = f"{pd.Timestamp(cutoff) + pd.Timedelta(days=9):%Y-%m-%d}"
        trained_to = TEST_START if case == "once" else cutoff
        plain = plain_forecast(compose_cfg, sites_csv, extra, train_start(trained_to), trained_to, cutoff, end)
        ours = table[table["window"] == k].merge(plain, on=["date", "group"], suffixes=("", "_plain"))
        assert len(ours) == (table["window"] == k).sum() == len(plain) == 2 * 24 * 10
        scale = np.abs(ours["actual"].to_numpy()).max()
        assert np.abs(ours["predicted"] - ours["predicted_plain"]).max() <= TOLERANCE * scale
    metrics = result.metrics
    assert metrics["backtest_windows"] == 3
    assert (metrics["design_segments"] > 1) == (case == "forest")  # quantile thresholds move with the rows
    if case == "expanding":  # window 0's Grams and site_1's later ones come from their rows, some of site_2's updated
        assert 2 + 1 + 1 <= metrics["fresh_grams"] < 2 * 3


def test_the_run_records_the_windows_metrics_table_and_plot(compose_cfg, sites_csv, store_uri, tmp_path):
    """rmse_backtest / mape_backtest are the windows' means, rmse_window their history (step = window), the
    window table names each cut-off, training rows and horizon; the plot is logged. One window per batch
    (backtest.max_batch_windows=1), or the batches a memory.limit of 8 MiB leaves, give the same forecasts as
    every window in one batch."""
    base = [*data(sites_csv), *MODEL, "mode=backtest", f"split.test_start={TEST_START}", "backtest.windows=4",
            "split.train_start=2022-02-01"]
    result = run(compose_cfg(*base, "tracking.log_plots=true"))
    one = run(compose_cfg(*base, "backtest.max_batch_windows=1"))
    capped = run(compose_cfg(*base, "memory.limit=8MiB"))  # a window budget of a few MiB: smaller batches
    assert one.metrics["window_batches"] == 4 and result.metrics["window_batches"] == 1
    assert 1 < capped.metrics["window_batches"] and capped.metrics["oom_retries"] == 0
    for other in (one, capped):
        assert np.allclose(other.predictions["predicted"], result.predictions["predicted"], rtol=0, atol=1e-9)
    client = MlflowClient(tracking_uri=store_uri)
    logged = client.get_run(result.run_id)
    assert logged.info.status == "FINISHED"
    history = client.get_metric_history(result.run_id, "rmse_window")
    rmse = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [0, 1, 2, 3]
    assert logged.data.metrics["rmse_backtest"] == pytest.approx(np.mean(rmse), rel=1e-12)
    windows = pd.read_csv(client.download_artifacts(result.run_id, "backtest/windows.csv", str(tmp_path)))
    assert windows["cutoff"].tolist() == ["2023-02-06", "2023-02-13", "2023-02-20", "2023-02-27"]
    assert windows["horizon_end"].tolist() == ["2023-02-12", "2023-02-19", "2023-02-26", "2023-03-05"]
    assert windows["train_start"].tolist() == ["2022-02-01"] * 4
    assert windows["train_end"].tolist() == ["2023-02-05", "2023-02-12", "2023-02-19", "2023-02-26"]
    assert np.diff(windows["train_rows"]).tolist() == [2 * 24 * 7] * 3
    assert windows["rmse"].tolist() == pytest.approx(rmse, rel=1e-12)
    table = result.predictions
    for k, part in table.groupby("window"):
        error = part["actual"] - part["predicted"]
        assert windows["rmse"][k] == pytest.approx(float(np.sqrt((error ** 2).mean())), rel=1e-9)
        assert windows["mape"][k] == pytest.approx(float((error.abs() / part["actual"].abs()).mean() * 100), rel=1e-9)
    assert logged.data.metrics["mape_backtest"] == pytest.approx(windows["mape"].mean(), rel=1e-12)
    artifacts = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert "plots/backtest.png" in artifacts


BAD = [
    (["backtest.windows=60"], "DataError", "backtest.windows=60", "after the data's last date"),
    (["backtest.horizon=soon"], "ConfigError", "backtest.horizon='soon'", "not a pandas offset"),
    (["backtest.step=12h"], "ConfigError", "backtest.step='12h'", "whole days"),
    (["backtest.refit=sliding"], "ConfigError", "backtest.length=None", "backtest.refit=sliding"),
    (["backtest.windows=0"], "ConfigError", "backtest.windows=0", "the number of windows"),
    (["split.test_start=2022-01-01", "split.train_start=2022-01-01"], "DataError", "split.test_start",
     "no training rows"),
    (["split.test_start=2021-12-01"], "DataError", "split.test_start", "no training rows"),
    (["split.validation_start=2022-06-01"], "ConfigError", "split.validation_start", "a gap"),
]


@pytest.mark.parametrize("overrides, kind, field, problem", BAD, ids=[b[2].split("=")[0] + "-" + b[3][:12] for b in BAD])
def test_bad_input_is_one_readable_error(compose_cfg, sites_csv, overrides, kind, field, problem):
    """Each case: one TamrunError naming the field, the value and a fix."""
    with pytest.raises(TamrunError) as raised:
        run(compose_cfg(*data(sites_csv), *MODEL, "mode=backtest", f"split.test_start={TEST_START}", *overrides))
    message = str(raised.value)
    assert type(raised.value).__name__ == kind, message
    assert field in message and problem in message and "Fix:" in message, message


def test_the_command_exits_2_with_one_line_on_a_window_beyond_the_data(sites_csv, tmp_path):
    done = tamrun(*data(sites_csv), *MODEL, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "mode=backtest",
                  "split.test_start=2023-04-20", "backtest.windows=3", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "tamrun: data error: backtest.windows=3: window 2's horizon ends on 2023-05-10" in done.stderr
    assert "Fix: set backtest.windows=1 or fewer" in done.stderr and "Traceback" not in done.stderr


def sweep_children(store: str, sweep_dir: Path):
    info = json.loads((sweep_dir / SWEEP_FILE).read_text())
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([info["experiment_id"]], filter_string=f"tags.sweep_id = '{info['sweep_id']}'")
    parent = next(r for r in runs if r.info.run_id == info["parent_run_id"])
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["sweep_job"]))
    return parent, children


@pytest.mark.parametrize("sweeper", ["basic", "optuna"])
def test_a_sweep_chooses_on_rmse_backtest(sites_csv, tmp_path, sweeper):
    """mode=backtest's objective is rmse_backtest: the parent crowns the job with the least (best_run, best_job), and
    Optuna minimises it."""
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    conf = tmp_path / "user_conf"  # the model as a preset of the user's: Optuna sets its fields before any +key=
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "sites.yaml").write_text(SITES_MODEL)
    swept = (["model.effects.temp.ap=-8,2"] if sweeper == "basic" else
             ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
              "hydra.sweeper.sampler.seed=0", "model.effects.temp.ap=interval(-8.0, 2.0)"])
    done = tamrun("-m", *data(sites_csv), "model=sites", f"hydra.searchpath=[file://{conf}]", f"tracking.uri={store}",
                  f"hydra.sweep.dir={sweep_dir}",
                  "mode=backtest", f"split.test_start={TEST_START}", "backtest.windows=2", *swept, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    parent, children = sweep_children(store, sweep_dir)
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
    scores = [r.data.metrics["rmse_backtest"] for r in children]
    assert "rmse_test" not in children[0].data.metrics
    assert parent.data.metrics["best_rmse_backtest"] == pytest.approx(min(scores), rel=1e-12)
    best = children[scores.index(min(scores))]
    assert parent.data.tags["best_run"] == best.info.run_id and parent.data.tags["best_job"] == best.info.run_name
    assert not any(name.startswith("best_rmse_") and name != "best_rmse_backtest" for name in parent.data.metrics)
    if sweeper == "optuna":
        best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
        assert best["best_value"] == pytest.approx(min(scores), rel=1e-12)
    else:  # python -m tamrun.compare --best ranks on rmse_backtest when the runs logged it
        chosen = subprocess.run([sys.executable, "-m", "tamrun.compare", "--store", store, "--best"], cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
        assert chosen.returncode == 0, chosen.stderr
        assert f"run_id: {children[scores.index(min(scores))].info.run_id}" in chosen.stdout.splitlines()


def test_cutoffs_are_local_midnights_of_the_data_timezone(compose_cfg, sites_csv):
    """data.timezone=Europe/Paris: the table's dates are UTC, each cut-off the local midnight (23:00 UTC in
    winter, 22:00 in summer): the windows across the clocks' change of 2023-03-26 score 7 local days each."""
    result = run(compose_cfg(*data(sites_csv), *MODEL, "mode=backtest", "data.timezone=Europe/Paris",
                             "split.test_start=2023-03-20", "backtest.windows=2"))
    table = result.predictions
    first = table.groupby("window")["date"].min().tolist()
    assert first == [pd.Timestamp("2023-03-19 23:00"), pd.Timestamp("2023-03-26 22:00")]
    assert table.groupby("window").size().tolist() == [2 * (24 * 7 - 1), 2 * 24 * 7]  # the week of 23-hour Sunday
