"""What a run leaves in MLflow besides metrics: the pyfunc model and the plots."""

from __future__ import annotations

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.image import imread
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tamrun.config.load import typed_config
from tamrun.fit.partial import partial_effect_curves
from tamrun.pipeline import load_splits
from tamrun.runner import run
from tamrun.tracking.artifacts.plots import (box_statistics, line_envelope, residual_period, residuals_by_period_figure)

from conftest import csv_overrides

PLOTS = {"forecast", "partial_effects", "residuals_by_time_of_day", "memory_timeline", "cg_residuals", "intervals"}
BANDS = ["lower_80", "upper_80", "lower_95", "upper_95"]  # intervals.levels' default [0.8, 0.95]


@pytest.fixture(scope="module")
def cg_run(tmp_path_factory):
    """One CG run on the synthetic CSV with a validation split, recorded in its own store."""
    from conftest import synthetic_frame
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tamrun.config.load import config_dir
    from tamrun.config.store import register_configs

    folder = tmp_path_factory.mktemp("artifacts")
    csv = folder / "synthetic.csv"
    synthetic_frame().to_csv(csv, index=False)
    store = f"sqlite:///{folder / 'mlflow.db'}"
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"tracking.uri={store}", *csv_overrides(csv), "solver=cg",
                                                       "solver.preconditioner=jacobi",
                                                       "split.validation_start=2020-12-01"])
    GlobalHydra.instance().clear()
    return run(cfg), cfg, store, folder


def test_the_pyfunc_model_predicts_what_the_run_predicted(cg_run):
    result, cfg, store, folder = cg_run
    client = MlflowClient(tracking_uri=store)
    logged = client.search_logged_models([client.get_run(result.run_id).info.experiment_id])
    assert [m.source_run_id for m in logged] == [result.run_id] and logged[0].status.name == "READY"
    loaded = mlflow.pyfunc.load_model(logged[0].artifact_location)
    # no input schema (MLflow's refuses a datetime date or a CSV request: pyfunc_model's doc); the example lists the columns
    assert loaded.metadata.get_input_schema() is None
    example = loaded.metadata.load_input_example(logged[0].artifact_location.removeprefix("file://"))
    assert list(example.columns) == ["g", "x", "dow"]
    config, specs = typed_config(cfg)
    test_frame = load_splits(config, specs).test
    shuffled = test_frame.sample(frac=1.0, random_state=0)  # any row order: output follows the input
    predicted = loaded.predict(shuffled[["g", "x", "dow"]])
    expected = (result.predictions[result.predictions["split"] == "test"]
                .set_index(["date", "group"])[["predicted", *BANDS]])
    in_process = expected.loc[list(zip(shuffled["date"], shuffled["g"]))].to_numpy()
    assert len(predicted) == len(shuffled) == 24 * 34  # 2021-01-01 .. 2021-02-03
    # the group as given (no date given), the prediction and its intervals
    assert list(predicted.columns) == ["g", "predicted", *BANDS]
    assert predicted["g"].tolist() == shuffled["g"].tolist()
    assert np.max(np.abs(predicted[["predicted", *BANDS]].to_numpy() - in_process)) <= 1e-9
    with pytest.raises(MlflowException, match="^tamrun: data error: dow=9: "):
        loaded.predict(shuffled[["g", "x", "dow"]].assign(dow=9))  # a level never seen in training


def test_every_plot_is_logged_and_readable(cg_run):
    result, _, store, folder = cg_run
    client = MlflowClient(tracking_uri=store)
    logged = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert logged == {f"plots/{name}.png" for name in PLOTS}
    for name in PLOTS:
        image = imread(client.download_artifacts(result.run_id, f"plots/{name}.png", str(folder)))
        assert image.shape[0] >= 300 and image.shape[1] >= 600 and image.std() > 0.01  # drawn, not blank
    assert result.metrics["rmse_validation"] < 0.15  # noise sd 0.1; the validation month was not fitted


def test_partial_effects_recover_the_true_curve():
    """y = 5 + 2 sin(x) + 0.3 dow + 0.5 g + N(0, 0.1^2): in every group g the spline's partial effect is
    2 sin(x) up to a constant (tolerance: about 4 standard errors of the fit) and dow's steps are 0.3."""
    from conftest import synthetic_frame
    from tamrun.config.effects import parse_effects
    from tamrun.config.schema import Config
    from tamrun.data.derive import DataRecipe
    from tamrun.device.manager import DeviceManager
    from tamrun.memory.guard import ChunkLoop, OomLog
    from tamrun.machine.tracker import MemoryTracker
    from tamrun.pipeline import build_features, plan_memory, solve

    config = Config()
    config.data.group, config.data.target = "g", "y"
    config.model.name = "t"
    specs = parse_effects({"sx": {"kind": "spline", "column": "x", "k": 12, "ap": -8},
                           "dow": {"kind": "categorical", "column": "dow", "ap": -8}})
    features = build_features(config, specs, synthetic_frame(days=240))
    devices = DeviceManager.from_config(config.hw, torch.float64)
    loop = ChunkLoop(config.memory.oom, OomLog(), MemoryTracker(None, config.memory.overhead_factor))
    recipe = DataRecipe({}, "date", "y", "g", None)
    fit = solve(config, features, plan_memory(config, features, devices), devices, loop, recipe)
    curves = {c["name"]: c for c in partial_effect_curves(fit.model, fit.train, points=50)}
    spline = curves["sx"]
    truth = 2 * np.sin(spline["grid"])
    centred = spline["values"] - spline["values"].mean(axis=1, keepdims=True)
    assert spline["values"].shape == (3, 50)
    assert np.max(np.abs(centred - (truth - truth.mean()))) < 0.05
    assert curves["dow"]["discrete"] and list(curves["dow"]["grid"]) == list(range(7))
    np.testing.assert_allclose(np.diff(curves["dow"]["values"], axis=1), 0.3, atol=0.03)  # 0.3 per day


@pytest.mark.parametrize("freq,periods,period,boxes", [
    ("30min", 48 * 14, "time_of_day", 48),  # half-hourly: one box per half-hour
    ("D", 60, "day_of_week", 7),            # daily: one box per weekday, not a single box at 0 h
    ("W", 60, "month", 12),                 # weekly: one box per month
])
def test_the_residual_plot_follows_the_spacing_of_the_dates(freq, periods, period, boxes):
    dates = pd.date_range("2021-01-01", periods=periods, freq=freq)
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"date": np.repeat(dates, 2), "group": np.tile([0, 1], len(dates)), "split": "test",
                          "actual": rng.normal(size=2 * len(dates)), "predicted": 0.0})
    assert residual_period(table["date"]) == period
    assert residual_period(table["date"].drop(index=[4, 5, 6, 7])) == period  # a gap does not change it
    axis = residuals_by_period_figure(table, period).axes[0]
    assert period.replace("_", " ") in axis.get_title()
    assert len([line for line in axis.get_lines() if line.get_label() == "mean"][0].get_xdata()) == boxes


def test_the_model_records_this_environments_versions_and_keeps_mlflows_check_in_place(cg_run):
    """The model's requirements pin what is installed (so MLflow's environment check, skipped while saving,
    could not fail), and the check is MLflow's own again afterwards."""
    from importlib.metadata import version

    from mlflow.utils import environment

    from tamrun.tracking.pyfunc_model import installed_requirements_trusted

    result, _, store, folder = cg_run
    client = MlflowClient(tracking_uri=store)
    logged = client.search_logged_models([client.get_run(result.run_id).info.experiment_id])[0]
    requirements = mlflow.pyfunc.get_model_dependencies(logged.artifact_location)
    pins = dict(line.strip().split("==") for line in open(requirements) if "==" in line)
    for package in ("torch", "mlflow", "pandas", "safetensors"):
        assert pins[package] == version(package).split("+")[0], (package, pins)
    original = environment.warn_dependency_requirement_mismatches
    with installed_requirements_trusted():
        assert environment.warn_dependency_requirement_mismatches is not original
    assert environment.warn_dependency_requirement_mismatches is original
    with pytest.raises(RuntimeError), installed_requirements_trusted():
        raise RuntimeError("restored on an error too")
    assert environment.warn_dependency_requirement_mismatches is original


@pytest.mark.parametrize("n,slices", [(10, 4), (17520, 1200), (1001, 250), (5000, 7)])
def test_a_long_line_is_drawn_from_its_envelope(n, slices):
    """Every slice of consecutive points keeps its first, lowest, highest and last point (exact against
    a loop over the slices); a line of at most 4 points per slice is kept whole."""
    rng = np.random.default_rng(n)
    values = rng.normal(size=n).cumsum()
    values[n // 3] = np.nan  # a gap is never a slice's extreme
    kept = line_envelope(values, slices)
    if n <= 4 * slices:
        assert kept.tolist() == list(range(n))
        return
    run = -(-n // slices)
    expected = set()
    for start in range(0, n, run):
        part = values[start:start + run]
        expected |= {start, start + int(np.nanargmin(part)), start + int(np.nanargmax(part)),
                     start + len(part) - 1}
    assert kept.tolist() == sorted(expected)
    assert len(kept) <= 4 * -(-n // run)


def test_the_residual_boxes_are_the_usual_box_plot_statistics():
    """Quartiles, whiskers at the furthest points within 1.5 IQR, and the mean, against float64 numpy
    and against matplotlib's own box-plot statistics (tolerance 1e-12)."""
    from matplotlib.cbook import boxplot_stats

    rng = np.random.default_rng(3)
    samples = [rng.standard_t(3, size=size) for size in (5, 40, 1000)]
    stats = box_statistics(samples)
    for at, sample in enumerate(samples):
        reference = boxplot_stats(sample, whis=1.5)[0]
        np.testing.assert_allclose([stats[key][at] for key in ("q1", "median", "q3", "low", "high", "mean")],
                                   [reference[key] for key in ("q1", "med", "q3", "whislo", "whishi", "mean")],
                                   rtol=0, atol=1e-12)


def test_the_best_run_is_registered_with_an_alias_that_loads_its_model(cg_run, monkeypatch):
    """`python -m tamrun.compare --best --register NAME` on a real store: version 1 of NAME from the run's
    LoggedModel, NAME@champion pointing at it and loading a model that predicts what the run did;
    registering again adds no version."""
    import subprocess
    import sys

    result, cfg, store, folder = cg_run
    command = [sys.executable, "-m", "tamrun.compare", "--store", store, "--best", "--register", "load-forecast"]
    elsewhere = folder / "elsewhere"  # a working directory apart from the store's
    elsewhere.mkdir()
    done = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"run_id: {result.run_id}" in done.stdout
    assert "registered: load-forecast version 1, alias load-forecast@champion" in done.stdout
    again = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "load-forecast version 1," in again.stdout, again.stdout + again.stderr
    client = MlflowClient(tracking_uri=store)
    version = client.get_model_version_by_alias("load-forecast", "champion")
    assert str(version.version) == "1" and version.run_id == result.run_id
    assert len(client.search_model_versions("name = 'load-forecast'")) == 1
    assert not list(elsewhere.iterdir())  # no default store made where the command ran
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    loaded = mlflow.pyfunc.load_model("models:/load-forecast@champion")
    config, specs = typed_config(cfg)
    test_frame = load_splits(config, specs).test
    expected = result.predictions[result.predictions["split"] == "test"].set_index(["date", "group"])["predicted"]
    in_process = expected.loc[list(zip(test_frame["date"], test_frame["g"]))].to_numpy()
    np.testing.assert_allclose(loaded.predict(test_frame[["g", "x", "dow"]])["predicted"], in_process, rtol=1e-8,
                               atol=1e-9)


def test_a_source_checkout_not_installed_declares_the_pyprojects_dependencies(monkeypatch):
    """tamrun on PYTHONPATH without being installed (no metadata: a GPU machine without a package index)
    still logs a model: its dependencies are read from the pyproject.toml beside the package."""
    import importlib.metadata as metadata
    import tomllib
    from pathlib import Path

    import tamrun
    from tamrun.tracking.pyfunc_model import declared_dependencies, requirements

    declared = tomllib.loads((Path(tamrun.__file__).parent.parent / "pyproject.toml").read_text())["project"]

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "requires", not_installed)
    assert declared_dependencies() == declared["dependencies"]
    pins = requirements()
    assert any(pin.startswith("torch==") for pin in pins) and any(pin.startswith("mlflow==") for pin in pins)
    assert any(pin.startswith("numpy==") for pin in pins)
