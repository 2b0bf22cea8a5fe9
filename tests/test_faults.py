"""Crashes and signals on real runs and a real sqlite store: an exception anywhere leaves the run
FAILED with the error as a tag and the log as an artifact; SIGINT/SIGTERM end it KILLED and the
process exits promptly, also when they arrive in the middle of a store write; SIGKILL mid-fit leaves
the store readable and the next run works.

No test depends on when the signal lands: the store's sqlite lock, held by the test, keeps a run from
ending before its signal arrives, and a SQLAlchemy event listener loaded into the child by a
``sitecustomize`` (`STORE_GATE`; tamrun itself has no test hook) holds the child inside the store
statement the test names until the signal has been sent."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from mlflow.tracking import MlflowClient

import tamrun.jobs.record
import tamrun.data.table
import tamrun.fit.dispatcher
from tamrun.runner import run

from conftest import csv_overrides, terminal_signals

# A CG fit with a tolerance far below float64's reach: it iterates until the residual underflows to 0
# (about 370 iterations, seconds on a busy core; a fast machine may be done sooner, and the test's lock
# on the store then holds the run at its first write after the fit).
ENDLESS_FIT = ["solver=cg", "solver.preconditioner=jacobi", "solver.tol=1e-300", "solver.max_iter=100000000"]
QUICK = ["tracking.log_plots=false", "tracking.log_model=false"]
SIGNALS = pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                                  ids=["SIGINT", "SIGTERM"])
DEADLINE_S = 240  # for a child to reach a point: generous, imports and store creation on busy cores


def _raise_injected(*args, **kwargs):
    raise RuntimeError("injected fault (raised on purpose by the test)")


@pytest.mark.parametrize("target", [(tamrun.data.table.Table, "read"), (tamrun.fit.dispatcher.Dispatcher, "fit"),
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


def child_env(*paths: Path, **extra: str) -> Dict[str, str]:
    """The environment of a ``python -m tamrun`` child: this checkout first on its path (after ``paths``),
    no Hydra or tamrun variables inherited, ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(Path(__file__).resolve().parents[1]), *inherited])
    return {**env, **extra}


def wait_for(done, proc: subprocess.Popen, out: Path, what: str) -> None:
    """Poll ``done()`` until it holds; fail naming ``what`` if the child exits or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert proc.poll() is None, f"the child exited {proc.returncode} before {what}: {out.read_text()}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s: {out.read_text()}"
        time.sleep(0.02)


@contextlib.contextmanager
def store_locked(db: Path) -> Iterator[None]:
    """Hold the sqlite store's write lock: a run's next store statement waits (its busy timeout) until
    the block ends."""
    con = sqlite3.connect(db, isolation_level=None, timeout=60)
    try:
        con.execute("BEGIN EXCLUSIVE")
        yield
        con.execute("ROLLBACK")
    finally:
        con.close()


def _start_endless_run(tmp_path: Path, csv_path: Path, store: str) -> tuple:
    """``python -m tamrun`` on an endless CG fit; returns (process, stdout file) once it is fitting."""
    out = tmp_path / "stdout.txt"
    proc = subprocess.Popen([sys.executable, "-m", "tamrun", f"tracking.uri={store}", *csv_overrides(csv_path),
                             *ENDLESS_FIT], cwd=tmp_path, stdout=out.open("w"), stderr=subprocess.STDOUT,
                            env=child_env(), preexec_fn=terminal_signals)
    wait_for(lambda: "fitting" in out.read_text(), proc, out, "'fitting' line")
    return proc, out


@SIGNALS
def test_a_signal_mid_fit_ends_the_run_killed_promptly(tmp_path, csv_path, signum, code):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc, out = _start_endless_run(tmp_path, csv_path, store)
    with store_locked(tmp_path / "mlflow.db"):  # the run cannot record its end before the signal arrives
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


# Loaded into the child by PYTHONPATH: once the first statement that starts with $GATE_STATEMENT has run
# (its transaction still open, the store's write lock held: the worst instant for an interrupt), writes
# $GATE_DIR/waiting and waits there, inside SQLAlchemy, until $GATE_DIR/go exists. With
# $GATE_EVENT=before_cursor_execute it waits just before that statement instead.
STORE_GATE = """
import os, time
from pathlib import Path
from sqlalchemy import event
from sqlalchemy.engine import Engine

def gate(conn, cursor, statement, parameters, context, executemany):
    folder = Path(os.environ["GATE_DIR"])
    if not " ".join(statement.split()).startswith(os.environ["GATE_STATEMENT"]) or (folder / "waiting").exists():
        return
    (folder / "waiting").write_text(statement)
    deadline = time.monotonic() + 600
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)

event.listen(Engine, os.environ.get("GATE_EVENT", "after_cursor_execute"), gate)
"""

STORE_POINTS = {"run-creation": "INSERT INTO runs", "params-at-start": "INSERT INTO params",
                "metrics-at-end": "INSERT INTO metrics", "status-at-end": "UPDATE runs SET status"}


def run_held_in_statement(tmp_path: Path, csv_path: Path, store: str, statement: str, signum: int) -> tuple:
    """``python -m tamrun`` held just after the store statement starting with ``statement`` (inside its
    transaction), sent ``signum`` there, then let go; returns (exit code, stdout, stderr)."""
    site, gate = tmp_path / "site", tmp_path / "gate"
    site.mkdir()
    gate.mkdir()
    (site / "sitecustomize.py").write_text(STORE_GATE)
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = subprocess.Popen([sys.executable, "-m", "tamrun", f"tracking.uri={store}", *csv_overrides(csv_path),
                             *QUICK], cwd=tmp_path, stdout=out.open("w"), stderr=err.open("w"),
                            env=child_env(site, GATE_DIR=str(gate), GATE_STATEMENT=statement),
                            preexec_fn=terminal_signals)
    wait_for((gate / "waiting").exists, proc, err, f"statement {statement!r}")
    proc.send_signal(signum)
    (gate / "go").touch()
    return proc.wait(timeout=120), out.read_text(), err.read_text()


def own_lines(stderr: str) -> List[str]:
    """stderr without MLflow's INFO lines about creating the store's tables."""
    return [line for line in stderr.splitlines() if " INFO mlflow." not in line]


@SIGNALS
@pytest.mark.parametrize("point", STORE_POINTS)
def test_a_signal_during_a_store_write_ends_the_run_killed_without_a_traceback(tmp_path, csv_path, store_uri,
                                                                            compose_cfg, point, signum, code):
    returncode, stdout, stderr = run_held_in_statement(tmp_path, csv_path, store_uri, STORE_POINTS[point], signum)
    assert returncode == code, stdout + stderr
    assert "Traceback" not in stdout + stderr and "Exception ignored" not in stdout + stderr, stdout + stderr
    (line,) = own_lines(stderr)
    assert line.startswith("tamrun: interrupted"), stderr
    client = MlflowClient(tracking_uri=store_uri)
    (killed,) = client.search_runs(["1"])
    assert killed.info.status == "KILLED", point
    assert killed.data.tags["error_type"] == ("KeyboardInterrupt" if signum == signal.SIGINT else "Terminated")
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    following = run(compose_cfg(*csv_overrides(csv_path), *QUICK))
    assert client.get_run(following.run_id).info.status == "FINISHED"
    assert client.get_run(killed.info.run_id).info.status == "KILLED"


def test_sigkill_mid_fit_leaves_the_store_readable_and_the_next_run_marks_it_killed(tmp_path, csv_path, compose_cfg):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc, out = _start_endless_run(tmp_path, csv_path, store)
    with store_locked(tmp_path / "mlflow.db"):  # the run cannot record its end before it is killed
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


@pytest.mark.parametrize("first", ["stale_check", "launcher", "stale_check_writing_last"])
def test_a_lost_sweep_job_keeps_the_launchers_reason_whoever_closes_its_run_first(tmp_path, first):
    """A cluster job whose process died is closed by two writers: the launching process, which knows the
    task was lost (`record_lost_job`), and the stale-run check of another run opening on the same host
    (`close_stale_runs`). In any order, even the check writing last after finding the run RUNNING
    before the launcher closed it (the race a fresh clone's Ray test once lost), the run ends KILLED,
    tamrun.lost_reason keeps the launcher's reason and tamrun.killed_reason one of the two."""
    import json

    from omegaconf import OmegaConf

    from tamrun.sweeps.lost_jobs import record_lost_job
    from tamrun.tracking.stale import PID, REASON, STARTED, close_stale_runs, process_tags
    from tamrun.tracking.store.store import open_client
    from tamrun.tracking.sweep_record.sweep_files import SWEEP_FILE
    from tamrun.tracking.sweep_record.sweep_summary import SWEEP_ID_TAG, SWEEP_JOB_TAG

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = open_client(store, 30.0, 30.0)
    experiment = client.create_experiment("lost")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / SWEEP_FILE).write_text(json.dumps({"tracking_uri": store, "busy_timeout_s": 30.0, "lock_timeout_s": 30.0,
                                                    "sweep_id": "s1", "experiment_id": experiment}))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    tags = {**process_tags(), PID: gone.stdout.strip(), STARTED: "1.0", SWEEP_ID_TAG: "s1", SWEEP_JOB_TAG: "1"}
    lost = client.create_run(experiment, run_name="job-1", tags=tags).info.run_id
    finder = client.create_run(experiment, run_name="job-3").info.run_id
    reason = "its Ray task was lost (WorkerCrashedError: the worker died)"
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    if first == "stale_check":
        assert close_stale_runs(client, experiment, finder) == 1
        record_lost_job(config, 1, ["solver.tol=1e-8"], reason)
    else:
        record_lost_job(config, 1, ["solver.tol=1e-8"], reason)
        assert close_stale_runs(client, experiment, finder) == 0  # not RUNNING any more: left alone
        if first == "stale_check_writing_last":  # what a check that searched before the launcher writes
            client.set_tag(lost, REASON, f"its process (pid {tags[PID]}) ended; found by run {finder}")
            client.set_terminated(lost, status="KILLED")
    closed = client.get_run(lost)
    assert closed.info.status == "KILLED"
    assert closed.data.tags["tamrun.lost_reason"] == reason
    expected = reason if first == "launcher" else "its process (pid"
    assert closed.data.tags[REASON].startswith(expected)
    assert client.get_run(finder).info.status == "RUNNING"


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
