"""What a user finds in MLflow after a sweep on the embedded data: runs told apart by name, their data,
source and model recorded the MLflow way, the runs table's view, and a logged model that predicts
from the raw table by itself. The CLI in a subprocess, a real sqlite store, MLflow's own loaders."""

from __future__ import annotations

import json

import mlflow.pyfunc
import numpy as np
import pandas as pd

from tamrun.config.load import typed_config
from tamrun.config.schema import HISTORY_KINDS
from tamrun.data.calendar import Calendar
from tamrun.data.derive import add_derived_columns
from tamrun.data.load import embedded_path
from tamrun.tracking.ui_view import RUNS_VIEW_TAG

from test_cli import tamrun
from test_sweeps import sweep_runs

SOURCE_TAGS = {"mlflow.source.name": "python -m tamrun", "mlflow.source.type": "LOCAL"}


def raw_rows_2024(compose_cfg) -> pd.DataFrame:
    """The embedded table's 2024 rows as a raw table holds them (the date as text, the temperature) with the
    columns a run derives from earlier rows, as it derives them (the lags of Load, the smoothed temperatures
    since 2013): a served model keeps the last rows of its table for the days after it, not the past of every
    day inside it (docs/serving.md). The time of day, the calendar and the holidays the model derives itself."""
    data = typed_config(compose_cfg("model=spline"))[0].data
    table = pd.read_csv(embedded_path(), usecols=["date", "Load", "temperature"])
    dates = pd.to_datetime(table["date"])
    derived = add_derived_columns(table.assign(date=dates), data.derived, "date", None, Calendar.of(data, dates),
                                  data.group)
    history = [name for name, spec in data.derived.items() if spec.kind in HISTORY_KINDS]
    assert history == ["Load_d1", "Load_d7", "temperature_smooth_950", "temperature_smooth_990",
                       "temperature_max_smooth_990", "temperature_min_smooth_950"], history
    in_2024 = table["date"].str.startswith("2024")
    return pd.concat([table.loc[in_2024, ["date", "temperature"]], derived.loc[in_2024, history]], axis=1)


def test_a_two_job_sweep_is_comparable_and_its_models_predict_from_raw_rows(tmp_path, monkeypatch, compose_cfg):
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    done = tamrun("-m", "model=fourier,spline", f"tracking.uri={store}", f"hydra.sweep.dir={sweep_dir}",
                  "tracking.log_plots=false", "progress=off", cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "CloudPickle" not in output  # the model is logged from code, nothing pickled by MLflow
    client, parent, children = sweep_runs(store, sweep_dir)
    assert [c.info.run_name for c in children] == ["fourier", "spline"]  # named by the swept value

    view = json.loads(client.get_experiment(parent.info.experiment_id).tags[RUNS_VIEW_TAG])
    assert {"metrics.`rmse_test`", "metrics.`fit_seconds`", "params.`route`", "tags.`sweep.model`"} <= set(
        view["selectedColumns"])

    rows_2024 = raw_rows_2024(compose_cfg)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # what models:/ URIs resolve against
    for child in children:
        assert child.info.status == "FINISHED"
        assert SOURCE_TAGS.items() <= child.data.tags.items() and child.data.tags.get("mlflow.user")
        contexts = {i.tags[0].value: i.dataset for i in child.inputs.dataset_inputs}
        assert set(contexts) == {"training", "testing"} and {d.name for d in contexts.values()} == {"national"}
        models = client.search_logged_models([child.info.experiment_id],
                                             filter_string=f"source_run_id = '{child.info.run_id}'")
        assert len(models) == 1 and models[0].status.name == "READY"
        assert models[0].name == "model"  # runs:/<run id>/model loads it
        predicted = mlflow.pyfunc.load_model(f"runs:/{child.info.run_id}/model").predict(rows_2024)
        assert list(predicted.columns) == ["date", "tod", "predicted", "lower_80", "upper_80", "lower_95", "upper_95"]
        assert predicted["date"].tolist() == rows_2024["date"].tolist()

        logged = pd.read_parquet(client.download_artifacts(child.info.run_id, "predictions/predictions.parquet",
                                                           str(tmp_path)))
        test = logged[logged["split"] == "test"].set_index(["date", "group"])["predicted"]
        expected = test.loc[list(zip(pd.to_datetime(rows_2024["date"]), predicted["tod"]))].to_numpy()  # derived tod
        assert len(predicted) == len(expected) == 17_568
        # the same model, design and coefficients in float64: equal to 1e-8 relative (5e-4 MW on loads of
        # about 50,000 MW; another process's BLAS may sum in another order: 7e-10 relative seen once)
        np.testing.assert_allclose(predicted["predicted"].to_numpy(), expected, rtol=1e-8, atol=0)
