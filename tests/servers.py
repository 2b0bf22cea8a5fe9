"""Servers the team tests start on 127.0.0.1 and stop themselves: a throw-away PostgreSQL cluster
(Debian's binaries) and `mlflow server` over a sqlite file or that database, artifacts served by the
server (--serve-artifacts). Used by tests/test_postgres.py and tests/test_ray_cluster.py."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import pytest

START_DEADLINE_S = 120  # a server starting on 2 busy cores
# A tracking-only server, as docs/scale.md recommends: MLflow's job execution (GenAI scoring, trace
# archival) keeps both cores busy for about 6 s after /health answers, slowing whatever the test runs next.
TRACKING_ONLY = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def as_postgres_user(command: List[str]) -> List[str]:
    """PostgreSQL refuses to run as root: run as the `postgres` user there."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def postgres_binaries() -> Path:
    """The newest Debian PostgreSQL bin folder with initdb and pg_ctl, or a skip saying what is missing."""
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    if not folders or not (Path(folders[-1]) / "initdb").exists():
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL cannot be started as root")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is not installed (pip install 'tamrun[team]')")
    return Path(folders[-1])


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A throw-away PostgreSQL cluster on 127.0.0.1 with a database `mlflow`; yields its URI (trust auth,
    no password). Stopped and removed afterwards, also on failure; a skip where it cannot run."""
    binaries = postgres_binaries()
    root = Path(tempfile.mkdtemp(prefix="tamrun-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    try:
        subprocess.run(as_postgres_user([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                                         "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        subprocess.run(as_postgres_user([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(root / "pg.log"), "-w",
                                         "-o", f"-k {root} -p {port} -c listen_addresses=127.0.0.1", "start"]),
                       check=True, capture_output=True, timeout=120)
        subprocess.run(as_postgres_user([str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U",
                                         "postgres", "mlflow"]), check=True, capture_output=True, timeout=60)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(as_postgres_user([str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


class MlflowServer:
    """`mlflow server` on 127.0.0.1 over ``backend`` (a database URI) with artifacts served from
    ``artifacts``; its process group is stopped by `stop` (a signal to the whole group)."""

    def __init__(self, backend: str, artifacts: Path, log: Path, workers: int = 2, extra: Sequence[str] = ()) -> None:
        self.backend, self.artifacts, self.log, self.workers, self.extra = backend, artifacts, log, workers, list(extra)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "MlflowServer":
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend, "--serve-artifacts",
                 "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", str(self.workers), *self.extra], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **TRACKING_ONLY})
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"mlflow server did not answer /health in {START_DEADLINE_S} s:\n"
                             f"{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.process = None


@contextlib.contextmanager
def mlflow_server(folder: Path, backend: Optional[str] = None, workers: int = 1) -> Iterator[str]:
    """`MlflowServer` over ``backend`` (default: a sqlite file in ``folder``), artifacts and log in
    ``folder``; yields its URI and stops it afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    server = MlflowServer(backend or f"sqlite:///{folder / 'mlflow.db'}", folder / "artifacts",
                          folder / "server.log", workers)
    try:
        yield server.start().uri
    finally:
        server.stop()


@contextlib.contextmanager
def model_server(python: str, model: str, log: Path, env: Optional[dict] = None) -> Iterator[str]:
    """`mlflow models serve -m <model> --env-manager local` of the Python ``python`` (its environment
    serves the model) on 127.0.0.1; yields its URL once /ping answers and stops its process group
    afterwards."""
    port = free_port()
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # MLflow runs its server by name (uvicorn)
    with open(log, "a") as out:
        process = subprocess.Popen([python, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager", "local",
                                    "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, "PATH": path, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"the model server did not answer /ping:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        yield url
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
