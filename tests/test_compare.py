"""`python -m tamrun.compare` on stores written here with MLflow's client (fast; the CLI's own runs, a
sweep and the browser: tests/test_compare_ui.py): the columns, an older run's peak, the objective column,
and the refusals (exit code 2, one line)."""

from __future__ import annotations

import subprocess
import sys

from mlflow import MlflowClient


def compare(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tamrun.compare", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_table_shows_the_objective_and_an_older_runs_peak_in_mib(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    experiment = client.create_experiment("tamrun")
    older = client.create_run(experiment, run_name="fourier-national", tags={"device": "cpu"}).info.run_id
    for key, value in {"rmse_test": 1655.2345, "mape_test": 2.04056, "fit_seconds": 0.41234,
                       "peak_memory_bytes": 3 * 2**20}.items():
        client.log_metric(older, key, value)
    client.log_param(older, "route", "cg")
    newer = client.create_run(experiment, run_name="fourier-national split.validation_start=2023-01-01").info.run_id
    client.log_metric(newer, "rmse_validation", 0.123456)
    done = compare("--store", store, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header, first, second = [line for line in done.stdout.splitlines() if line.startswith(("name", "fourier"))]
    assert header.split()[:4] == ["name", "status", "rmse_validation", "rmse_test"]  # the objective first
    assert first.split()[2:4] == ["RUNNING", "0.1235"]
    assert second.split()[2:10] == ["-", "1655", "2.041", "0.4123", "3", "cg", "cpu", "-"]


def test_a_missing_store_a_missing_experiment_and_no_count_exit_2(tmp_path):
    missing = compare(cwd=tmp_path)  # the default store: ./outputs/mlflow.db, not created
    assert missing.returncode == 2 and missing.stderr.startswith("tamrun: config error: --store=")
    assert "no MLflow store at" in missing.stderr and not (tmp_path / "outputs").exists()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(store).create_experiment("other")
    for args, field in ((["--experiment", "tamrun"], "--experiment='tamrun'"), (["-n", "0"], "--last=0")):
        done = compare("--store", store, *args, cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and field in done.stderr, done.stderr
