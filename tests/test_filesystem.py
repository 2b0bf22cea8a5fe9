"""A folder or file that cannot be created or written, or a full disk, named for what it is (issue 35):
``tamrun: filesystem error: <path>: <what> (...; <the place>, <its setting>). Fix: ...``, exit 2, no
traceback, never "Hydra refused the command line"; the MLflow run FAILED where one was started, with
what it had logged kept.

Real ``python -m tamrun`` processes on real folders: made immutable with ``chattr +i`` (root is refused a
write there as anyone else is; file permissions do not stop root), a read-only tmpfs mount, /proc, and
a small tmpfs that fills up. A case the machine cannot make (no chattr, no mount: not root, another file
system) is skipped with the reason; every attribute and mount is undone after its test.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from mlflow.tracking import MlflowClient

from tamrun.errors import FilesystemError
from tamrun.process.filesystem import Place, filesystem_error, refusal, written_file
from tamrun.tracking.store.store import open_client

from conftest import csv_overrides

QUICK = ["tracking.log_plots=false", "tracking.log_model=false"]


def tamrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_TRACKING"))}
    return subprocess.run([sys.executable, "-m", "tamrun", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def refused(done: subprocess.CompletedProcess) -> str:
    """The one ``tamrun: filesystem error`` line of a command that exited 2 without a traceback."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and "Hydra refused" not in output, output
    lines = [line for line in done.stderr.splitlines() if line.startswith("tamrun: ")]
    assert len(lines) == 1 and lines[0].startswith("tamrun: filesystem error: "), output
    return lines[0]


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i path`` for the block (skips the test where the attribute cannot be set)."""
    if shutil.which("chattr") is None:
        pytest.skip("no chattr on this machine")
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is refused here ({made.stderr.strip()}): root on ext4 or overlayfs is needed")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@contextlib.contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``folder`` with ``options`` for the block (skips the test where mounting is
    refused)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): root is needed")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)]).returncode != 0:  # busy: detached now, gone once released
            subprocess.run(["umount", "--lazy", str(folder)], check=True)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """An empty, migrated sqlite store (copied where a test needs one)."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    open_client(f"sqlite:///{db}", 60, 60)
    return db


def only_run(db: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (logged,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return client, logged


def test_a_read_only_working_folder_names_hydra_s_folder(tmp_path):
    """Before: a PermissionError traceback, then "Hydra refused the command line ... check the field's
    spelling"."""
    work = tmp_path / "work"
    work.mkdir()
    with immutable(work):
        line = refused(tamrun("mode=plan", "tracking=none", cwd=work))
    assert line == (f"tamrun: filesystem error: {work}/outputs: cannot be created or written ([Errno 1] Operation not "
                    "permitted; the run's Hydra folder, hydra.run.dir). Fix: run from a writable folder, or set "
                    "hydra.run.dir to one (the default MLflow store, outputs/mlflow.db, is in the working folder too: "
                    "tracking.uri)")


def test_a_read_only_mount_with_the_run_folder_elsewhere_names_the_default_store(tmp_path, csv_path):
    """Hydra's folder moved to a writable place, the working folder on a read-only file system: the
    default store (./outputs/mlflow.db) is the next thing that cannot be created."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as work:
        line = refused(tamrun(*csv_overrides(csv_path), *QUICK, f"hydra.run.dir={tmp_path / 'run'}", cwd=work))
    assert line.startswith(f"tamrun: filesystem error: {work}/outputs: cannot be created or written ([Errno 30] "
                           "Read-only file system; the MLflow store, tracking.uri). Fix: point tracking.uri at a store "
                           "in a writable folder"), line


def test_a_run_folder_the_system_refuses(tmp_path):
    """Before: a FileNotFoundError traceback, then the spelling hint."""
    line = refused(tamrun("mode=plan", "tracking=none", "hydra.run.dir=/proc/forbidden", cwd=tmp_path))
    assert line.startswith("tamrun: filesystem error: /proc/forbidden: cannot be created ([Errno 2] No such file or "
                           "directory; the run's Hydra folder, hydra.run.dir). Fix: "), line


def test_a_sweep_folder_the_system_refuses_stops_the_sweep(tmp_path):
    line = refused(tamrun("-m", "mode=plan", "tracking=none", "seed=0,1", "hydra.sweep.dir=/proc/forbidden",
                          cwd=tmp_path))
    assert line.startswith("tamrun: filesystem error: /proc/forbidden: cannot be created ([Errno 2] No such file or "
                           "directory; the sweep's Hydra folder, hydra.sweep.dir). Fix: run from a writable folder, or "
                           "set hydra.sweep.dir to one"), line


def test_a_store_in_a_read_only_folder(tmp_path, csv_path, template):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copyfile(template, store / "mlflow.db")
    with immutable(store):
        line = refused(tamrun(*csv_overrides(csv_path), *QUICK, f"tracking.uri=sqlite:///{store / 'mlflow.db'}",
                              cwd=tmp_path))
    assert line.startswith(f"tamrun: filesystem error: {store}/mlflow.db.lock: cannot be created or written ([Errno 1] "
                           "Operation not permitted; the MLflow store, tracking.uri)"), line


def test_a_read_only_store_file(tmp_path, csv_path, template):
    db = tmp_path / "mlflow.db"
    shutil.copyfile(template, db)
    with immutable(db):
        line = refused(tamrun(*csv_overrides(csv_path), *QUICK, f"tracking.uri=sqlite:///{db}", cwd=tmp_path))
    assert line.startswith(f"tamrun: filesystem error: {db}: cannot be created or written (sqlite: attempt to write a "
                           "readonly database; the MLflow store, tracking.uri). Fix: point tracking.uri at a store in "
                           "a writable folder"), line


def test_an_artifact_folder_that_cannot_be_written_fails_the_run_and_keeps_what_it_logged(tmp_path, csv_path):
    db, artifacts = tmp_path / "mlflow.db", tmp_path / "artifacts"
    artifacts.mkdir()
    with immutable(artifacts):
        line = refused(tamrun(*csv_overrides(csv_path), *QUICK, f"tracking.uri=sqlite:///{db}",
                              f"tracking.artifact_root={artifacts}", cwd=tmp_path))
    _, logged = only_run(db)
    assert line.startswith(f"tamrun: filesystem error: {artifacts}/{logged.info.run_id}"), line
    assert ": cannot be created or written ([Errno 1] Operation not permitted; the runs' artifacts, " \
           "tracking.artifact_root). Fix: point tracking.artifact_root at a writable folder" in line
    assert logged.info.status == "FAILED" and logged.data.tags["error_kind"] == "filesystem"
    # its first artifact (config/resolved.yaml, as the run starts) was refused; the params logged before are kept
    assert logged.data.tags["error_type"] == "FilesystemError" and logged.data.params["data.name"] == "csv"


def test_a_disk_that_fills_while_the_run_logs_its_artifacts(tmp_path, csv_path):
    """Before: exit 1, a traceback ending in OSError: [Errno 28] No space left on device, no tamrun line."""
    db = tmp_path / "mlflow.db"
    with tmpfs(tmp_path / "small", "size=256k") as artifacts:
        done = tamrun(*csv_overrides(csv_path), *QUICK, f"tracking.uri=sqlite:///{db}",
                      f"tracking.artifact_root={artifacts}", cwd=tmp_path)
        client, logged = only_run(db)
        kept = [f.path for f in client.list_artifacts(logged.info.run_id, "memory")]
    line = refused(done)
    assert line.startswith(f"tamrun: filesystem error: {artifacts}/{logged.info.run_id}/artifacts/"), line
    assert ": cannot be written ([Errno 28] No space left on device, a disk of 256.00 KiB with " in line
    assert "free after the failed write; the runs' artifacts, tracking.artifact_root). Fix: free space on that disk, " \
           "or point tracking.artifact_root at a writable folder" in line
    assert logged.info.status == "FAILED" and logged.data.tags["error_kind"] == "filesystem"
    assert "rmse_test" in logged.data.metrics and "memory/report.json" in kept  # what was logged is kept


def test_a_store_on_a_disk_that_fills(tmp_path, csv_path, template):
    """The store's file on a tmpfs with 32 KiB to spare: sqlite's "database or disk is full" names the store."""
    size = (template.stat().st_size // 1024 + 32) * 1024
    with tmpfs(tmp_path / "small", f"size={size}") as disk:
        shutil.copyfile(template, disk / "mlflow.db")
        done = tamrun(*csv_overrides(csv_path), *QUICK, f"tracking.uri=sqlite:///{disk / 'mlflow.db'}",
                      f"tracking.artifact_root={tmp_path / 'artifacts'}", cwd=tmp_path)
        with contextlib.closing(sqlite3.connect(disk / "mlflow.db")) as con:
            statuses = [row[0] for row in con.execute("SELECT status FROM runs")]
    line = refused(done)
    assert line.startswith(f"tamrun: filesystem error: {disk}/mlflow.db: cannot be written (sqlite: database or disk "
                           "is full, a disk of "), line
    assert "the MLflow store, tracking.uri). Fix: free space on that disk, or point tracking.uri" in line
    assert statuses in ([], ["FAILED"], ["RUNNING"]), statuses  # never FINISHED
    if statuses == ["RUNNING"]:
        assert "stays RUNNING until the next run on this host marks it KILLED" in line


# --- the classification itself

def test_a_refused_write_is_found_in_an_error_or_what_caused_it(tmp_path):
    try:
        try:
            (tmp_path / "missing" / "file").write_text("x")
        except OSError as cause:
            raise RuntimeError("wrapped") from cause
    except RuntimeError as error:
        found = refusal(error)
    assert found.errno == errno.ENOENT and found.path == tmp_path / "missing" / "file"
    assert refusal(RuntimeError("(sqlite3.OperationalError) database or disk is full")).sqlite
    assert refusal(RuntimeError("(sqlite3.OperationalError) database is locked")) is None  # a wait, not a refusal
    assert refusal(ValueError("no")) is None and refusal(OSError(errno.ECONNREFUSED, "refused")) is None


def test_a_write_without_a_file_name_is_named_by_the_file_it_was_writing(tmp_path):
    """An OSError raised by a write names no file: the file object of the failing frame does."""
    target = tmp_path / "out.bin"

    def write() -> None:
        with target.open("wb") as handle:
            handle.write(b"x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        write()
    except OSError as error:
        assert written_file(error.__traceback__) == target
        named = filesystem_error(error, [Place("tracking.artifact_root", tmp_path, "the runs' artifacts", "fix it")])
    assert isinstance(named, FilesystemError) and named.field == "tracking.artifact_root"
    assert str(named).startswith(f"{target}: cannot be written ([Errno 28] No space left on device, a disk of ")


def test_a_missing_file_outside_the_places_written_is_not_a_filesystem_error(tmp_path):
    """Reading a file that is not there, outside every folder the command writes, is a bug (exit 1)."""
    try:
        (tmp_path / "nowhere.txt").read_text()
    except OSError as error:
        places = [Place("tracking.uri", tmp_path / "store", "the MLflow store", "fix it")]
        assert filesystem_error(error, places) is None
        assert filesystem_error(error, places + [Place("hydra.run.dir", None, "the run's Hydra folder", "fix")])
