"""Where a run goes, as MLflow's own convention says (issue 35): ``MLFLOW_TRACKING_URI``, when set and
``tracking.uri`` is not given, is the run's store; ``tracking.uri`` wins over it; and every run's last
line names the store it wrote to. Real ``python -m tamrun`` processes and real sqlite stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

from mlflow.tracking import MlflowClient

from conftest import csv_overrides

QUICK = ["tracking.log_plots=false", "tracking.log_model=false"]


def tamrun(*args: str, cwd: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_TRACKING"))}
    return subprocess.run([sys.executable, "-m", "tamrun", *args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, **env}, timeout=300)


def only_run(db: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (logged,) = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])
    return logged


def test_mlflow_tracking_uri_is_where_the_run_goes_and_its_last_line_says_so(tmp_path, csv_path):
    store = tmp_path / "team" / "mlflow.db"
    done = tamrun(*csv_overrides(csv_path), *QUICK, cwd=tmp_path, env={"MLFLOW_TRACKING_URI": f"sqlite:///{store}"})
    assert done.returncode == 0, done.stdout + done.stderr
    logged = only_run(store)
    assert logged.info.status == "FINISHED"
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # not the default store
    last = done.stdout.strip().splitlines()[-1]
    experiment = logged.info.experiment_id
    folder = next(p for p in (tmp_path / "outputs").rglob("*") if p.is_dir() and (p / ".hydra").is_dir())
    rmse = logged.data.metrics["rmse_test"]
    assert last.endswith(f"run '{logged.info.run_name}' FINISHED, rmse_test={rmse:.4g}: "
                         f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{logged.info.run_id} "
                         f"(MLflow run {logged.info.run_id} in sqlite:///{store}, experiment 'tamrun'; "
                         f"folder {folder.relative_to(tmp_path)})"), last


def test_tracking_uri_wins_over_the_environment(tmp_path, csv_path):
    chosen, ignored = tmp_path / "chosen.db", tmp_path / "ignored.db"
    done = tamrun(*csv_overrides(csv_path), *QUICK, f"tracking.uri=sqlite:///{chosen}", cwd=tmp_path,
                  env={"MLFLOW_TRACKING_URI": f"sqlite:///{ignored}"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert only_run(chosen).info.status == "FINISHED" and not ignored.exists()


def test_a_failed_run_names_its_store_before_the_error_line(tmp_path, csv_path):
    """An empty MLFLOW_TRACKING_URI is unset: the default store. The run's last line comes before the
    command's own (the error), on the console and in the job's log."""
    done = tamrun(*csv_overrides(csv_path), *QUICK, "model.effects.sx.column=nope", cwd=tmp_path,
                  env={"MLFLOW_TRACKING_URI": " "})
    assert done.returncode == 2, done.stdout + done.stderr
    store = tmp_path / "outputs" / "mlflow.db"
    logged = only_run(store)
    assert logged.info.status == "FAILED"
    (log,) = (tmp_path / "outputs").glob("*/*/tamrun.log")
    ran = (f"run '{logged.info.run_name}' FAILED: http://127.0.0.1:5000/#/experiments/{logged.info.experiment_id}"
           f"/runs/{logged.info.run_id} (MLflow run {logged.info.run_id} in sqlite:///{store}, experiment 'tamrun'; "
           f"folder {log.parent.relative_to(tmp_path)})")  # no metric: it logged none
    assert done.stdout.strip().splitlines()[-1].endswith(ran), done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("tamrun: data error: model.effects.sx.column='nope'")
    assert log.read_text().strip().splitlines()[-1].endswith(ran)


def test_a_bad_uri_in_the_environment_is_named_by_its_variable(tmp_path):
    """The user never wrote tracking.uri: the message names MLFLOW_TRACKING_URI."""
    done = tamrun("mode=run", "tracking.log_model=false", cwd=tmp_path,
                  env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    assert ("tamrun: config error: MLFLOW_TRACKING_URI='http://127.0.0.1:9': the tracking server 127.0.0.1:9 does not "
            "answer within tracking.connect_timeout_s=5 s") in done.stderr, done.stderr
    assert "(the URI is the environment variable MLFLOW_TRACKING_URI's: change or unset it, or set tracking.uri)" \
        in done.stderr
    unwritable = tamrun("tracking.log_model=false", cwd=tmp_path,
                        env={"MLFLOW_TRACKING_URI": "sqlite:////proc/forbidden/mlflow.db"})
    assert unwritable.returncode == 2, unwritable.stderr
    assert ("tamrun: filesystem error: /proc/forbidden: cannot be created ([Errno 2] No such file or directory; the "
            "MLflow store, MLFLOW_TRACKING_URI). Fix: point MLFLOW_TRACKING_URI at a store in a writable folder") \
        in unwritable.stderr, unwritable.stderr
