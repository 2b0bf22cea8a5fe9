"""Crashes and signals on real runs and a real sqlite store: an exception anywhere leaves the run
FAILED with the error as a tag and the log as an artifact; SIGINT/SIGTERM end it KILLED and the
process exits promptly; SIGKILL mid-fit leaves the store readable and the next run works."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import tamrun.jobs.record
import tamrun.pipeline
import tamrun.solve.dispatcher
from tamrun.runner import run

from conftest import csv_overrides

# A CG fit that cannot converge (tolerance far below float64's reach) and may iterate for long:
# it is still fitting when the signal arrives.
ENDLESS_FIT = ["solver=cg", "solver.preconditioner=jacobi", "solver.tol=1e-300", "solver.max_iter=100000000"]


def _raise_injected(*args, **kwargs):
    raise RuntimeError("injected fault (raised on purpose by the test)")


@pytest.mark.parametrize("target", [(tamrun.pipeline, "load_table"), (tamrun.solve.dispatcher.Dispatcher, "fit"),
                                    (tamrun.jobs.record, "log_run_plots")], ids=["data", "solve", "artifacts"])
def test_an_exception_anywhere_leaves_the_run_failed_with_error_and_log(compose_cfg, store_uri, csv_path, tmp_path,
                                                                     monkeypatch, target):
    """A RuntimeError raised on purpose in the data phase, in the solver, or while logging artifacts."""
    monkeypatch.setattr(*target, _raise_injected)
    with pytest.raises(RuntimeError, match="injected fault"):
        run(compose_cfg(*csv_overrides(csv_path)))
    client = MlflowClient(tracking_uri=store_uri)
    (logged,) = client.search_runs(["1"])
    assert logged.info.status == "FAILED"
    assert logged.data.tags["error_type"] == "RuntimeError"
    assert "injected fault" in logged.data.tags["error"]
    text = Path(client.download_artifacts(logged.info.run_id, "logs/run.log", str(tmp_path))).read_text()
    assert "Traceback" in text and "injected fault" in text
    assert "MLflow run" in text  # the run's own INFO lines are in the log too


def _start_endless_run(tmp_path: Path, csv_path: Path, store: str) -> tuple:
    """``python -m tamrun`` on an endless CG fit; returns (process, stdout file) once it is fitting."""
    out = tmp_path / "stdout.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    proc = subprocess.Popen([sys.executable, "-m", "tamrun", f"tracking.uri={store}", *csv_overrides(csv_path),
                             *ENDLESS_FIT], cwd=tmp_path, stdout=out.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 240
    while "fitting" not in out.read_text():
        assert proc.poll() is None, out.read_text()
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.1)
    time.sleep(1.0)  # well inside the CG loop
    return proc, out


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_fit_ends_the_run_killed_promptly(tmp_path, csv_path, signum, code):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc, out = _start_endless_run(tmp_path, csv_path, store)
    sent = time.monotonic()
    proc.send_signal(signum)
    returncode = proc.wait(timeout=60)
    seconds = time.monotonic() - sent
    output = out.read_text()
    assert returncode == code, output
    assert "interrupted" in output and "Traceback" not in output
    assert seconds < 15, f"took {seconds:.1f} s to exit"
    print(f"{signal.Signals(signum).name}: exited {returncode} after {seconds:.2f} s")
    (logged,) = MlflowClient(tracking_uri=store).search_runs(["1"])
    assert logged.info.status == "KILLED"
    assert logged.data.tags["error_type"] in ("KeyboardInterrupt", "Terminated")


def test_sigkill_mid_fit_leaves_the_store_readable_and_the_next_run_marks_it_killed(tmp_path, csv_path, compose_cfg):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc, out = _start_endless_run(tmp_path, csv_path, store)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    client = MlflowClient(tracking_uri=store)
    (stale,) = client.search_runs(["1"])
    assert stale.info.status == "RUNNING"  # nothing could record its end: visibly not FINISHED

    # compose_cfg's own store is another file: point this run at the killed run's store
    following = run(compose_cfg(*csv_overrides(csv_path), f"tracking.uri={store}"))
    assert client.get_run(following.run_id).info.status == "FINISHED"
    # the next run on the store finds the killed process gone and marks its run KILLED, saying why
    assert client.get_run(stale.info.run_id).info.status == "KILLED"
    reason = client.get_run(stale.info.run_id).data.tags["tamrun.killed_reason"]
    assert f"pid {proc.pid}" in reason and following.run_id in reason
    statuses = sorted(r.info.status for r in client.search_runs(["1"]))
    assert statuses == ["FINISHED", "KILLED"]


def test_a_running_run_whose_process_is_alive_is_left_alone(compose_cfg, csv_path, store_uri):
    """A RUNNING run of a live process (this test's own) is not a stale run: the next run leaves it."""
    from tamrun.config.schema import TrackingConfig
    from tamrun.tracking.mlflow_run import TrackedRun

    alive = TrackedRun(TrackingConfig(uri=store_uri), "alive", {})
    alive.start_detached()
    following = run(compose_cfg(*csv_overrides(csv_path), "tracking.log_plots=false", "tracking.log_model=false"))
    client = MlflowClient(tracking_uri=store_uri)
    assert client.get_run(alive.run_id).info.status == "RUNNING"
    assert client.get_run(following.run_id).info.status == "FINISHED"
    client.set_terminated(alive.run_id, status="FINISHED")
