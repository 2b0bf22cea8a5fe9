"""The MLflow sqlite store under many processes at once (tamrun.tracking.store.store), on real stores."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time

import pytest
from mlflow.tracking import MlflowClient

from tamrun.config.schema import TrackingConfig
from tamrun.errors import ConfigError
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.store.store import check_artifact_location, store_lock, with_busy_timeout

WRITERS = 8


def _write_one_run(uri: str, index: int, barrier, errors) -> None:
    """One process: wait for the others, then open the fresh store, create a run, log and end it."""
    import logging
    import warnings

    class Remember(logging.Handler):
        def emit(self, record):
            errors.append(record.getMessage())

    logging.getLogger().addHandler(Remember(level=logging.WARNING))
    warnings.simplefilter("ignore")
    barrier.wait()
    try:
        with TrackedRun(TrackingConfig(uri=uri, experiment="concurrent"), f"writer-{index}", {"index": str(index)}) as run:
            run.log_params({"index": index})
            for step in range(20):
                run.log_metrics({"value": float(index), "step_value": float(step)}, step=step)
            run.log_text(f"writer {index}\n", "out.txt")
    except Exception as exc:  # reported to the parent, which fails the test
        errors.append(f"{type(exc).__name__}: {exc}")


def test_eight_processes_on_one_fresh_sqlite_store_lose_no_run(tmp_path):
    """8 processes start together on a store that does not exist yet: one creates and migrates it
    under the lock, all find one experiment, and 8 runs end FINISHED with all their metrics."""
    db = tmp_path / "fresh" / "mlflow.db"
    uri = f"sqlite:///{db}"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier, errors = manager.Barrier(WRITERS), manager.list()
        procs = [ctx.Process(target=_write_one_run, args=(uri, i, barrier, errors)) for i in range(WRITERS)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=240)
        problems = list(errors)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    assert not [m for m in problems if "locked" in m or "Error" in m], problems

    client = MlflowClient(tracking_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "concurrent"]
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    assert sorted(int(r.data.params["index"]) for r in runs) == list(range(WRITERS))
    assert {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        assert len(client.get_metric_history(r.info.run_id, "step_value")) == 20
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_busy_timeout_is_added_to_sqlite_uris_only():
    assert with_busy_timeout("sqlite:////a/b.db", 60) == "sqlite:////a/b.db?timeout=60"
    assert with_busy_timeout("sqlite:////a/b.db?timeout=5", 60) == "sqlite:////a/b.db?timeout=5"
    assert with_busy_timeout("http://host:5000", 60) == "http://host:5000"


def test_the_busy_timeout_reaches_the_sqlite_connection(tmp_path):
    """Another connection holds the database exclusively for 6 s, longer than sqlite's default
    5 s wait: a run that waits up to tracking.busy_timeout_s (60 s) still gets written."""
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    with TrackedRun(TrackingConfig(uri=uri, experiment="concurrent"), "first", {}):
        pass
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier, errors = manager.Barrier(2), manager.list()
        proc = ctx.Process(target=_write_one_run, args=(uri, 1, barrier, errors))
        proc.start()
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        barrier.wait()  # the child has imported everything and now opens the store
        time.sleep(6.0)
        holder.execute("COMMIT")
        holder.close()
        proc.join(timeout=120)
        problems = list(errors)
    assert proc.exitcode == 0 and not problems, problems
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("concurrent").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]


def test_a_lock_held_too_long_is_a_clear_error(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with store_lock(uri, 1.0):
        with pytest.raises(ConfigError, match=r"tracking.lock_timeout_s=0.2: another process held"):
            with store_lock(uri, 0.2):
                pass


@pytest.mark.parametrize("location", ["mlflow-artifacts:/1", "s3://bucket/1", "mlflow-artifacts://host:5000/1"])
def test_a_remote_artifact_location_creates_no_local_folder(tmp_path, monkeypatch, location):
    """A server's artifact location (``mlflow server --serve-artifacts`` gives ``mlflow-artifacts:/1``,
    without ``//``) is not a relative path: no folder named after it appears in the working directory."""
    monkeypatch.chdir(tmp_path)
    check_artifact_location(location)
    assert list(tmp_path.iterdir()) == []


def test_a_local_artifact_location_is_created(tmp_path):
    for location in (str(tmp_path / "a" / "1"), f"file://{tmp_path / 'b' / '1'}"):
        check_artifact_location(location)
    assert (tmp_path / "a" / "1").is_dir() and (tmp_path / "b" / "1").is_dir()


# --- concurrent writers of the same row -----------------------------------------------------------------
# The conflicts below are raised on purpose (real MlflowExceptions with the text sqlite gives): two
# processes racing for the same unique key cannot be made to collide on demand. fresh-clone runs of the
# suite under load hit both for real (a sweep's jobs logging the same dataset, runs storing the
# experiment's view at once).
CONFLICT = "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name"


def _flaky(failures: int, message: str = CONFLICT):
    """A write that raises ``message`` ``failures`` times, then returns how many calls it took."""
    from mlflow.exceptions import MlflowException

    calls = []

    def write():
        calls.append(1)
        if len(calls) <= failures:
            raise MlflowException(message)
        return len(calls)
    return write, calls


def test_a_unique_key_conflict_is_tried_again():
    from tamrun.tracking.store.store import retry_on_conflict

    write, calls = _flaky(2)
    assert retry_on_conflict(write) == 3 and len(calls) == 3


def test_a_conflict_that_persists_or_another_error_is_raised():
    from mlflow.exceptions import MlflowException
    from tamrun.tracking.store.store import CONFLICT_ATTEMPTS, retry_on_conflict

    write, calls = _flaky(10)
    with pytest.raises(MlflowException, match="UNIQUE constraint failed"):
        retry_on_conflict(write)
    assert len(calls) == CONFLICT_ATTEMPTS
    write, calls = _flaky(1, "no such table: datasets")
    with pytest.raises(MlflowException, match="no such table"):
        retry_on_conflict(write)
    assert len(calls) == 1  # not a conflict: raised at once


class _LateWriter:
    """A real client whose first experiment-tag write loses the race: another run stores the tag first
    (for real, through the same store), then this write fails on the unique key (raised on purpose)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client = client

    def __getattr__(self, name):
        return getattr(self.client, name)

    def set_experiment_tag(self, experiment_id, key, value):
        from mlflow.exceptions import MlflowException

        self.client.set_experiment_tag(experiment_id, key, value)
        raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: experiment_tags.key")


def test_a_run_that_loses_the_race_for_the_runs_view_goes_on(tmp_path, caplog):
    from tamrun.tracking.ui_view import RUNS_VIEW_TAG, ensure_runs_view

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment(client.create_experiment("race"))
    ensure_runs_view(_LateWriter(client), experiment)  # raises nothing: the view is there
    assert RUNS_VIEW_TAG in client.get_experiment(experiment.experiment_id).tags
    assert "could not store" not in caplog.text
