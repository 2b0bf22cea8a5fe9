"""No record lost while reported saved, and the store named for what it is (issue 44; docs/reliability.md).

- a store that vanishes at exit (sqlite in memory, every spelling) is refused before the run: exit 2,
  one line naming the setting, no file named ``:memory:`` left behind;
- a run killed with SIGKILL is marked KILLED by the next tamrun command that opens its store, whatever
  that command is: ``python -m tamrun.compare``, ``mode=plan``, a run of another experiment;
- a store written by a newer MLflow (its schema revision unknown to this one) is named as newer, by a run
  and by ``tamrun.compare`` (not "out-of-date, run mlflow db upgrade", not a traceback);
- ``tamrun.compare`` reads the store a run writes to: ``MLFLOW_TRACKING_URI`` when set.
Real sqlite stores, real processes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from test_faults import _start_endless_run, store_locked
from test_secrets import tamrun
from tamrun.runner import run

QUICK = ["tracking.log_plots=false", "tracking.log_model=false", "progress=off"]


@pytest.mark.parametrize("uri", ["sqlite:///:memory:", "sqlite://", "'sqlite:///file::memory:?cache=shared&uri=true'",
                                 "'sqlite+pysqlite:///:memory:'"])
def test_a_store_that_vanishes_at_exit_is_refused(tmp_path, csv_path, uri):
    cwd = tmp_path / "cwd"
    done = tamrun([*csv_overrides(csv_path), f"tracking.uri={uri}", *QUICK], cwd, {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tamrun: config error: tracking.uri=" in done.stderr
    assert "an in-memory store vanishes when the process ends" in done.stderr and "FINISHED" not in done.stderr
    assert not list(cwd.rglob("*:memory:*"))


def test_an_in_memory_store_from_the_environment_names_the_variable(tmp_path, csv_path):
    done = tamrun([*csv_overrides(csv_path), *QUICK], tmp_path / "cwd", {"MLFLOW_TRACKING_URI": "sqlite:///:memory:"})
    assert done.returncode == 2 and "tamrun: config error: MLFLOW_TRACKING_URI='sqlite:///:memory:'" in done.stderr


@pytest.fixture
def killed(tmp_path, csv_path):
    """A run SIGKILLed mid-fit (its end never recorded): (store URI, its run id, its pid)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc, _ = _start_endless_run(tmp_path, csv_path, store)
    with store_locked(tmp_path / "mlflow.db"):  # the run cannot record its end before it is killed
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    (stale,) = MlflowClient(tracking_uri=store).search_runs(["1"])
    assert stale.info.status == "RUNNING"
    return store, stale.info.run_id, proc.pid


def test_sigkilled_run_is_marked_killed_by_compare(killed, tmp_path):
    store, run_id, pid = killed
    done = subprocess.run([sys.executable, "-m", "tamrun.compare", "--store", store], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    stale = MlflowClient(tracking_uri=store).get_run(run_id)
    assert stale.info.status == "KILLED"
    assert f"pid {pid}" in stale.data.tags["tamrun.killed_reason"] and "tamrun.compare" in stale.data.tags["tamrun.killed_reason"]


@pytest.mark.parametrize("command", ["mode=plan", "tracking.experiment=another"])
def test_sigkilled_run_is_marked_killed_by_plan_and_by_a_run_of_another_experiment(killed, compose_cfg, csv_path,
                                                                                    command):
    store, run_id, pid = killed
    run(compose_cfg(*csv_overrides(csv_path), f"tracking.uri={store}", command, *QUICK))
    stale = MlflowClient(tracking_uri=store).get_run(run_id)
    assert stale.info.status == "KILLED" and f"pid {pid}" in stale.data.tags["tamrun.killed_reason"]


def newer_store(tmp_path, compose_cfg, csv_path) -> str:
    """A store with one run whose schema revision is one this MLflow does not know (a newer MLflow's)."""
    db = tmp_path / "newer.db"
    store = f"sqlite:///{db}"
    run(compose_cfg(*csv_overrides(csv_path), f"tracking.uri={store}", *QUICK))
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    return store


def test_a_store_of_a_newer_mlflow_is_named_newer_by_a_run_and_by_compare(tmp_path, compose_cfg, csv_path):
    store = newer_store(tmp_path, compose_cfg, csv_path)
    done = tamrun([*csv_overrides(csv_path), f"tracking.uri={store}", *QUICK], tmp_path / "cwd", {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "revision ffffffffffff) is newer than this MLflow" in done.stderr and "db upgrade'" not in done.stderr
    shown = subprocess.run([sys.executable, "-m", "tamrun.compare", "--store", store], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr[-3000:]
    assert shown.stderr.startswith("tamrun: config error: --store=") and "is newer than this MLflow" in shown.stderr


def test_compare_reads_the_store_a_run_writes_to(tmp_path, compose_cfg, csv_path):
    store = f"sqlite:///{tmp_path / 'env.db'}"
    result = run(compose_cfg(*csv_overrides(csv_path), f"tracking.uri={store}", *QUICK))
    name = MlflowClient(tracking_uri=store).get_run(result.run_id).info.run_name
    elsewhere = tmp_path / "elsewhere"  # no outputs/mlflow.db here: only the variable names the store
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TAMRUN_"))}
    compared = subprocess.run([sys.executable, "-m", "tamrun.compare"], capture_output=True, text=True, cwd=elsewhere,
                              timeout=300, env={**env, "MLFLOW_TRACKING_URI": store})
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert f"in {store}" in compared.stdout and name[:20] in compared.stdout
