"""Multirun sweeps in MLflow: one parent run per sweep, its jobs nested under it, a summary at the end.

`SweepCallback` (a Hydra callback, listed in conf/config.yaml under ``hydra.callbacks``) runs in the
process that launches the sweep: ``on_multirun_start`` opens the parent run and writes
``<sweep dir>/tamrun_sweep.json`` (sweep id, parent run id); every job, whatever the launcher
(basic, joblib processes, submitit, ray) reads that file through `sweep_tags` and tags its run with the
sweep id and ``mlflow.parentRunId``; ``on_multirun_end`` writes the table of jobs and their metrics
to the parent run (``sweep/summary.csv`` and ``.md``) and ends it.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from tamrun.config.plugins import check_plugins
from tamrun.config.schema import TrackingConfig
from tamrun.errors import ConfigError
from tamrun.tracking.plots import sweep_objective_figure

log = logging.getLogger(__name__)

SWEEP_FILE = "tamrun_sweep.json"
SWEEP_ID_TAG = "sweep_id"
SWEEP_JOB_TAG = "sweep_job"
PARENT_TAG = "mlflow.parentRunId"
# Metrics of the summary table, in this order when a job logged them.
SUMMARY_METRICS = ("rmse_validation", "rmse_test", "mape_test", "rmse_train", "fit_seconds", "peak_memory_bytes",
                   "oom_retries", "cg_iterations")


def objective_name(config: Any) -> str:
    """The metric a sweep minimises: ``objective`` when set, else ``rmse_validation`` when the split
    carves a validation period out of training, else ``rmse_test``."""
    if config.get("objective"):
        return str(config.objective)
    return "rmse_validation" if config.split.get("validation_start") else "rmse_test"


def tracking_settings(config: DictConfig) -> TrackingConfig:
    """The typed tracking group of a composed config."""
    merged = OmegaConf.merge(OmegaConf.structured(TrackingConfig), config.tracking)
    return OmegaConf.to_object(merged)


def read_sweep_file(sweep_dir: str) -> Dict[str, Any]:
    """The sweep file written by `SweepCallback`, or {} when there is none."""
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def sweep_tags(sweep_dir: str, job_num: int, overrides: List[str]) -> Dict[str, str]:
    """Tags of a multirun job's run: the sweep id (the sweep folder when no callback ran), the job
    number, its overrides and, with a parent run, ``mlflow.parentRunId`` (the UI nests it there)."""
    info = read_sweep_file(sweep_dir)
    tags = {SWEEP_ID_TAG: info.get("sweep_id") or str(Path(sweep_dir).resolve()), SWEEP_JOB_TAG: str(job_num),
            "sweep_overrides": " ".join(overrides)[:5000]}
    if info.get("parent_run_id"):
        tags[PARENT_TAG] = info["parent_run_id"]
    return tags


def record_refused_job(config: DictConfig, tags: Dict[str, str], error: Exception) -> None:
    """A FAILED run for a sweep job refused before its own run started (bad input found by the config
    checks), so that the job has a status of its own and the parent's summary lists it."""
    from tamrun.errors import TamrunError
    from tamrun.tracking.mlflow_run import TrackedRun

    try:
        settings = tracking_settings(config)
    except Exception as exc:  # the tracking group itself is the bad input: nowhere to record the job
        log.warning("the refused job could not be recorded (%s)", exc)
        return
    if not settings.enabled:
        return
    name = f"{config.model.get('name', 'model')}-{config.data.get('name', 'data')}"
    tracked = TrackedRun(settings, run_name=name, tags={**tags, "error_type": type(error).__name__,
                                                        "error": str(error)[:5000]})
    try:
        tracked.start_detached()
        tracked.client.set_terminated(tracked.run_id, status="FAILED")
    except TamrunError as exc:
        log.warning("the refused job could not be recorded (%s)", exc)


def summary_table(client: Any, experiment_id: str, sweep_id: str, parent_run_id: Optional[str]) -> pd.DataFrame:
    """One row per job of the sweep (job number order): run id and name, status, overrides and metrics."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.{SWEEP_ID_TAG} = '{sweep_id}'",
                              max_results=10_000)
    rows = []
    for run in runs:
        if run.info.run_id == parent_run_id:
            continue
        tags, metrics = run.data.tags, run.data.metrics
        row = {"job": int(tags.get(SWEEP_JOB_TAG, -1)), "run_id": run.info.run_id, "run_name": run.info.run_name,
               "status": run.info.status, "overrides": tags.get("sweep_overrides", "")}
        row.update({name: metrics[name] for name in SUMMARY_METRICS if name in metrics})
        rows.append(row)
    table = pd.DataFrame(rows, columns=["job", "run_id", "run_name", "status", "overrides"])
    if rows:
        table = pd.DataFrame(rows)
    return table.sort_values("job").reset_index(drop=True)


def markdown_table(table: pd.DataFrame) -> str:
    """A pipe table (numbers to 4 significant digits) for the UI's text viewer and for docs."""
    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


class SweepCallback(Callback):
    """Hydra callback grouping a multirun's jobs under one parent MLflow run (see the module doc);
    the summary ranks the jobs by the config's objective (logged on the parent as ``best_<objective>``)."""

    def __init__(self) -> None:
        self._open: Optional[Dict[str, Any]] = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from tamrun.tracking.mlflow_run import TrackedRun

        try:  # before Hydra instantiates them: its error would come with a traceback
            check_plugins(config.hydra)
        except ConfigError as error:
            sys.stderr.write(error.report_line())
            raise SystemExit(2) from None  # an exception would be a warning of Hydra's callbacks
        settings = tracking_settings(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        sweep_id = uuid.uuid4().hex[:12]
        info: Dict[str, Any] = {"sweep_id": sweep_id, "sweep_dir": str(sweep_dir.resolve())}
        if settings.enabled:
            tags = {SWEEP_ID_TAG: sweep_id, "sweep_role": "parent", "sweep_dir": info["sweep_dir"],
                    "sweep_command": " ".join(OmegaConf.to_container(config.hydra.overrides.task))[:5000]}
            parent = TrackedRun(settings, run_name=f"sweep-{sweep_id}", tags=tags)
            parent.start_detached()
            info.update(parent_run_id=parent.run_id, experiment_id=parent.experiment_id, tracking_uri=parent.uri,
                        busy_timeout_s=settings.busy_timeout_s, lock_timeout_s=settings.lock_timeout_s)
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2))
        if settings.enabled:
            # A failing job ends Hydra's sweep with its exception, without on_multirun_end.
            self._open = {"info": info, "objective": objective_name(config)}
            atexit.register(self._close_abandoned)
        log.info("sweep %s: jobs are recorded under parent run %s (folder %s)", sweep_id,
                 info.get("parent_run_id"), sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Close the parent run; a sweep with a job that did not finish exits with code 2."""
        info = read_sweep_file(str(config.hydra.sweep.dir))
        self._open = None
        if not info.get("parent_run_id"):
            return
        table = close_sweep(info, objective_name(config))
        failed = table[table["status"] != "FINISHED"] if len(table) else table
        if len(failed):
            sys.stderr.write(f"tamrun: {len(failed)} of {len(table)} sweep job(s) did not finish (job(s) "
                             f"{', '.join(str(j) for j in failed['job'])}); summary in run {info['parent_run_id']}\n")
            raise SystemExit(2)

    def _close_abandoned(self) -> None:
        if self._open is not None:
            close_sweep(self._open["info"], self._open["objective"], aborted=True)
            self._open = None


def close_sweep(info: Dict[str, Any], objective: str, aborted: bool = False) -> pd.DataFrame:
    """Write the summary to the parent run and end it: FINISHED when every job finished, else FAILED."""
    from tamrun.tracking.store import open_client

    client = open_client(info["tracking_uri"], info["busy_timeout_s"], info["lock_timeout_s"])
    parent = info["parent_run_id"]
    table = summary_table(client, info["experiment_id"], info["sweep_id"], parent)
    write_summary(client, parent, table, objective)
    failed = int((table["status"] != "FINISHED").sum()) if len(table) else 0
    client.set_terminated(parent, status="FAILED" if failed or aborted else "FINISHED")
    log.info("sweep %s: %d job(s), %d not FINISHED%s; summary in run %s (sweep/summary.md)", info["sweep_id"],
             len(table), failed, " (aborted)" if aborted else "", parent)
    return table


def write_summary(client: Any, parent_run_id: str, table: pd.DataFrame, objective: str) -> None:
    """The sweep's table (CSV and markdown) on the parent run, its job count and best objective."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "summary.csv"
        table.to_csv(path, index=False)
        client.log_artifact(parent_run_id, str(path), "sweep")
    client.log_text(parent_run_id, markdown_table(table), "sweep/summary.md")
    client.log_metric(parent_run_id, "sweep_jobs", float(len(table)))
    if objective in table.columns and table[objective].notna().any():
        best = table.loc[table[objective].idxmin()]
        client.log_metric(parent_run_id, f"best_{objective}", float(best[objective]))
        client.set_tag(parent_run_id, "best_run_id", best["run_id"])
        client.log_figure(parent_run_id, sweep_objective_figure(table, objective), "sweep/objective.png")
