"""An MLflow store that many processes can open and write at once.

On a sqlite file, MLflow creates the tables and runs its migrations when the first client opens a
fresh file, and experiments are created by name; two processes doing either at once collide
("database is locked", a half-migrated schema, a duplicate experiment). Here:

- every sqlite connection waits up to ``busy_timeout_s`` for a lock (the pysqlite ``timeout``
  in the URI) instead of failing at once;
- the store's first opening (creation, migration) and the creation of an experiment happen under
  an inter-process file lock beside the database (``<db>.lock``).

Other stores (http, postgresql, ...) are opened as they are.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import parse_qsl, urlencode, urlsplit

from tamrun.errors import ConfigError

log = logging.getLogger(__name__)


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URI (query string dropped), else None."""
    return Path(uri[len("sqlite:///"):].split("?")[0]) if uri.startswith("sqlite:///") else None


def with_busy_timeout(uri: str, busy_timeout_s: float) -> str:
    """``uri`` with pysqlite's ``timeout`` set (kept if the URI already sets one); others unchanged."""
    if sqlite_path(uri) is None:
        return uri
    base, _, query = uri.partition("?")
    params = dict(parse_qsl(query))
    params.setdefault("timeout", f"{busy_timeout_s:g}")
    return f"{base}?{urlencode(params)}"


_FIX = "point tracking.uri at a reachable, writable store, or set tracking.enabled=false"


def check_store(uri: str, connect_timeout_s: float) -> None:
    """Fail fast, naming tracking.uri: a sqlite file whose folder cannot be created or that is not a
    file; an http(s) server that does not answer a TCP connection within ``connect_timeout_s``
    (MLflow itself would retry for minutes)."""
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("tracking.uri", uri, f"cannot create the store's folder ({exc})", _FIX) from None
        if db.exists() and not db.is_file():
            raise ConfigError("tracking.uri", uri, f"{db} exists and is not a file", _FIX)
        return
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=connect_timeout_s).close()
        except OSError as exc:
            raise ConfigError("tracking.uri", uri, f"the tracking server does not answer ({exc})",
                              "start the server, use a local store (tracking.uri=sqlite:///outputs/mlflow.db), "
                              "or set tracking.enabled=false") from None


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float) -> Iterator[None]:
    """Hold ``<db>.lock`` (an inter-process lock) for a sqlite store; no-op for other stores."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    from filelock import FileLock, Timeout

    lock = FileLock(str(db) + ".lock")
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise ConfigError("tracking.lock_timeout_s", timeout_s,
                          f"another process held the store's lock {db}.lock for longer",
                          "raise tracking.lock_timeout_s, or remove a stale lock file if no run is active") from None
    try:
        yield
    finally:
        lock.release()


def open_client(uri: str, busy_timeout_s: float, lock_timeout_s: float):
    """An `MlflowClient` on ``uri`` whose store exists and is migrated (created under the lock)."""
    from mlflow.tracking import MlflowClient

    with store_lock(uri, lock_timeout_s):
        client = MlflowClient(tracking_uri=with_busy_timeout(uri, busy_timeout_s))
        client.search_experiments(max_results=1)  # the store is open: tables and migrations done, once
    return client


def experiment_id(client, uri: str, name: str, artifact_location: Optional[str], lock_timeout_s: float,
                  tags: Optional[dict] = None) -> str:
    """The id of experiment ``name``, created (under the store's lock, with ``tags``) if absent."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    with store_lock(uri, lock_timeout_s):
        found = client.get_experiment_by_name(name)  # created meanwhile by another process?
        if found is not None:
            return found.experiment_id
        log.info("creating MLflow experiment '%s'", name)
        try:
            return client.create_experiment(name, artifact_location=artifact_location, tags=tags)
        except MlflowException:  # a remote store without our lock: created meanwhile by another job
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id
