"""Refit before registering (tamrun/jobs/refit.py, tamrun/compare/refit.py): a real sweep with a validation
period into a sqlite store, ``python -m tamrun.compare --best --register NAME --refit``, the refit run against
a plain run trained on the same rows, its intervals against the held-out residuals' quantiles; the refusals
(exit code 2, one line, nothing registered); and plots/intervals.png with a panel per group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import csv_overrides, synthetic_frame
from tamrun.bench.sites import hourly_sites
from tamrun.tracking.artifacts.plots import INTERVAL_PANELS, interval_figure

VALIDATION = "split.validation_start=2020-11-01"  # validation: 2020-11-01 .. split.train_end (2020-12-31)
NAME = "refit-model"


def tamrun(*args: str, cwd: Path, store: str, module: str = "tamrun") -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def refitted(tmp_path_factory):
    """A sweep of two penalties of the spline with a validation period, then its best job refitted and
    registered: (folder, store, client, best run, refit run, the compare's output)."""
    folder = tmp_path_factory.mktemp("refit")
    csv = folder / "synthetic.csv"
    synthetic_frame().to_csv(csv, index=False)
    store = f"sqlite:///{folder / 'mlflow.db'}"
    sweep = tamrun("-m", *csv_overrides(csv), VALIDATION, "model.effects.sx.ap=-6,2", "tracking.log_plots=false",
                   "progress=off", cwd=folder, store=store)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    done = tamrun("--store", store, "--sweep", "last", "--best", "--register", NAME, "--refit", cwd=folder, store=store,
                  module="tamrun.compare")
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(store)
    best_id = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("run_id: "))
    refits = client.search_runs([client.get_run(best_id).info.experiment_id], f"tags.refit_of = '{best_id}'")
    assert len(refits) == 1
    return folder, store, client, client.get_run(best_id), refits[0], done.stdout


def predictions(client: MlflowClient, run, folder: Path) -> pd.DataFrame:
    path = client.download_artifacts(run.info.run_id, "predictions/predictions.parquet", str(folder))
    return pd.read_parquet(path)


def test_the_refit_is_tagged_trained_through_the_validation_end_and_registered(refitted):
    _, _, client, best, refit, stdout = refitted
    assert best.data.params["model.effects.sx.ap"] == "-6"  # the sweep's better job: the lower penalty
    assert refit.data.tags["refit_of"] == best.info.run_id and refit.info.status == "FINISHED"
    params = refit.data.params
    assert params["split.refit"] == "True" and params["split.train_end"] == "2020-12-31"
    assert params["refit_through"] == "2020-12-31 23:00:00"  # the validation period's last row
    assert {key: value for key, value in params.items() if key.startswith(("model.", "data.", "split.valid"))} == \
        {key: value for key, value in best.data.params.items() if key.startswith(("model.", "data.", "split.valid"))}
    version = client.get_model_version_by_alias(NAME, "champion")
    assert version.run_id == refit.info.run_id != best.info.run_id
    assert f"refit: '{refit.info.run_name}' run_id {refit.info.run_id}, trained through 2020-12-31 23:00:00" in stdout
    # its held-out score is the best run's (the same fit without the validation period); its test score its own
    assert refit.data.metrics["rmse_validation"] == pytest.approx(best.data.metrics["rmse_validation"], rel=1e-9)
    assert refit.data.metrics["rmse_test"] != best.data.metrics["rmse_test"]


def test_the_refit_equals_a_plain_run_through_the_validation_end_and_its_bands_the_held_out_quantiles(
        refitted, compose_cfg, monkeypatch, tmp_path):
    import mlflow

    from tamrun.runner import run

    folder, store, client, best, refit, _ = refitted
    plain = run(compose_cfg(*csv_overrides(folder / "synthetic.csv"), "model.effects.sx.ap=-6", "tracking.log_plots=false",
                            "tracking.enabled=false", "progress=off"))  # split.train_end = the validation end
    coefficients = pd.read_csv(client.download_artifacts(refit.info.run_id, "fit/coefficients.csv", str(tmp_path)))
    assert coefficients["group"].tolist() == [int(g) for g in plain.groups]
    np.testing.assert_allclose(coefficients.drop(columns="group").to_numpy(), plain.coef.numpy(), rtol=0, atol=1e-6)
    held = predictions(client, best, tmp_path / "best")
    held = held[held["split"] == "validation"]
    quantiles = {group: np.quantile(rows["actual"] - rows["predicted"], [0.1, 0.9, 0.025, 0.975])
                 for group, rows in held.groupby("group")}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    rows = synthetic_frame()
    served = model.predict(rows[rows["date"] >= "2021-01-01"].head(300))
    for group, out in served.groupby("g"):
        q = quantiles[group]
        for column, value in zip(("lower_80", "upper_80", "lower_95", "upper_95"), q):
            np.testing.assert_allclose(out[column] - out["predicted"], value, rtol=0, atol=1e-9)
    table = predictions(client, refit, tmp_path / "refit")  # its validation rows: the held-out fit's forecasts
    mine = table[table["split"] == "validation"].reset_index(drop=True)
    np.testing.assert_allclose(mine["predicted"], held["predicted"].reset_index(drop=True), rtol=0, atol=1e-9)
    test = table[table["split"] == "test"]
    np.testing.assert_allclose(test["lower_80"] - test["predicted"],
                               [quantiles[g][0] for g in test["group"]], rtol=0, atol=1e-9)


def test_refit_without_register_exits_2_naming_the_fix(refitted):
    folder, store, *_ = refitted
    done = tamrun("--store", store, "--sweep", "last", "--best", "--refit", cwd=folder, store=store,
                  module="tamrun.compare")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("tamrun: config error: --refit=True: --refit refits the best run to register it")
    assert "Fix: add --register NAME" in done.stderr


def test_a_best_run_whose_data_is_gone_is_not_refitted_nor_registered(refitted):
    folder, store, client, best, *_ = refitted
    csv = folder / "synthetic.csv"
    csv.rename(folder / "moved.csv")
    try:
        done = tamrun("--store", store, "--sweep", "last", "--best", "--register", "other-model", "--refit",
                      cwd=folder, store=store, module="tamrun.compare")
    finally:
        (folder / "moved.csv").rename(csv)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"tamrun: config error: --refit='{best.info.run_name}': the best run's config did "
                                  "not run again (its run said: data error: data.path=")
    assert "Fix: fix what it names" in done.stderr and "Traceback" not in done.stderr
    assert not client.search_registered_models("name = 'other-model'")


def test_a_best_run_refit_cannot_refit_is_refused_by_name(tmp_path, migrated_store, capsys, monkeypatch):
    """In this process (`tamrun.compare.__main__.main`): each refused before any refit runs."""
    import shutil

    from tamrun.compare.__main__ import main

    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    store = f"sqlite:///{shutil.copy(migrated_store, tmp_path / 'mlflow.db')}"
    client = MlflowClient(store)
    run_params = {"mode.name": "run", "split.validation_start": "2020-11-01"}
    for experiment, params, overrides, problem in (
            ("adaptive", {**run_params, "mode.name": "adaptive"}, "", "the best run is mode=adaptive"),
            ("no-validation", {**run_params, "split.validation_start": "null"}, "",
             "the best run has no validation period"),
            ("masked", run_params, "data=csv\ndata.path=s3://bob:***@bucket/x.csv\n",
             "the best run's override 'data.path=s3://bob:***@bucket/x.csv' was logged with a secret masked"),
            ("flag", run_params, "model=fourier\n--config-dir=/elsewhere\n",
             "the best run's config/overrides.txt holds '--config-dir=/elsewhere', which no run's overrides hold")):
        created = client.create_experiment(experiment, artifact_location=(tmp_path / experiment).as_uri())
        run = client.create_run(created, run_name="chosen").info.run_id
        for key, value in params.items():
            client.log_param(run, key, value)
        if overrides:
            client.log_text(run, overrides, "config/overrides.txt")
        client.log_metric(run, "rmse_validation", 1.0)
        client.set_terminated(run, "FINISHED")
        with pytest.raises(SystemExit) as exited:
            main(["--store", store, "--experiment", experiment, "--best", "--register", "x", "--refit"])
        stderr = capsys.readouterr().err
        assert exited.value.code == 2 and len(stderr.splitlines()) == 1, stderr
        assert stderr.startswith(f"tamrun: config error: --refit='chosen': {problem}")
        assert "Fix: register it without --refit" in stderr or "Fix: run its config again by hand" in stderr
    assert not client.search_registered_models()


def test_refit_is_refused_in_another_mode(compose_cfg):
    from tamrun.config.load import typed_config
    from tamrun.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        typed_config(compose_cfg("mode=adaptive", "split.refit=true"))
    assert refused.value.field == "split.refit" and "only mode=run refits" in refused.value.problem


def test_the_intervals_plot_has_a_panel_per_group_its_bands_shaded(refitted, tmp_path):
    _, _, client, _, refit, _ = refitted
    test = predictions(client, refit, tmp_path)
    test = test[test["split"] == "test"]
    figure = interval_figure(test, "predicted")
    *panels, months = figure.axes
    assert [axis.get_title() for axis in panels] == ["group 0", "group 1", "group 2"]
    assert "coverage per month" in months.get_title() and "not drawn" not in figure.get_suptitle()
    for axis in panels:
        assert len(axis.collections) == 2  # the 95 % and 80 % bands, one shade each
        dates = axis.lines[0].get_xdata()
        assert np.all(np.diff(pd.to_datetime(dates).to_numpy()) > np.timedelta64(0))  # one line per group, in date order
    capped = interval_figure(test, "predicted", most=2)
    assert [axis.get_title() for axis in capped.axes[:-1]] == ["group 0", "group 1"]
    assert "(1 more group(s) not drawn)" in capped.get_suptitle()


def test_the_intervals_plot_draws_the_first_groups_of_many():
    sites = hourly_sites(sites=6, start="2023-01-01", end="2023-01-10")
    rows = pd.DataFrame({"date": sites["date"].dt.tz_localize(None), "group": sites["site"], "actual": sites["load"],
                         "predicted": sites.groupby("site")["load"].transform(lambda s: s.rolling(3, 1).mean())})
    rows = rows.assign(lower_80=rows["predicted"] - 5, upper_80=rows["predicted"] + 5)
    figure = interval_figure(rows.sort_values("date", kind="stable"), "predicted")
    assert [axis.get_title() for axis in figure.axes[:-1]] == [f"group site_{i}" for i in range(1, INTERVAL_PANELS + 1)]
    assert f"({6 - INTERVAL_PANELS} more group(s) not drawn)" in figure.get_suptitle()


def test_a_backtest_sweeps_best_run_is_refitted_through_its_windows_days_and_registered(tmp_path):
    """mode=backtest chooses; --refit trains mode=run through the last window's horizon, the windows' days held
    out as the validation period (their residuals calibrate the intervals), and registers that run."""
    csv = tmp_path / "sites.csv"
    hourly_sites(sites=2, start="2021-01-01", end="2022-02-28").pipe(lambda f: f.assign(date=f["date"].map(
        lambda t: t.isoformat()))).to_csv(csv, index=False)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ("data=csv", f"data.path={csv}", "data.target=load", "data.group=site", "model=calendar",
              "data.holidays=FR", "data.timezone=Europe/Paris", "tracking.log_plots=false", "progress=off")
    sweep = tamrun("-m", *common, "mode=backtest", "backtest.windows=4", "split.test_start=2021-12-01",
                   "model.effects.weekly.ap=-3,3", cwd=tmp_path, store=store)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    done = tamrun("--store", store, "--sweep", "last", "--best", "--register", NAME, "--refit", cwd=tmp_path,
                  store=store, module="tamrun.compare")
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(store)
    best_id = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("run_id: "))
    best = client.get_run(best_id)
    assert best.data.params["mode.name"] == "backtest" and best.data.params["backtest.windows"] == "4"
    (refit,) = client.search_runs([best.info.experiment_id], f"tags.refit_of = '{best_id}'")
    params = refit.data.params
    # 4 weekly windows from 2021-12-01: the last horizon ends on 2021-12-28 (inclusive)
    assert (params["mode.name"], params["split.validation_start"], params["split.train_end"],
            params["split.test_start"]) == ("run", "2021-12-01", "2021-12-28", "2021-12-29")
    assert params["model.effects.weekly.ap"] == best.data.params["model.effects.weekly.ap"]
    assert refit.info.status == "FINISHED" and np.isfinite(refit.data.metrics["rmse_test"])
    (version,) = client.search_model_versions(f"name = '{NAME}'")
    assert version.run_id == refit.info.run_id
