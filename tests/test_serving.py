"""The logged model served the MLflow way (`mlflow models serve`, a real HTTP server on 127.0.0.1): from
this environment, and from the environment MLflow's virtualenv manager builds from nothing but the model's
own requirements.txt (tamrun installed there from the one wheel logged with the model, pinned by its sha256).
Rows of the national
table as the user has them, dates as text, sent as CSV and as JSON; the answer is a table (date, group,
prediction and its intervals) equal to the run's own test predictions (float64, to 1e-8 relative)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from tamrun.data.load import embedded_path
from tamrun.runner import run

from servers import model_server

DAYS = "2024-01-0"  # the rows of 2024-01-01 .. 2024-01-09: 432 half-hours of the test year
ENV_BUILD_TIMEOUT_S = 1500  # pip installing the model's requirements (torch from the local wheel) on 2 cores
BANDS = ["lower_80", "upper_80", "lower_95", "upper_95"]  # intervals.levels' default [0.8, 0.95]


@pytest.fixture(scope="module")
def national(tmp_path_factory):
    """A default run (fourier on the embedded national data, recorded with its model) and the rows to
    serve, read as text."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tamrun.config.load import config_dir
    from tamrun.config.store import register_configs

    folder = tmp_path_factory.mktemp("serving")
    store = f"sqlite:///{folder / 'mlflow.db'}"
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"tracking.uri={store}", "tracking.log_plots=false",
                                                       "progress=off"])
    GlobalHydra.instance().clear()
    result = run(cfg)
    rows = pd.read_csv(embedded_path(), dtype={"date": str})  # the file as it is: dates are text
    rows = rows[rows["date"].str.startswith(DAYS)].reset_index(drop=True)
    rows = rows.assign(**run_inputs(cfg, rows))
    test = result.predictions[result.predictions["split"] == "test"].set_index(["date", "group"])[["predicted", *BANDS]]
    expected = test.loc[list(zip(pd.to_datetime(rows["date"]), rows["tod"]))].to_numpy()
    client = mlflow.MlflowClient(tracking_uri=store)
    (logged,) = client.search_logged_models([client.get_run(result.run_id).info.experiment_id])
    model = mlflow.artifacts.download_artifacts(artifact_uri=logged.artifact_location, dst_path=str(folder / "model"))
    return {"store": store, "run_id": result.run_id, "rows": rows, "expected": expected, "model": model,
            "folder": folder}


def run_inputs(cfg, rows: pd.DataFrame) -> dict:
    """The columns the run derived (conf/derived/national.yaml) for ``rows``' dates, in place of the file's made
    copies: served rows carry the inputs the run read (a smoothed temperature is given, not rebuilt from the
    few rows sent)."""
    from tamrun.config.load import typed_config
    from tamrun.pipeline import load_splits

    config, specs = typed_config(cfg)
    test = load_splits(config, specs).test.set_index(config.data.date_column)
    dates = pd.to_datetime(rows["date"])
    return {name: test.loc[dates, name].to_numpy() for name in config.data.derived if name in rows.columns}


def invoke(url: str, body: bytes, content_type: str) -> pd.DataFrame:
    """POST ``body`` to the server's /invocations; its predictions as a table."""
    request = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return pd.DataFrame(json.loads(answer.read())["predictions"])
    except urllib.error.HTTPError as refused:
        raise AssertionError(f"{refused}: {refused.read().decode()[:3000]}") from None


def refused(url: str, rows: pd.DataFrame, content_type: str) -> str:
    """POST ``rows`` (as CSV or as JSON's dataframe_split) to /invocations, expecting HTTP 400; the ``tamrun:``
    line of its message (MLflow prefixes the rows it was given)."""
    body = (rows.to_csv(index=False) if content_type == "text/csv" else
            json.dumps({"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}))
    request = urllib.request.Request(f"{url}/invocations", data=body.encode(), headers={"Content-Type": content_type})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=300)
    assert answer.value.code == 400
    error = json.loads(answer.value.read())
    assert error["error_code"] == "INVALID_PARAMETER_VALUE", error
    (line,) = [line for line in error["message"].splitlines() if "tamrun: " in line]
    return line[line.index("tamrun: "):]


def check_refused(url: str, national: dict) -> None:
    """Rows a run would not forecast from, as CSV and as JSON: HTTP 400 with the one line naming the column
    and the rows (issue 58: before, NaN and null were answered 200 with NaN forecasts, 1e12 with a forecast)."""
    rows = national["rows"].head(6)
    column = "temperature_smooth_950"
    missing = rows.assign(**{column: pd.Series([1.0, None, 2.0, 3.0, None, 4.0], dtype=object)})
    far = rows.assign(**{column: [1e12, *rows[column][1:]]})
    for content_type in ("text/csv", "application/json"):  # a CSV's empty cell; JSON's null
        assert refused(url, missing, content_type).startswith(
            f"tamrun: data error: {column}=nan: 2 of the 6 rows to predict (rows 1, 4; counted from 0) have no value")
        message = refused(url, far, content_type)
        assert message.startswith(f"tamrun: data error: {column}=1000000000000.0: 1 of the 6 rows to predict (row 0; "
                                  f"counted from 0) lie far outside the training range of {column}"), message
        text = refused(url, rows.assign(**{column: "warm"}).head(3), content_type)
        assert text.startswith(f"tamrun: data error: {column}='warm': 3 value(s)"), text


def check_served(url: str, national: dict) -> None:
    """CSV and JSON (dataframe_split, dates as text) give the run's predictions, with their date and group."""
    rows = national["rows"]
    as_csv = invoke(url, rows.to_csv(index=False).encode(), "text/csv")
    as_json = invoke(url, json.dumps({"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}
                                     ).encode(), "application/json")
    for served in (as_csv, as_json):
        assert list(served.columns) == ["date", "tod", "predicted", *BANDS]
        assert served["date"].tolist() == rows["date"].tolist() and served["tod"].tolist() == rows["tod"].tolist()
        # another process's BLAS may sum in another order: 1e-8 relative (5e-4 MW on 50,000 MW)
        np.testing.assert_allclose(served[["predicted", *BANDS]].to_numpy(), national["expected"], rtol=1e-8, atol=0)


def test_the_run_s_model_serves_csv_and_json_rows_with_dates_as_text(national, tmp_path):
    """`mlflow models serve -m runs:/<id>/model` in this environment."""
    env = {"MLFLOW_TRACKING_URI": national["store"], "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    with model_server(sys.executable, f"runs:/{national['run_id']}/model", tmp_path / "serve.log", env) as url:
        check_served(url, national)
        check_refused(url, national)


def test_the_loaded_model_reads_dates_parsed_as_datetimes_or_as_text(national, monkeypatch):
    """``mlflow.pyfunc.load_model(...).predict(df)`` with the date as pandas parses it (datetime64) or as the
    file has it (text): the run's predictions both ways (issue 58: the datetime column failed MLflow's schema)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", national["store"])  # the store its files are checked against
    model = mlflow.pyfunc.load_model(national["model"])
    rows = national["rows"]
    for given in (rows.assign(date=pd.to_datetime(rows["date"])), rows):
        served = model.predict(given)
        assert served["date"].tolist() == given["date"].tolist()
        np.testing.assert_allclose(served[["predicted", *BANDS]].to_numpy(), national["expected"], rtol=1e-8, atol=0)


@pytest.mark.index
def test_the_model_serves_from_the_environment_mlflow_builds_from_its_own_requirements(national, tmp_path):
    """`mlflow models serve --env-manager virtualenv`: MLflow makes a new virtual environment (its root in
    MLFLOW_ENV_ROOT) and pip installs the model's requirements.txt there from the indexes pip's own
    configuration names (the requirements name none; an unreachable one is tried once, PIP_RETRIES=0),
    tamrun from the model's own wheel (its sha256 pinned), and the model serves the same predictions, its
    files checked against the store first."""
    listed = (Path(national["model"]) / "requirements.txt").read_text().splitlines()
    assert not [line for line in listed if line.startswith("-")]  # the default index (pip's config) alone
    (wheel,) = [line for line in listed if "tamrun" in line]
    assert wheel.startswith("file:tamrun-") and "-py3-none-any.whl#sha256=" in wheel
    envs = tmp_path / "envs"
    env = {"MLFLOW_ENV_ROOT": str(envs), "PIP_RETRIES": "0", "MLFLOW_TRACKING_URI": national["store"]}
    with model_server(sys.executable, national["model"], tmp_path / "serve.log", env, env_manager="virtualenv",
                      deadline_s=ENV_BUILD_TIMEOUT_S) as url:
        check_served(url, national)
    (python,) = envs.glob("*/bin/python")  # the one environment MLflow built for the model
    alone = subprocess.run([str(python), "-c", "import tamrun; print(tamrun.__file__)"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path, env={k: v for k, v in os.environ.items()
                                                                    if k != "PYTHONPATH"})
    assert alone.stdout.startswith(str(envs)), alone.stderr  # installed in the model's environment, from its wheel
