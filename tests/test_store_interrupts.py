"""A new sqlite store survives an interrupt at any instant of its creation: the first run of a new
user, stopped by Ctrl-C (SIGINT), SIGTERM (a scheduler's cancel) or killed (SIGKILL) while MLflow creates
and migrates the tables,
leaves either no store or a complete one, and the next run opens it. A store half-created by an older
version is moved aside and created anew when it holds no run. Real processes, real sqlite files."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from tamrun.errors import ConfigError
from tamrun.tracking.store.store import broken_store, open_client

from conftest import terminal_signals

INSTANTS = 20
# One process imports MLflow and tamrun once ("ready"), then forks a first run's process for each store
# URI it reads on stdin: the child sets SIGINT, SIGTERM and SIGHUP as a fresh interpreter started from a
# terminal has them (`terminal_signals`, then Python's KeyboardInterrupt for SIGINT), prints its pid and
# creates the store as the rest of this script; the parent reaps it, then prints "exited". Each of the 50
# interrupted creations thus starts without importing MLflow again (about 5 s each on 2 busy cores).
CREATE = """
import os, signal, sys
from mlflow.tracking import MlflowClient  # imported before 'ready': the interrupt falls in the creation
from tamrun.tracking.store.store import open_client
print("ready", flush=True)
for uri in sys.stdin:
    pid = os.fork()
    if pid == 0:
        break
    os.waitpid(pid, 0)
    print("exited", flush=True)
else:
    sys.exit(0)
for signum in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.default_int_handler)
print(os.getpid(), flush=True)
open_client(uri.strip(), 60, 60)
print("created", flush=True)
"""


class Creator:
    """The forking process of `CREATE`: ``start(uri)`` forks a first run creating the store at ``uri`` and
    returns its pid; ``reaped()`` waits until the parent has reaped it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CREATE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=terminal_signals)
        assert self.proc.stdout.readline().strip() == "ready"

    def start(self, uri: str) -> int:
        self.proc.stdin.write(uri + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def reaped(self) -> List[str]:
        """The lines the child and the parent printed until the parent reaped the child."""
        lines = []
        while not lines or lines[-1] != "exited":
            line = self.proc.stdout.readline()
            assert line, "the forking process ended"
            lines.append(line.strip())
        return lines

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture
def creator():
    made = Creator()
    yield made
    made.close()


def creation_seconds(creator: Creator, tmp_path: Path) -> float:
    """How long one uninterrupted creation takes after the imports (the span the instants cover)."""
    began = time.monotonic()
    creator.start(f"sqlite:///{tmp_path / 'timing.db'}")
    lines = creator.reaped()
    seconds = time.monotonic() - began
    assert lines == ["created", "exited"], lines
    return seconds


def usable(uri: str) -> None:
    """The store opens, and an experiment and a run can be created and ended in it."""
    client = open_client(uri, 60, 60)
    experiment = client.create_experiment(f"check-{time.monotonic_ns()}")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "x", 1.0)
    client.set_terminated(run.info.run_id, "FINISHED")
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


def interrupt_creation(creator: Creator, uri: str, delay: float, signum: int) -> None:
    """Start a first run's store creation, send ``signum`` ``delay`` seconds after its imports, wait."""
    pid = creator.start(uri)
    time.sleep(delay)
    with contextlib.suppress(ProcessLookupError):  # the creation may have ended already
        os.kill(pid, signum)
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:  # ended and reaped
        pass
    except psutil.TimeoutExpired:  # an interrupt swallowed somewhere: the user kills it, as they would
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    creator.reaped()


@pytest.mark.slow
def test_an_interrupt_at_any_instant_of_the_creation_leaves_a_store_the_next_run_uses(tmp_path, creator):
    """SIGINT and SIGTERM at each of 20 instants spread over the creation, SIGKILL at every other one."""
    span = creation_seconds(creator, tmp_path)
    outcomes = []
    for i in range(INSTANTS):
        delay = span * i / INSTANTS
        for signum in (signal.SIGINT, signal.SIGTERM) + ((signal.SIGKILL,) if i % 2 else ()):
            db = tmp_path / f"store{i}-{signum.name}" / "mlflow.db"
            uri = f"sqlite:///{db}"
            interrupt_creation(creator, uri, delay, signum)
            outcomes.append("complete" if db.exists() else "none")
            assert not db.exists() or broken_store(db) is None, f"instant {i} ({signum.name}): {broken_store(db)}"
            try:
                usable(uri)
            except Exception as error:
                raise AssertionError(f"instant {i} ({signum.name} after {delay:.2f} s): the next run could not use "
                                     f"the store: {error!r}") from error
    assert "none" in outcomes  # some interrupts did land inside the creation


def test_a_half_created_store_without_runs_is_moved_aside_and_created_anew(tmp_path, caplog):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:  # what an interrupted migration of an older version leaves
        con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER PRIMARY KEY)")
    assert "interrupted migration" in broken_store(db)
    usable(f"sqlite:///{db}")
    assert broken_store(db) is None
    assert len(list(tmp_path.glob("mlflow.db.broken-*"))) == 1
    assert "moved to" in caplog.text


def test_a_damaged_store_that_holds_runs_is_refused_not_touched(tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE runs (run_uuid TEXT)")
        con.execute("INSERT INTO runs VALUES ('a')")
        con.execute("CREATE TABLE _alembic_tmp_runs (run_uuid TEXT)")
    before = db.read_bytes()
    with pytest.raises(ConfigError, match="tracking.uri.*the store is damaged.*move .* aside"):
        open_client(f"sqlite:///{db}", 60, 60)
    assert db.read_bytes() == before
