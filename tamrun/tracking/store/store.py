"""An MLflow store that many processes can open and write at once.

On a sqlite file, MLflow creates the tables and runs its migrations when the first client opens a
fresh file, and experiments are created by name; two processes doing either at once collide
("database is locked", a half-migrated schema, a duplicate experiment). Here:

- every sqlite connection waits up to ``busy_timeout_s`` for a lock (the pysqlite ``timeout``
  in the URI) instead of failing at once;
- the store's first opening (creation, migration) and the creation of an experiment happen under
  an inter-process file lock beside the database (``<db>.lock``);
- a new store is created and migrated in a temporary file beside it, then renamed into place: an
  interrupt at any instant leaves either no store or a complete one (never a half-migrated file);
- a store left half-migrated by an older version (no ``alembic_version``, or MLflow's temporary
  ``_alembic_tmp_*`` tables) that holds no run is moved aside and created anew, with a warning;
- a signal (SIGINT, SIGTERM, SIGHUP) that arrives while the store is opened or created, an experiment
  created, or any call made on the client `open_client` returns (a `SignalSafe`) is raised once that
  I/O is complete (`tamrun.tracking.signals`); waiting for the lock stays interruptible.

Other stores (http, postgresql, ...) are opened as they are, once their server answers (`check_answers`; an https
server's certificate trusted: `tamrun.tracking.store.server_access`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Tuple
from urllib.parse import parse_qsl, urlencode, urlsplit

from tamrun.config.secret_sources import check_no_secret
from tamrun.errors import ConfigError
from tamrun.process.filesystem import Place, filesystem_error
from tamrun.redact import redacted
from tamrun.tracking.store.server_access import check_tls
from tamrun.tracking.signals import SignalSafe, interruptible, signals_deferred
from tamrun.tracking.store.store_wait import StoreWatch, holders_text, lock_holders

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
LOCAL_STORE = "tracking.uri=sqlite:///outputs/mlflow.db"
ARTIFACT_FIX = ("point tracking.artifact_root at a writable folder (an existing experiment keeps the folder it was "
                "created with: set tracking.experiment to a new name)")


def store_place(db: Path, setting: str = "tracking.uri") -> Place:
    """A sqlite store's folder (its database and sqlite's journal beside it), for `filesystem_error`;
    ``setting``: where its URI came from (tracking.uri, or the environment's MLFLOW_TRACKING_URI)."""
    return Place(setting, db.parent, "the MLflow store", f"point {setting} at a store in a writable folder "
                 f"({setting}=sqlite:////<folder>/mlflow.db), or set tracking.enabled=false", file=db)


def artifact_place(folder: Path) -> Place:
    """An experiment's local artifact folder (its runs' artifacts), for `filesystem_error`."""
    return Place("tracking.artifact_root", folder, "the runs' artifacts", ARTIFACT_FIX)
# pip's name of the DB-API modules SQLAlchemy imports for MLflow's database stores (others: the module's).
# The team extra (pyproject.toml) installs psycopg 3, the driver of SQLAlchemy's postgresql:// URIs.
DRIVER_PACKAGES = {"psycopg": "'tamrun[team]' (psycopg 3; or psycopg2-binary, with a postgresql+psycopg2:// URI)",
                   "psycopg2": "psycopg2-binary (or 'tamrun[team]', with a postgresql:// URI)",
                   "MySQLdb": "mysqlclient"}
# Default ports of the database stores checked before MLflow connects (MLflow would retry for minutes).
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def vanishing(uri: str) -> bool:
    """Whether ``uri`` is a store that vanishes when the process ends: sqlite in memory (``sqlite://``,
    ``sqlite:///:memory:``, ``sqlite:///file::memory:?...``, ``?mode=memory``), whatever the driver."""
    scheme, _, rest = uri.partition("://")
    if scheme.split("+")[0].lower() != "sqlite":
        return False
    path, _, query = rest.partition("?")
    path = path[1:] if path.startswith("/") else path
    return path in ("", ":memory:") or path.startswith(("file::memory:", ":memory:")) or \
        "mode=memory" in query.lower()


def check_store(uri: str, connect_timeout_s: float, setting: str = "tracking.uri") -> None:
    """Fail fast: a store that vanishes when the process ends (`vanishing`: a `ConfigError` naming
    ``setting``, the run would be reported saved and be nowhere); a sqlite file whose folder cannot be
    created or that is not a file (a `FilesystemError` naming ``setting``); an http(s) server that does
    not answer a TCP connection within ``connect_timeout_s`` (MLflow itself would retry for minutes)."""
    if vanishing(uri):
        raise ConfigError(setting, redacted(uri), "an in-memory store vanishes when the process ends: the run "
                          "would be reported saved and recorded nowhere",
                          f"use a store that lasts ({LOCAL_STORE}, a database or server URI), or "
                          "tracking.enabled=false to record nothing")
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            if db.exists() and not db.is_file():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(db))
        except OSError as exc:
            raise filesystem_error(exc, [store_place(db, setting)]) from None
        return
    check_driver(uri)
    check_answers(uri, connect_timeout_s)


def check_answers(uri: str, connect_timeout_s: float) -> None:
    """Refuse, naming tracking.uri and tracking.connect_timeout_s, an http(s) server or a database
    server (postgresql://, mysql://, mssql://) that does not answer a TCP connection in time, and an
    https server whose certificate the client does not trust (`check_tls`)."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme not in ("http", "https") and scheme not in DATABASE_PORTS:
        return
    host, port = server_address(uri, scheme)
    if not host:
        return
    try:
        socket.create_connection((host, port), timeout=connect_timeout_s).close()
    except OSError as exc:
        what = "tracking server" if scheme.startswith("http") else "database server"
        raise ConfigError("tracking.uri", redacted(uri),
                          f"the {what} {host}:{port} does not answer within tracking.connect_timeout_s="
                          f"{connect_timeout_s:g} s ({exc})",
                          "check the URI and start the server, use a local store (tracking.uri=sqlite:///outputs/"
                          "mlflow.db), or set tracking.enabled=false") from None
    if scheme == "https":
        check_tls(uri, host, port, connect_timeout_s)


def server_address(uri: str, scheme: str) -> Tuple[Optional[str], int]:
    """(host, port) of a server URI as its client reads it: a database's as SQLAlchemy does (its password
    may hold '/', ':' or '?'), an http(s) server's as MLflow does (urllib: the host part ends at the first
    '/'); a port that is not a number is a `ConfigError` on tracking.uri (a password's '/' cut the host
    part there: the fix says to percent-encode it). The URI is shown redacted, the bad port only when no
    password could be in it."""
    if scheme in DATABASE_PORTS:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(uri)
            return url.host, url.port or DATABASE_PORTS[scheme]
        except (ArgumentError, ValueError) as exc:
            raise ConfigError("tracking.uri", redacted(uri), f"not a database URL ({redacted(str(exc))})",
                              f"write dialect://user:password@host:port/database, or use a local store "
                              f"({LOCAL_STORE})") from None
    parts = urlsplit(uri)
    try:
        return parts.hostname, parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        cut = "@" in uri.split("://", 1)[-1][len(parts.netloc):]  # a '/' of the password ended the host part
        shown_port = "" if cut or "@" in parts.netloc else f" {parts.netloc.rpartition(':')[2]!r}"
        raise ConfigError("tracking.uri", redacted(uri), f"the port{shown_port} is not a number"
                          + (" (the password holds a '/', '?' or '#', which ends the host part of a URL)" if cut else ""),
                          "percent-encode those characters of the password ('/' as %2F, '?' as %3F, '#' as %23, "
                          "'@' as %40), or write the port as digits (http://host:5000)") from None


def check_driver(uri: str) -> None:
    """Refuse a database store (postgresql://, mysql://, mssql://) whose DB-API driver is not installed
    (SQLAlchemy would fail with a traceback when MLflow first connects)."""
    from mlflow.store.db.db_types import DATABASE_ENGINES
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if urlsplit(uri).scheme.split("+")[0] not in DATABASE_ENGINES:
        return
    try:
        make_url(uri).get_dialect().import_dbapi()
    except ImportError as exc:
        package = DRIVER_PACKAGES.get(exc.name or "", exc.name)
        raise ConfigError("tracking.uri", redacted(uri), f"the database driver {exc.name!r} is not installed",
                          f"pip install {package}, or use a local store ({LOCAL_STORE})") from None
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigError("tracking.uri", redacted(uri), f"not a database URL ({redacted(str(exc))})",
                          f"write dialect://user:password@host:port/database (the port as digits), or use a local "
                          f"store ({LOCAL_STORE})") from None


def check_artifact_location(location: Optional[str]) -> None:
    """Create the local folder of an artifact location (a path or a file: URI), or refuse it (a
    `FilesystemError` naming tracking.artifact_root); remote locations are left to MLflow (`local_folder`)."""
    folder = local_folder(location)
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise filesystem_error(exc, [artifact_place(folder)]) from None


def local_folder(location: Optional[str]) -> Optional[Path]:
    """The folder of a local artifact location (a path or a file: URI); None for a remote one (any URI
    scheme but file:, also without ``//``: an ``mlflow server --serve-artifacts`` experiment's
    ``mlflow-artifacts:/1``; a one-letter scheme is a Windows drive)."""
    scheme = urlsplit(location or "").scheme
    if not location or (len(scheme) > 1 and scheme != "file"):
        return None
    return Path(urlsplit(location).path if location.startswith("file:") else location)


_SCHEMA = re.compile(r"out-of-date database schema \(found version (?P<found>\w+), but expected (?P<head>\w+)\)")


def known_revision(revision: str) -> bool:
    """Whether this MLflow's migrations know the schema ``revision`` (a store of an older MLflow, or of
    this one); a revision it does not know is a newer MLflow's."""
    import mlflow.store
    from alembic.script import ScriptDirectory

    try:
        migrations = ScriptDirectory(str(Path(mlflow.store.__file__).parent / "db_migrations"))
        return migrations.get_revision(revision) is not None
    except Exception:  # alembic's ResolutionError (and kin) for a revision it does not know
        return False


def schema_error(uri: str, reason: str, setting: str) -> Optional[ConfigError]:
    """The error for a store whose schema is not this MLflow's, by the way it differs: newer (a newer MLflow
    wrote it: upgrading the store cannot help, MLflow can) or older (``mlflow db upgrade``); None when
    ``reason`` is not about the schema."""
    import mlflow

    found = _SCHEMA.search(reason)
    if found is None:
        return None
    if known_revision(found.group("found")):
        return ConfigError(setting, redacted(uri), f"the store's schema (revision {found.group('found')}) is older "
                           f"than this MLflow's ({mlflow.__version__}, revision {found.group('head')})",
                           f"back the store up, then run: mlflow db upgrade '{redacted(uri)}' (or use another store)")
    return ConfigError(setting, redacted(uri), f"the store's schema (revision {found.group('found')}) is newer than "
                       f"this MLflow {mlflow.__version__} knows (its newest is {found.group('head')}): a newer MLflow "
                       "wrote it", "install the MLflow version that wrote the store (pip install -U mlflow), or "
                       "use another store; do not run mlflow db upgrade or downgrade on it")


def store_error(uri: str, reason: str, busy_timeout_s: float, setting: str = "tracking.uri") -> ConfigError:
    """The error for a store MLflow could not open: a sqlite file still locked by another process
    after the busy wait names tracking.busy_timeout_s (and that process, where it can be read); a schema
    that is not this MLflow's, newer or older (`schema_error`); anything else names ``setting``."""
    schema = schema_error(uri, reason, setting)
    if schema is not None:
        return schema
    if "database is locked" in reason:
        db = sqlite_path(uri)
        holders = lock_holders(db) if db is not None else None
        who = holders_text(holders) if holders else "another process"
        return ConfigError("tracking.busy_timeout_s", busy_timeout_s,
                           f"{who} held the store {redacted(uri)} locked for longer ({reason})",
                           "raise tracking.busy_timeout_s, or stop the process that holds the store")
    return ConfigError(setting, redacted(uri), f"the MLflow store cannot be used ({redacted(reason)})", _FIX)


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
        with interruptible():  # waiting creates nothing: a signal ends the wait at once
            lock.acquire(timeout=timeout_s)
    except Timeout:
        raise ConfigError("tracking.lock_timeout_s", timeout_s,
                          f"another process held the store's lock {db}.lock for longer",
                          "raise tracking.lock_timeout_s, or remove a stale lock file if no run is active") from None
    try:
        yield
    finally:
        lock.release()


def broken_store(db: Path, busy_timeout_s: float = 60.0) -> Optional[str]:
    """Why the sqlite file ``db`` is not a complete MLflow store, or None when it looks complete.

    Raises:
        sqlite3.OperationalError: another process held it locked for longer than ``busy_timeout_s`` (not
            evidence of damage: the opening stops there, rather than wait that long again in MLflow's).
    """
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=busy_timeout_s)) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = con.execute("SELECT count(*) FROM alembic_version").fetchone()[0] if "alembic_version" in tables else 0
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):
            raise
        return None  # busy or unreadable now: MLflow's opening says what it is
    except sqlite3.DatabaseError as exc:
        return f"not a readable sqlite database ({exc})"
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        return f"an interrupted migration left {', '.join(leftovers)}"
    if tables and not version:
        return "its tables were never stamped with a schema version (an interrupted creation)"
    return None


def store_runs(db: Path, busy_timeout_s: float = 60.0) -> Optional[int]:
    """How many runs the sqlite store ``db`` holds: 0 without a runs table, None when it cannot be read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=busy_timeout_s)) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return int(con.execute("SELECT count(*) FROM runs").fetchone()[0]) if "runs" in tables else 0
    except sqlite3.DatabaseError:
        return None


def create_store(db: Path, busy_timeout_s: float) -> None:
    """Create and migrate a sqlite store at ``db`` through a temporary file renamed into place (call
    under the store's lock: stale temporary files of interrupted creations are removed first)."""
    from mlflow.tracking import MlflowClient

    for stale in db.parent.glob(f".{db.name}.creating-*"):
        stale.unlink(missing_ok=True)
    building = db.with_name(f".{db.name}.creating-{os.getpid()}")
    try:
        MlflowClient(tracking_uri=with_busy_timeout(f"sqlite:///{building}", busy_timeout_s)).search_experiments(
            max_results=1)
        os.replace(building, db)
    finally:
        building.unlink(missing_ok=True)
    log.info("created the MLflow store %s", db)


def repair_store(uri: str, db: Path, busy_timeout_s: float) -> None:
    """Move aside a half-created store that holds no run (it is then recreated); refuse a damaged one
    that holds runs, or whose runs cannot be counted, and leave it untouched; refuse one another process
    holds locked for longer than ``busy_timeout_s``."""
    try:
        reason = broken_store(db, busy_timeout_s)
    except sqlite3.OperationalError as exc:
        raise store_error(uri, f"(sqlite3.OperationalError) {exc}", busy_timeout_s) from None
    if reason is None:
        return
    if store_runs(db, busy_timeout_s) != 0:
        raise ConfigError("tracking.uri", uri, f"the store is damaged: {reason}",
                          f"move {db} aside (its runs can be read with sqlite3) and run again, or point tracking.uri "
                          "at another store")
    aside = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(db, aside)
    log.warning("the MLflow store %s was left half-created (%s) and held no run: moved to %s and created anew",
                db, reason, aside)


# MLflow begins every session on a sqlite store with this statement (20 s), overriding the wait that the
# URI's ``timeout`` (tracking.busy_timeout_s) asks for: `busy_timeout_of_uri` rewrites it to that wait.
MLFLOW_BUSY_PRAGMA = re.compile(r"\s*PRAGMA\s+busy_timeout\s*=\s*\d+\s*;?\s*$", re.IGNORECASE)


def busy_timeout_of_uri(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                        executemany: bool) -> Tuple[str, Any]:
    """SQLAlchemy's ``before_cursor_execute`` listener: MLflow's `MLFLOW_BUSY_PRAGMA` on a sqlite engine
    whose URI sets ``timeout`` becomes ``PRAGMA busy_timeout = <that many ms>``; any other statement passes."""
    timeout = conn.engine.url.query.get("timeout") if conn.engine.dialect.name == "sqlite" else None
    if timeout and MLFLOW_BUSY_PRAGMA.match(statement):
        return f"PRAGMA busy_timeout = {int(float(timeout) * 1000)}", parameters
    return statement, parameters


def honour_busy_timeout() -> None:
    """Listen (once per process) with `busy_timeout_of_uri` to every SQLAlchemy engine, and keep
    MLflow's session errors to their message (`WithoutTraceback`)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "before_cursor_execute", busy_timeout_of_uri):
        event.listen(Engine, "before_cursor_execute", busy_timeout_of_uri, retval=True)
    sessions = logging.getLogger(MLFLOW_SESSION_LOGGER)
    if not any(isinstance(f, WithoutTraceback) for f in sessions.filters):
        sessions.addFilter(WithoutTraceback())


# MLflow logs a store session's database error with its traceback, then raises it: tamrun names what it
# raises (a locked store, a read-only or full disk, ...), so the log keeps the message alone.
MLFLOW_SESSION_LOGGER = "mlflow.store.db.utils"


class WithoutTraceback(logging.Filter):
    """Drops a record's traceback, keeps its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def open_client(uri: str, busy_timeout_s: float, lock_timeout_s: float) -> SignalSafe:
    """An `MlflowClient` on ``uri`` whose store exists and is migrated (created under the lock), each of
    its calls shielded from signals (`SignalSafe`) and watched (`StoreWatch`: a wait on another process
    is said aloud); a sqlite store's connections wait ``busy_timeout_s`` for a lock, MLflow's too."""
    from mlflow.tracking import MlflowClient

    db = sqlite_path(uri)
    watch = StoreWatch(uri, db, (busy_timeout_s, lock_timeout_s))
    honour_busy_timeout()
    with signals_deferred(), watch.call("opening the store"), store_lock(uri, lock_timeout_s):
        if db is not None and db.exists():
            repair_store(uri, db, busy_timeout_s)
        if db is not None and not db.exists():
            create_store(db, busy_timeout_s)
        client = MlflowClient(tracking_uri=with_busy_timeout(uri, busy_timeout_s))
        client.search_experiments(max_results=1)  # the store is open: tables and migrations done, once
    return SignalSafe(client, watch.call)


LONGEST_EXPERIMENT_NAME = 256  # characters: the width of MLflow's experiments.name column (its databases enforce it)


def experiment_id(client, uri: str, name: str, artifact_location: Optional[str], lock_timeout_s: float,
                  tags: Optional[dict] = None, setting: str = "tracking.experiment") -> str:
    """The id of experiment ``name``, created (under the store's lock, with ``tags``) if absent. A name
    MLflow cannot hold, a deleted experiment of that name (in MLflow's trash: it cannot take runs, and its
    name stays taken), or a creation MLflow refuses is a `ConfigError` naming ``setting``, the setting that
    chose the name. A name holding a secret is refused too: MLflow would keep it in clear
    (`tamrun.config.secret_sources.check_no_secret`; ``MLFLOW_EXPERIMENT_NAME`` is not checked before)."""
    from mlflow.exceptions import MlflowException

    check_no_secret(setting, name, "as the experiment's name", f"give {setting} a name without it")
    if len(name) > LONGEST_EXPERIMENT_NAME:
        raise ConfigError(setting, name, f"an experiment name of {len(name)} characters (MLflow's store holds at "
                          f"most {LONGEST_EXPERIMENT_NAME})", f"choose a name of at most {LONGEST_EXPERIMENT_NAME} "
                          "characters")
    found = client.get_experiment_by_name(name)
    if found is not None:
        return active_experiment(found, setting)
    with signals_deferred(), store_lock(uri, lock_timeout_s):
        found = client.get_experiment_by_name(name)  # created meanwhile by another process?
        if found is not None:
            return active_experiment(found, setting)
        log.info("creating MLflow experiment '%s'", name)
        try:
            return client.create_experiment(name, artifact_location=artifact_location, tags=tags)
        except MlflowException as exc:  # a remote store without our lock: created meanwhile by another job
            found = client.get_experiment_by_name(name)
            if found is None and exc.error_code != "INVALID_PARAMETER_VALUE":
                raise  # the store's own trouble (read-only, full, locked): named as such by the run (mlflow_run)
            if found is None:
                raise ConfigError(setting, name, f"MLflow refused to create the experiment ({redacted(exc.message)})",
                                  "choose another experiment name") from None
            return active_experiment(found, setting)


def active_experiment(experiment: Any, setting: str) -> str:
    """``experiment``'s id when it can take runs; a deleted one is a `ConfigError` naming ``setting``."""
    if experiment.lifecycle_stage == "deleted":
        raise ConfigError(setting, experiment.name, f"the experiment is deleted in this store (id "
                          f"{experiment.experiment_id}, in MLflow's trash): it takes no runs, and its name stays "
                          "taken until it is removed for good",
                          f"restore it (mlflow experiments restore --experiment-id {experiment.experiment_id}), "
                          f"remove it for good (mlflow gc --experiment-ids {experiment.experiment_id}), or choose "
                          "another experiment name")
    return experiment.experiment_id


# A write that two processes race to make first (the same dataset logged by two jobs of a sweep at once):
# MLflow looks for the row, then inserts it, so the slower writer hits the table's unique key.
# Its transaction is rolled back whole; tried again, it finds the row and links to it.
CONFLICT_ATTEMPTS = 3
CONFLICT_WORDS = ("UNIQUE constraint failed", "duplicate key value", "IntegrityError")


def retry_on_conflict(write: Callable[[], Any], attempts: int = CONFLICT_ATTEMPTS) -> Any:
    """``write()``, tried again (at most ``attempts`` times in all) while it fails on a unique-key conflict
    with a concurrent writer (`CONFLICT_WORDS` in the error); any other error is raised at once."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    for attempt in range(1, attempts + 1):
        try:
            return write()
        except (MlflowException, SQLAlchemyError) as exc:
            if attempt == attempts or not any(word in str(exc) for word in CONFLICT_WORDS):
                raise
            log.info("a concurrent writer took the same row first (%s); trying again", type(exc).__name__)
            time.sleep(0.05 * attempt)
