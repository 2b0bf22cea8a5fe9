"""Multirun sweeps in MLflow: one parent run per sweep, its jobs nested under it, a summary at the end.

`SweepCallback` (a Hydra callback, listed in conf/config.yaml under ``hydra.callbacks``) runs in the
process that launches the sweep: ``on_multirun_start`` draws the sweep's id (its jobs inherit it,
`tamrun.tracking.sweep_record.sweep_files.SWEEP_ENV`), opens the parent run and writes the sweep's file (sweep id, parent
run id, store); every job, whatever the launcher (basic, joblib processes, submitit, Ray) reads it through
`sweep_tags` and tags its run with the sweep id, its number and ``mlflow.parentRunId``, and notes that it
started (`tamrun.tracking.sweep_record.sweep_files.mark_started`). ``on_multirun_end`` writes the jobs the store could
not take when they ended (`tamrun.tracking.sweep_record.held`), the table of every job that started and their metrics
(``sweep/summary.csv`` and ``.md``, `tamrun.tracking.sweep_record.sweep_summary`) to the parent run and ends it; when the
store does not answer then, the sweep's end is held too, and its last line says where
(`tamrun.sweeps.sweep_end`). Two sweeps in one folder, even started in the same second, keep their own
ids, files, parents and summaries.

The sweep file also names the keys the sweep varies (`tamrun.tracking.sweep_record.sweep_names`): each job's run is
named by its values of them and tagged ``sweep.<key>``. The parent crowns a best job (``best_run``, ``best_job``)
only on a validation metric, or on the objective the config asks for explicitly (a test metric is then
labelled ``best_on_test_*`` and a warning says that it leaks the test period into the choice).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import traceback
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from tamrun.process.collector import resume_paused_collection
from tamrun.config.plugins import check_plugins
from tamrun.config.schema import TrackingConfig
from tamrun.errors import Abort
from tamrun.tracking.sweep_record.held import error_tags, hold_job
from tamrun.redact import redacted
from tamrun.sweeps.sweep_failures import failure_exit_code, failure_line, table_failures
from tamrun.tracking.sweep_record.sweep_files import SWEEP_ENV, read_sweep_file, write_sweep_file
from tamrun.tracking.sweep_record.sweep_names import SweptKeys, job_run_name, job_values, swept_keys, value_tag, value_tags
from tamrun.tracking.sweep_record.sweep_summary import PARENT_TAG, SWEEP_ID_TAG, SWEEP_JOB_TAG
from tamrun.tracking.ui_view import ensure_runs_view, runs_table_url

log = logging.getLogger(__name__)


def objective_name(config: Any) -> str:
    """The metric a sweep minimises: ``objective`` when set, else ``rmse_backtest`` under mode=backtest,
    ``rmse_validation`` when the split carves a validation period out of training, else ``rmse_test``."""
    if getattr(config, "objective", None):  # a composed DictConfig or a typed `Config`
        return str(config.objective)
    mode = getattr(getattr(config, "mode", None), "name", None)
    if getattr(mode, "value", mode) == "backtest":
        return "rmse_backtest"
    return "rmse_validation" if getattr(config.split, "validation_start", None) else "rmse_test"


def objective_names(config: Any) -> List[str]:
    """What a job returns to the sweeper, in order: `objective_name`, then ``more_objectives``."""
    return [objective_name(config), *(str(name) for name in (getattr(config, "more_objectives", None) or []))]


def failed_objective(config: Any) -> Any:
    """A failed job's return: NaN for each objective (a float for one; the sweeper records a failed trial)."""
    names = objective_names(config)
    return float("nan") if len(names) == 1 else [float("nan")] * len(names)


def tracking_settings(config: DictConfig) -> TrackingConfig:
    """The typed tracking group of a composed config."""
    merged = OmegaConf.merge(OmegaConf.structured(TrackingConfig), config.tracking)
    return OmegaConf.to_object(merged)


def sweep_tags(sweep_dir: str, job_num: int, overrides: List[str]) -> Dict[str, str]:
    """Tags of a multirun job's run: the sweep id (the sweep folder when no callback ran), the job
    number, its overrides, its swept values (``sweep.<key>``) and, with a parent run,
    ``mlflow.parentRunId`` (the UI nests it there)."""
    info = read_sweep_file(sweep_dir)
    tags = {SWEEP_ID_TAG: info.get("sweep_id") or str(Path(sweep_dir).resolve()), SWEEP_JOB_TAG: str(job_num),
            "sweep_overrides": " ".join(overrides)[:5000],
            **value_tags(job_values(overrides, SweptKeys.from_json(info).labels))}
    if info.get("parent_run_id"):
        tags[PARENT_TAG] = info["parent_run_id"]
    return tags


def default_run_name(config: DictConfig) -> str:
    """A run's name outside a sweep: ``<model>-<data>``."""
    return f"{config.model.get('name', 'model')}-{config.data.get('name', 'data')}"


def sweep_run_name(sweep_dir: str, job_num: int, overrides: List[str], config: DictConfig) -> str:
    """A multirun job's run name: its swept values (`tamrun.tracking.sweep_record.sweep_names.job_run_name`)."""
    swept = SweptKeys.from_json(read_sweep_file(sweep_dir))
    return job_run_name(swept, job_num, job_values(overrides, swept.labels), default_run_name(config))


def sweep_plan(config: DictConfig) -> SweptKeys:
    """The keys a multirun's command line and sweeper vary, from its config at ``on_multirun_start``."""
    hydra_cfg = config.hydra
    sweeper = hydra_cfg.get("sweeper") or {}
    params = sweeper.get("params")
    return swept_keys(OmegaConf.to_container(hydra_cfg.overrides.task),
                      OmegaConf.to_container(params) if params else None,
                      (hydra_cfg.get("runtime") or {}).get("choices") or {},
                      grid=str(sweeper.get("_target_", "")).endswith("BasicSweeper"))


def record_failed_job(config: DictConfig, tags: Dict[str, str], error: BaseException, run_name: Optional[str] = None,
                      kind: Optional[str] = None, sweep_dir: Optional[str] = None) -> None:
    """A FAILED run for a sweep job that ended before its own run started (bad input found by the config
    checks, an internal error, a lost worker), so that the job has a status of its own and the parent's
    summary lists it: tags ``error_type``, ``error`` and ``error_kind`` (``kind``, else
    `tamrun.errors.error_kind`), and an internal error's traceback as ``logs/run.log``. When the store cannot
    take it, the run is held in the sweep's folder ``sweep_dir`` (default: the config's hydra.sweep.dir),
    written when the store answers (`tamrun.tracking.sweep_record.held`). Never raises."""
    from tamrun.errors import INTERNAL
    from tamrun.tracking.mlflow_run import TrackedRun

    try:
        settings = tracking_settings(config)
    except Exception as exc:  # the tracking group itself is the bad input: nowhere to record the job
        log.warning("the failed job could not be recorded (%s)", exc)
        return
    if not settings.enabled:
        return
    name = run_name or default_run_name(config)
    tags = {**tags, **error_tags(error, kind)}
    try:
        tracked = TrackedRun(settings, run_name=name, tags=tags)
        tracked.start_detached()
        if tags["error_kind"] == INTERNAL:
            tracked.log_text("".join(traceback.format_exception(type(error), error, error.__traceback__)),
                             "logs/run.log")
        tracked.client.set_terminated(tracked.run_id, status="FAILED")
    except Exception as exc:  # the store refused (a TamrunError) or failed: held, written when it answers
        hold_job(sweep_dir or str(config.hydra.sweep.dir), int(tags[SWEEP_JOB_TAG]), name, tags, exc)


def hold_open_run(sweep_dir: str, tags: Dict[str, str], error: BaseException, run_name: Optional[str]) -> None:
    """Hold the end of a sweep job's run that its store stopped taking while it ran (``error.run_id``, left
    RUNNING there): FAILED with the job's error, written when the store answers (`tamrun.tracking.sweep_record.held`)."""
    hold_job(sweep_dir, int(tags[SWEEP_JOB_TAG]), run_name or "", {**tags, **error_tags(error)}, error,
             run_id=error.run_id)


class SweepCallback(Callback):
    """Hydra callback grouping a multirun's jobs under one parent MLflow run (see the module doc);
    the summary ranks the jobs by the config's objective (`tamrun.tracking.sweep_record.sweep_summary.crown_best`)."""

    def __init__(self) -> None:
        self.info: Dict[str, Any] = {}  # this sweep's file (its store's URI unmasked), kept for its end
        self.spool: Optional[Path] = None
        self.open = False  # the parent is open: closed at exit if the sweep ends without on_multirun_end

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Open the sweep (`start_sweep`); its error stops the sweep and is reported by the entry point
        (Hydra makes a callback's exception a warning and goes on: it is carried out as an `Abort`)."""
        try:
            self.start_sweep(config)
        except Exception as error:
            raise Abort(error) from error

    def start_sweep(self, config: DictConfig) -> None:
        """Refuse a missing plugin (before Hydra instantiates it: its error would come with a traceback) and
        a Ray sweep that cannot run (`tamrun.cluster.start.prepare`), open the parent run, write the sweep file."""
        check_plugins(config.hydra)
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if launcher.endswith("RayClusterLauncher"):
            from tamrun.cluster.start import prepare

            prepare(config)
        settings = tracking_settings(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        sweep_id = uuid.uuid4().hex[:12]
        os.environ[SWEEP_ENV] = sweep_id  # this sweep's jobs inherit it (sweep_files.read_sweep_file)
        info: Dict[str, Any] = {"sweep_id": sweep_id, "sweep_dir": str(sweep_dir.resolve()),
                                "objective": objective_name(config), "objective_asked": bool(config.get("objective")),
                                **sweep_plan(config).to_json()}
        if settings.enabled:
            info.update(open_parent(config, settings, info))
        # The file holds the URI masked (a password stays in memory): the sweep's end uses `self.info`'s.
        write_sweep_file(str(sweep_dir), {**info, "tracking_uri": redacted(info.get("tracking_uri", ""))})
        self.info = info
        if settings.enabled:
            from tamrun.tracking.sweep_record.held_spool import spool_dir

            # A failing job ends Hydra's sweep with its exception, without on_multirun_end.
            self.spool, self.open = spool_dir(settings.held_dir), True
            atexit.register(self.close_abandoned)
        log.info("sweep %s: jobs are recorded under parent run %s (folder %s)", sweep_id,
                 info.get("parent_run_id"), sweep_dir)
        if config.hw.get("fork_workers", True) and launcher.endswith("JoblibLauncher"):
            from tamrun.sweeps.forked_workers import prepare_forked_workers

            prepare_forked_workers()
        elif not launcher.endswith("BasicLauncher"):  # the jobs run in other processes (tamrun/process/collector.py)
            resume_paused_collection()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Close this sweep's parent run (its own, whatever other sweep shares the folder); a sweep with a job
        that did not finish ends with a line that says which and why, and exits with code 1 when a bug of
        tamrun's ended one, else 2 (`tamrun.sweeps.sweep_failures`); a sweep whose end the store did not
        take exits 2 (or 1), its last line naming where it is held (`tamrun.sweeps.sweep_end`)."""
        from tamrun.sweeps.sweep_end import HeldEnd, end_sweep, held_line

        self.open = False
        if not self.info.get("parent_run_id"):
            return
        ended = end_sweep(self.info, self.spool)
        if isinstance(ended, HeldEnd):
            sys.stderr.write(held_line(ended, self.info["tracking_uri"], self.info["parent_run_id"]))
            raise SystemExit(failure_exit_code(ended.failures) if ended.failures else 2)
        failures = table_failures(ended)
        if failures:
            sys.stderr.write(failure_line(failures, len(ended), self.info["parent_run_id"]))
            raise SystemExit(failure_exit_code(failures))

    def close_abandoned(self) -> None:
        """At exit: close the parent of a sweep that ended without on_multirun_end (FAILED, aborted)."""
        if self.open:
            from tamrun.sweeps.sweep_end import end_sweep

            self.open = False
            end_sweep(self.info, self.spool, aborted=True)


def open_parent(config: DictConfig, settings: TrackingConfig, info: Dict[str, Any]) -> Dict[str, Any]:
    """Create the sweep's parent run and its experiment's runs view; what the sweep file records of it."""
    from tamrun.tracking.mlflow_run import TrackedRun

    tags = {SWEEP_ID_TAG: info["sweep_id"], "sweep_role": "parent", "sweep_dir": info["sweep_dir"],
            "sweep_command": " ".join(OmegaConf.to_container(config.hydra.overrides.task))[:5000]}
    parent = TrackedRun(settings, run_name=f"sweep-{info['sweep_id']}", tags=tags, objective=info["objective"])
    parent.start_detached()
    swept = SweptKeys.from_json(info).labels
    ensure_runs_view(parent.client, parent.client.get_experiment(parent.experiment_id), info["objective"],
                     [value_tag(key) for key in swept])
    log.info("compare the jobs in the MLflow UI: %s", redacted(runs_table_url(parent.uri, parent.experiment_id)))
    return {"parent_run_id": parent.run_id, "experiment_id": parent.experiment_id, "tracking_uri": parent.uri,
            "busy_timeout_s": settings.busy_timeout_s, "lock_timeout_s": settings.lock_timeout_s,
            "connect_timeout_s": settings.connect_timeout_s}
