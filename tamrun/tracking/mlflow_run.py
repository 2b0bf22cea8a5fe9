"""One MLflow run's lifecycle through an explicit `MlflowClient` (no fluent global state).

The store is ``tracking.uri``, else ``MLFLOW_TRACKING_URI`` as MLflow reads it, else
``sqlite:///<cwd>/outputs/mlflow.db`` with artifacts beside it; the run's last line names it. The run ends
FINISHED on success, FAILED on any exception (with the error as tags: ``error_type``, ``error`` and
``error_kind``, bad input's kind or ``internal``: `tamrun.errors.error_kind`) and KILLED on an interrupt
(SIGINT, or SIGTERM/SIGHUP, raised as `tamrun.tracking.signals.Terminated` while the run is open).
A signal never lands inside a store call (`tamrun.tracking.signals.signals_deferred`): one during the
run's creation ends the created run KILLED, one while its end is written makes that end KILLED.
Every run logs its log as the artifact ``logs/run.log`` (with the traceback when it failed).
Params, tags and text artifacts pass through `tamrun.redact.redacted`: a password in a URI
(``postgresql://user:password@host/db``) is written as ``***``. A locked server's refusal (no or wrong
credentials, a READ-only user, an untrusted certificate) ends the command with one error naming the setting
(`tamrun.tracking.store.server_access`); a run refused its creation is not there, one created is ended FAILED.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from tamrun.config.schema import TrackingConfig
from tamrun.errors import INTERRUPTED, ConfigError, FilesystemError, TamrunError, error_kind
from tamrun.process.filesystem import Place, filesystem_error, temporary_place, writing
from tamrun.tracking.sweep_record.held_spool import spool_dir, upload_waiting
from tamrun.tracking.metric_keys import metric_key
from tamrun.tracking.params import to_params
from tamrun.tracking.run_names import NAME_KEY_TAG, earlier_runs, name_key, numbered
from tamrun.tracking.runlog import RunLog
from tamrun.redact import redacted, redacted_value
from tamrun.tracking.store.secrets import env_uri
from tamrun.tracking.store.server_access import access_error
from tamrun.tracking.source import account_tags
from tamrun.tracking.signals import Deferral, interrupt, signals_as_interrupts, signals_deferred
from tamrun.tracking.stale import close_stale_in_store, process_tags
from tamrun.tracking.artifacts.tables import write_frame
from tamrun.tracking.store.store import (active_experiment, artifact_place, check_artifact_location, check_store,
                                  experiment_id, local_folder, open_client, retry_on_conflict, sqlite_path, store_error,
                                  store_place)
from tamrun.tracking.ui_view import ensure_runs_view, runs_table_url
from tamrun.tracking.worker import ray_worker_tags

log = logging.getLogger(__name__)

# MLflow's own variable for "where my runs go", honoured when tracking.uri is not given.
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
# The experiment's kind in MLflow 3's UI: a model-training one (its runs table and view: tamrun.tracking.ui_view).
EXPERIMENT_TAGS = {"mlflow.experimentKind": "forecasting"}
# A run's last line names its objective, or this metric when it has none.
MAIN_METRIC = "rmse_test"
# A figure's PNG at zlib level 1 (Pillow's default is 6): the partial effects' encoding took 0.3 s of a
# 9 s command at level 6, 3-4x less at level 1, for files about 15 % larger.
FIGURE_SAVE = {"pil_kwargs": {"compress_level": 1}}


def default_tracking_uri(cwd: Optional[Path] = None) -> str:
    """sqlite:///<cwd>/outputs/mlflow.db"""
    return f"sqlite:///{(cwd or Path.cwd()) / 'outputs' / 'mlflow.db'}"


def tracking_uri(cfg: TrackingConfig) -> str:
    """``tracking.uri``, else the environment variable ``tracking.uri_env`` names (an error when it is
    unset), else `MLFLOW_URI_ENV` when it is set and not empty (where MLflow itself sends runs), else the
    default sqlite store."""
    if cfg.uri:
        return cfg.uri
    if cfg.uri_env:
        return env_uri(cfg.uri_env)
    return os.environ.get(MLFLOW_URI_ENV, "").strip() or default_tracking_uri()


EXPERIMENT_NAME_ENV, EXPERIMENT_ID_ENV = "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"


def experiment_choice(cfg: TrackingConfig) -> Tuple[str, Optional[str], str]:
    """(experiment name, experiment id, the setting that chose them), as MLflow picks an experiment:
    ``tracking.experiment`` when it is not the default; else MLflow's variables, ``MLFLOW_EXPERIMENT_NAME``
    (with ``MLFLOW_EXPERIMENT_ID``, if set, required to be its id), else ``MLFLOW_EXPERIMENT_ID`` alone
    (name ""); else the default name."""
    if cfg.experiment != TrackingConfig.experiment:
        return cfg.experiment, None, "tracking.experiment"
    name = os.environ.get(EXPERIMENT_NAME_ENV, "").strip()
    wanted = os.environ.get(EXPERIMENT_ID_ENV, "").strip() or None
    if name:
        return name, wanted, EXPERIMENT_NAME_ENV
    if wanted:
        return "", wanted, EXPERIMENT_ID_ENV
    return cfg.experiment, None, "tracking.experiment"


def experiment_by_id(client: Any, wanted: str) -> Any:
    """The experiment of id ``wanted`` (MLFLOW_EXPERIMENT_ID); one the store lacks is a `ConfigError`."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_experiment(wanted)
    except MlflowException:
        raise ConfigError(EXPERIMENT_ID_ENV, wanted, "the store has no experiment of this id",
                          f"unset {EXPERIMENT_ID_ENV} (or set {EXPERIMENT_NAME_ENV} or tracking.experiment), or give "
                          "the id of an experiment of this store") from None


def close_stale_runs_of(cfg: TrackingConfig, found_by: str) -> None:
    """Mark KILLED the runs a lost process left RUNNING in the store ``cfg`` names, when that store exists
    (a command that records nothing, ``mode=plan``, creates none; `tamrun.tracking.stale`). A store that
    cannot be opened now is left as it is, with a warning: the command does not need it."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    if not cfg.enabled:
        return
    try:
        uri = tracking_uri(cfg)
        db = sqlite_path(uri)
        if db is not None and not db.is_file():
            return
        check_store(uri, cfg.connect_timeout_s)
        client = open_client(uri, cfg.busy_timeout_s, cfg.lock_timeout_s)
    except (TamrunError, MlflowException, SQLAlchemyError, OSError) as exc:
        log.warning("could not open the store to look for runs left RUNNING by a lost process: %s", exc)
        return
    close_stale_in_store(client, found_by)


def uri_setting(cfg: TrackingConfig) -> str:
    """What the store's URI is named by in messages: `MLFLOW_URI_ENV` when the URI came from it (neither
    tracking.uri nor tracking.uri_env given), else tracking.uri."""
    if cfg.uri or cfg.uri_env or not os.environ.get(MLFLOW_URI_ENV, "").strip():
        return "tracking.uri"
    return MLFLOW_URI_ENV


def renamed_uri_error(error: ConfigError, setting: str) -> ConfigError:
    """A store's error about tracking.uri, naming ``setting`` (the environment variable the URI came from)."""
    renamed = ConfigError(setting, error.value, error.problem, f"{error.fix} (the URI is the environment variable "
                          f"{setting}'s: change or unset it, or set tracking.uri)")
    renamed.run_id, renamed.run_open = error.run_id, getattr(error, "run_open", False)
    return renamed


class TrackedRun:
    """Context manager for one MLflow run; ``enabled=False`` makes every call a no-op.

    Args:
        cfg: tracking settings (URI, artifact root, experiment, run name).
        run_name: used when ``cfg.run_name`` is None.
        tags: set when the run starts.
        objective: the metric the run minimises, a column of the experiment's runs-table view.
        number_reruns: a rerun of a name already in the experiment is numbered (``name #2``,
            `tamrun.tracking.run_names`), unless ``cfg.run_name`` names the run.
    """

    def __init__(self, cfg: TrackingConfig, run_name: str, tags: Mapping[str, str],
                 objective: Optional[str] = None, number_reruns: bool = False, folder: Optional[str] = None) -> None:
        self.cfg = cfg
        self.enabled = cfg.enabled
        self.uri = tracking_uri(cfg) if cfg.enabled else (cfg.uri or "")
        if redacted(self.uri) != self.uri:  # MLflow prints a run's link, password included, as the run ends
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.run_name = cfg.run_name or run_name
        self.experiment_name = cfg.experiment  # the experiment the run went to (`experiment_choice`), once open
        self.tags = dict(tags)
        self.objective = objective
        self.number_reruns = number_reruns and not cfg.run_name
        self.client = None
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.artifact_location: Optional[str] = None  # the experiment's
        self.artifact_uri: Optional[str] = None  # the run's
        self.runlog = RunLog()
        self.folder = folder  # the command's run folder (Hydra's output_dir), named by the run's last line
        self.metrics: Dict[str, float] = {}  # what log_metrics logged: the last line names the main one
        self._signals = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "TrackedRun":
        if not self.enabled:
            return self
        self._signals = signals_as_interrupts()
        self._signals.__enter__()
        try:
            self._check_and_open()
        except BaseException as exc:
            if self.run_id is None:
                self._restore_signals()
            else:  # created, then interrupted (a signal deferred during the creation): the run ends KILLED
                self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.runlog.start()
        log.info("MLflow run %s in experiment '%s' at %s", self.run_id, self.experiment_name, redacted(self.uri))
        log.info("compare runs in the MLflow UI%s: %s", "" if self.uri.startswith("http") else
                 f" (mlflow ui --backend-store-uri {redacted(self.uri)})",
                 redacted(runs_table_url(self.uri, self.experiment_id)))
        return self

    def start_detached(self) -> str:
        """Create the run without the signal handlers and run log of ``with`` (a sweep's parent run,
        ended by another call); returns its id."""
        self._check_and_open()
        return self.run_id

    def _check_and_open(self) -> None:
        """`check_store`, then `_open`; an error about tracking.uri names the variable the URI came from."""
        setting = uri_setting(self.cfg)
        try:
            check_store(self.uri, self.cfg.connect_timeout_s, setting)
            self._open()
        except ConfigError as exc:
            if exc.field != "tracking.uri" or setting == "tracking.uri":
                raise
            raise renamed_uri_error(exc, setting) from None

    def _restore_signals(self) -> None:
        if self._signals is not None:
            self._signals.__exit__(None, None, None)
            self._signals = None

    def _open(self) -> None:
        from mlflow.exceptions import MlflowException
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with signals_deferred():  # the run is created whole, its id known, before a signal is raised
                self._create()
        except (MlflowException, SQLAlchemyError, OSError) as exc:
            reason = getattr(exc, "message", None) or str(exc).splitlines()[0]
            raise access_error(self.uri, exc, self.experiment_name) or filesystem_error(exc, self.places()) or \
                store_error(self.uri, reason, self.cfg.busy_timeout_s) from None

    def _create(self) -> None:
        self.client = open_client(self.uri, self.cfg.busy_timeout_s, self.cfg.lock_timeout_s)
        self.experiment_id = self._experiment_id()
        experiment = self.client.get_experiment(self.experiment_id)
        check_artifact_location(experiment.artifact_location)
        self.artifact_location = experiment.artifact_location
        ensure_runs_view(self.client, experiment, self.objective)
        tags = {**self.tags, **process_tags(), **ray_worker_tags(), **account_tags(self.uri)}
        tags = {key: redacted_value(key, str(value)) for key, value in tags.items()}
        if self.number_reruns:
            tags[NAME_KEY_TAG] = name_key(self.run_name)
        run = self.client.create_run(self.experiment_id, run_name=redacted(self.run_name), tags=tags)
        self.run_id, self.artifact_uri = run.info.run_id, run.info.artifact_uri
        if self.number_reruns:
            self._number_rerun(tags[NAME_KEY_TAG], run.info.start_time)
        try:  # first: a held run's end is its own, not the stale-run check's
            upload_waiting(self.client, self.uri, spool_dir(self.cfg.held_dir))
        except Exception as exc:  # housekeeping must not fail the run: the held runs wait for the next one
            log.warning("could not write the runs held for this store (%s); the next run tries again", exc)
        close_stale_in_store(self.client, f"run {self.run_id}")

    def _number_rerun(self, key: str, start_time: int) -> None:
        """Number this run after the runs of the same name that started before it (`run_names.numbered`)."""
        earlier = earlier_runs(self.client, self.experiment_id, key, self.run_id, start_time)
        if earlier:
            self.run_name = numbered(self.run_name, earlier)
            self.client.update_run(self.run_id, name=self.run_name)

    def _experiment_id(self) -> str:
        """The run's experiment, as `experiment_choice` picks it: by name (created if absent), or by
        MLFLOW_EXPERIMENT_ID alone (it must exist); both given, they must agree (as MLflow requires)."""
        db = sqlite_path(self.uri)
        root = self.cfg.artifact_root or (str(db.parent / "mlartifacts") if db else None)
        check_artifact_location(root)
        location = Path(root).resolve().as_uri() if root and "://" not in root else root
        name, wanted, setting = experiment_choice(self.cfg)
        if not name:
            found = experiment_by_id(self.client, wanted)
            self.experiment_name = found.name
            return active_experiment(found, EXPERIMENT_ID_ENV)
        self.experiment_name = name
        found_id = experiment_id(self.client, self.uri, name, location, self.cfg.lock_timeout_s, EXPERIMENT_TAGS,
                                 setting)
        if wanted and wanted != found_id:
            raise ConfigError(EXPERIMENT_ID_ENV, wanted, f"it names another experiment than {setting}={name!r} (id "
                              f"{found_id})", f"unset {EXPERIMENT_ID_ENV}, or make the two name the same experiment")
        return found_id

    def places(self) -> List[Place]:
        """The folders this run writes (its artifacts, the store, the temporary folder), for
        `tamrun.process.filesystem.filesystem_error`."""
        db, folder = sqlite_path(self.uri), local_folder(self.artifact_location)
        return ([artifact_place(folder)] if folder is not None else []) + \
            ([store_place(db, uri_setting(self.cfg))] if db is not None else []) + [temporary_place()]

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.enabled or self.run_id is None:
            return False
        from mlflow.exceptions import MlflowException
        from sqlalchemy.exc import SQLAlchemyError

        named = self._named(exc)
        try:  # a signal while the end is written is deferred: the run still ends, KILLED (a second Ctrl-C too)
            with signals_deferred(reraise=not isinstance(exc, KeyboardInterrupt)) as deferral:
                self._terminate(type(named) if named is not None else exc_type, named or exc, tb, deferral)
        except (MlflowException, SQLAlchemyError, OSError) as error:  # the store went away during the run
            raise self._lost_store(error) from None
        finally:
            self._restore_signals()
        if named is not None:
            raise named from exc
        return False

    def _named(self, exc: Optional[BaseException]) -> Optional[FilesystemError]:
        """A refused write (a read-only folder, a full disk) that ended the run, as the `FilesystemError`
        its record and the command report; None for any other end."""
        if not isinstance(exc, Exception) or isinstance(exc, TamrunError):
            return None
        named = filesystem_error(exc, self.places())
        if named is not None:
            named.__cause__, named.run_id = exc, self.run_id
        return named

    def _lost_store(self, error: BaseException) -> TamrunError:
        """The error for a store that stopped answering, or refused a write (a full disk), while the run was
        open (its end not written): the run stays RUNNING there until the next run on this host closes it
        KILLED (`close_stale_runs`)."""
        refused = filesystem_error(error, self.places(), f": run {self.run_id} could not be ended, and stays RUNNING "
                                   "until the next run on this host marks it KILLED") or \
            access_error(self.uri, error, self.experiment_name)  # a locked server: a permission revoked, a password changed
        if refused is not None:
            refused.run_id, refused.run_open = self.run_id, True
            return refused
        reason = (getattr(error, "message", None) or str(error)).splitlines()[0][:300]
        lost = ConfigError("tracking.uri", redacted(self.uri),
                           f"the store stopped answering during run {self.run_id}, whose end could not be written "
                           f"({redacted(reason)})",
                           "check the URI and that the tracking server is up, then run again (the run left RUNNING "
                           "is closed KILLED by the next run on this host); tracking.connect_timeout_s bounds the "
                           "check before a run starts")
        lost.run_id, lost.run_open = self.run_id, True  # its end not written: a sweep job holds it (tracking.held)
        return lost

    def _terminate(self, exc_type, exc, tb, deferral: Deferral) -> None:
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        if exc is not None:
            self.runlog.add_exception(exc_type, exc, tb)
        log.info("MLflow run %s ends %s", self.run_id, status)
        text = self.runlog.stop()
        try:
            if exc is not None:
                self.client.set_tag(self.run_id, "error_type", exc_type.__name__)
                self.client.set_tag(self.run_id, "error", redacted(str(exc))[:5000])
                self.client.set_tag(self.run_id, "error_kind", error_kind(exc))
            self.client.log_text(self.run_id, redacted(text), "logs/run.log")
        except Exception as error:  # the store or artifact folder failed too: the status still matters
            log.error("could not record the error or the log of run %s: %s", self.run_id, error)
        if deferral.received is None:
            self.client.set_terminated(self.run_id, status=status)
        if deferral.received is not None and status != "KILLED":  # a signal came while the end was written
            self.client.set_tag(self.run_id, "error_type", type(interrupt(deferral.received)).__name__)
            self.client.set_tag(self.run_id, "error_kind", INTERRUPTED)
            self.client.set_terminated(self.run_id, status="KILLED")
            status = "KILLED"
        log.info("%s", self.last_line(status))  # the run's last line: what it is, how it went, where it is

    def last_line(self, status: str) -> str:
        """``run '<name>' <status>, <main metric>=<value>: <its page in the UI> (MLflow run <id> in <store>,
        experiment '<name>'; folder <run folder>)``: the main metric is the objective when logged, else
        ``rmse_test``; absent (a failed run) it is left out, and so is a folder the run was not given."""
        from tamrun.numbers import significant
        from tamrun.tracking.ui_view import run_url

        main = next((key for key in (self.objective, MAIN_METRIC) if key and key in self.metrics), None)
        figure = f", {main}={significant(self.metrics[main])}" if main else ""
        where = f"MLflow run {self.run_id} in {redacted(self.uri)}, experiment '{self.experiment_name}'"
        folder = f"; folder {self.folder}" if self.folder else ""
        return (f"run '{self.run_name}' {status}{figure}: {redacted(run_url(self.uri, self.experiment_id, self.run_id))}"
                f" ({where}{folder})")

    # ---- logging ---------------------------------------------------------------------------------
    def log_params(self, tree: Any) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Param

        params = [Param(k, redacted_value(k, str(v))) for k, v in to_params(tree).items()]
        for start in range(0, len(params), 100):  # MLflow's per-batch limit
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        logged = {k: float(v) for k, v in metrics.items() if v is not None}
        self.metrics.update(logged)  # by plain name (the run's last line reads them)
        batch = [Metric(metric_key(k), v, now, step) for k, v in logged.items()]  # grouped (`metric_key`)
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def log_metric_history(self, name: str, values: Iterable[float]) -> None:
        """A stepped metric: value i at step i (under its key, `metric_key`)."""
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(metric_key(name), float(v), now, i) for i, v in enumerate(values)]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def log_inputs(self, inputs: List[Any]) -> None:
        """MLflow ``DatasetInput``s (`tamrun.tracking.artifacts.datasets.dataset_inputs`)."""
        if self.enabled and inputs:  # jobs of a sweep log the same dataset at once (`retry_on_conflict`)
            retry_on_conflict(lambda: self.client.log_inputs(self.run_id, datasets=inputs))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled:
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, redacted_value(key, str(value)))

    def artifact(self, artifact_file: Optional[str] = None) -> Optional[Path]:
        """The local path of this run's artifact ``artifact_file`` (its artifact folder without it); None
        for a remote artifact store. What a write there names when it fails (`tamrun.process.filesystem.writing`)."""
        folder = local_folder(self.artifact_uri)
        return folder / artifact_file if folder is not None and artifact_file else folder

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.enabled:
            with writing(self.artifact(artifact_file)):
                self.client.log_text(self.run_id, redacted(text), artifact_file)

    def log_json(self, data: Dict[str, Any], artifact_file: str) -> None:
        self.log_text(json.dumps(data, indent=2, default=str), artifact_file)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        if self.enabled:
            with writing(self.artifact(artifact_file)):
                self.client.log_figure(self.run_id, figure, artifact_file, save_kwargs=FIGURE_SAVE)

    def log_file(self, path: os.PathLike, artifact_path: Optional[str] = None) -> None:
        if self.enabled:
            with writing(self.artifact(artifact_path)):
                self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_dir(self, path: str, artifact_path: Optional[str] = None) -> None:
        """Every file under the local folder ``path``, at ``artifact_path``."""
        if self.enabled:
            with writing(self.artifact(artifact_path)):
                self.client.log_artifacts(self.run_id, path, artifact_path)

    def log_frame(self, frame: Any, artifact_file: str) -> None:
        """A pandas DataFrame as an artifact: Parquet (zstd) when ``artifact_file`` ends in .parquet,
        else CSV (`tamrun.tracking.artifacts.tables.write_frame`)."""
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            with writing(path):
                write_frame(frame, path)
            parent = str(Path(artifact_file).parent)
            with writing(self.artifact(artifact_file)):
                self.client.log_artifact(self.run_id, str(path), None if parent == "." else parent)
