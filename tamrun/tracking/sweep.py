"""Multirun sweeps in MLflow: one parent run per sweep, its jobs nested under it, a summary at the end.

`SweepCallback` (a Hydra callback, listed in conf/config.yaml under ``hydra.callbacks``) runs in the
process that launches the sweep: ``on_multirun_start`` opens the parent run and writes
``<sweep dir>/tamrun_sweep.json`` (sweep id, parent run id); every job, whatever the launcher
(basic, joblib processes, submitit, ray) reads that file through `sweep_tags` and tags its run with the
sweep id and ``mlflow.parentRunId``; ``on_multirun_end`` writes the table of jobs and their metrics
to the parent run (``sweep/summary.csv`` and ``.md``) and ends it.

The sweep file also names the keys the sweep varies (`tamrun.tracking.sweep_names`): each job's run is
named by its values of them and tagged ``sweep.<key>``. The parent crowns a best job (``best_run_id``)
only on a validation metric, or on the objective the config asks for explicitly (a test metric is then
labelled ``best_on_test_*`` and a warning says that it leaks the test period into the choice).
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import traceback
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from tamrun.collector import resume_paused_collection
from tamrun.config.plugins import check_plugins
from tamrun.config.schema import TrackingConfig
from tamrun.errors import Abort
from tamrun.tracking.plots import sweep_objective_figure
from tamrun.tracking.secrets import masked
from tamrun.tracking.sweep_failures import failure_exit_code, failure_line, table_failures
from tamrun.tracking.sweep_names import SweptKeys, job_run_name, job_values, swept_keys, value_tag, value_tags
from tamrun.tracking.ui_view import ensure_runs_view, runs_table_url

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
    if getattr(config, "objective", None):  # a composed DictConfig or a typed `Config`
        return str(config.objective)
    return "rmse_validation" if getattr(config.split, "validation_start", None) else "rmse_test"


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
    """A multirun job's run name: its swept values (`tamrun.tracking.sweep_names.job_run_name`)."""
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


def record_failed_job(config: DictConfig, tags: Dict[str, str], error: BaseException,
                       run_name: Optional[str] = None, kind: Optional[str] = None) -> None:
    """A FAILED run for a sweep job that ended before its own run started (bad input found by the config
    checks, an internal error, a lost worker), so that the job has a status of its own and the parent's
    summary lists it: tags ``error_type``, ``error`` and ``error_kind`` (``kind``, else
    `tamrun.errors.error_kind`), and an internal error's traceback as ``logs/run.log``. Recording it
    never raises: a failure to record is a warning."""
    from tamrun.errors import INTERNAL, error_kind
    from tamrun.tracking.mlflow_run import TrackedRun

    try:
        settings = tracking_settings(config)
    except Exception as exc:  # the tracking group itself is the bad input: nowhere to record the job
        log.warning("the failed job could not be recorded (%s)", exc)
        return
    if not settings.enabled:
        return
    name = run_name or default_run_name(config)
    kind = kind or error_kind(error)
    tracked = TrackedRun(settings, run_name=name, tags={**tags, "error_type": type(error).__name__,
                                                        "error": str(error)[:5000], "error_kind": kind})
    try:
        tracked.start_detached()
        if kind == INTERNAL:
            tracked.log_text("".join(traceback.format_exception(type(error), error, error.__traceback__)),
                             "logs/run.log")
        tracked.client.set_terminated(tracked.run_id, status="FAILED")
    except Exception as exc:  # the store refused (a TamrunError) or failed: the job's own error matters more
        log.warning("the failed job could not be recorded (%s)", exc)


def summary_table(client: Any, experiment_id: str, sweep_id: str, parent_run_id: Optional[str],
                  swept: Sequence[str] = ()) -> pd.DataFrame:
    """One row per job of the sweep (job number order): run id and name, status, its value of each
    swept key (a column named by the key), overrides, error type and kind (a job that failed: on bad
    input, ``config``, ``data``...; on a bug, ``internal``) and metrics."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.{SWEEP_ID_TAG} = '{sweep_id}'",
                              max_results=10_000)
    rows = []
    for run in runs:
        if run.info.run_id == parent_run_id:
            continue
        tags, metrics = run.data.tags, run.data.metrics
        row = {"job": int(tags.get(SWEEP_JOB_TAG, -1)), "run_id": run.info.run_id, "run_name": run.info.run_name,
               "status": run.info.status, **{key: tags.get(value_tag(key)) for key in swept},
               "overrides": tags.get("sweep_overrides", ""), "error_type": tags.get("error_type", ""),
               "error_kind": tags.get("error_kind", "")}
        row.update({name: metrics[name] for name in SUMMARY_METRICS if name in metrics})
        rows.append(row)
    columns = ["job", "run_id", "run_name", "status", *swept, "overrides", "error_type", "error_kind"]
    table = pd.DataFrame(rows, columns=[*columns, *(n for n in SUMMARY_METRICS if any(n in r for r in rows))])
    return table.sort_values("job").reset_index(drop=True)


def markdown_table(table: pd.DataFrame) -> str:
    """A pipe table (numbers to 4 significant digits, a missing one blank) for the UI's text viewer and
    for docs."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "" if value != value else f"{value:.4g}"
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


class SweepCallback(Callback):
    """Hydra callback grouping a multirun's jobs under one parent MLflow run (see the module doc);
    the summary ranks the jobs by the config's objective (see `crown_best`)."""

    def __init__(self) -> None:
        self._open: Optional[Dict[str, Any]] = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Open the sweep (`start_sweep`); its error stops the sweep and is reported by the entry point
        (Hydra makes a callback's exception a warning and goes on: it is carried out as an `Abort`)."""
        try:
            self.start_sweep(config)
        except Exception as error:
            raise Abort(error) from error

    def start_sweep(self, config: DictConfig) -> None:
        """Refuse a missing plugin (before Hydra instantiates it: its error would come with a traceback),
        open the parent run, write the sweep file."""
        from tamrun.tracking.mlflow_run import TrackedRun

        check_plugins(config.hydra)
        settings = tracking_settings(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        sweep_id = uuid.uuid4().hex[:12]
        info: Dict[str, Any] = {"sweep_id": sweep_id, "sweep_dir": str(sweep_dir.resolve()),
                                "objective": objective_name(config), "objective_asked": bool(config.get("objective")),
                                **sweep_plan(config).to_json()}
        if settings.enabled:
            tags = {SWEEP_ID_TAG: sweep_id, "sweep_role": "parent", "sweep_dir": info["sweep_dir"],
                    "sweep_command": " ".join(OmegaConf.to_container(config.hydra.overrides.task))[:5000]}
            parent = TrackedRun(settings, run_name=f"sweep-{sweep_id}", tags=tags, objective=info["objective"])
            parent.start_detached()
            swept = SweptKeys.from_json(info).labels
            ensure_runs_view(parent.client, parent.client.get_experiment(parent.experiment_id), info["objective"],
                             [value_tag(key) for key in swept])
            log.info("compare the jobs in the MLflow UI: %s", masked(runs_table_url(parent.uri, parent.experiment_id)))
            info.update(parent_run_id=parent.run_id, experiment_id=parent.experiment_id, tracking_uri=parent.uri,
                        busy_timeout_s=settings.busy_timeout_s, lock_timeout_s=settings.lock_timeout_s)
        # The file holds the URI masked (a password stays in memory): on_multirun_end resolves it again.
        (sweep_dir / SWEEP_FILE).write_text(json.dumps({**info, "tracking_uri": masked(info.get("tracking_uri", ""))},
                                                       indent=2))
        if settings.enabled:
            # A failing job ends Hydra's sweep with its exception, without on_multirun_end.
            self._open = info
            atexit.register(self._close_abandoned)
        log.info("sweep %s: jobs are recorded under parent run %s (folder %s)", sweep_id,
                 info.get("parent_run_id"), sweep_dir)
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if config.hw.get("fork_workers", True) and launcher.endswith("JoblibLauncher"):
            from tamrun.forked_workers import prepare_forked_workers

            prepare_forked_workers()
        elif not launcher.endswith("BasicLauncher"):  # the jobs run in other processes (tamrun/collector.py)
            resume_paused_collection()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Close the parent run; a sweep with a job that did not finish ends with a line that says which
        and why, and exits with code 1 when a bug of tamrun's ended one, else 2
        (`tamrun.tracking.sweep_failures`)."""
        info = read_sweep_file(str(config.hydra.sweep.dir))
        self._open = None
        if not info.get("parent_run_id"):
            return
        from tamrun.tracking.mlflow_run import tracking_uri

        info["tracking_uri"] = tracking_uri(tracking_settings(config))
        table = close_sweep(info)
        failures = table_failures(table)
        if failures:
            sys.stderr.write(failure_line(failures, len(table), info["parent_run_id"]))
            raise SystemExit(failure_exit_code(failures))

    def _close_abandoned(self) -> None:
        if self._open is not None:
            close_sweep(self._open, aborted=True)
            self._open = None


def close_sweep(info: Dict[str, Any], aborted: bool = False) -> pd.DataFrame:
    """Write the summary to the parent run and end it: FINISHED when every job finished, else FAILED."""
    from tamrun.tracking.store import open_client

    client = open_client(info["tracking_uri"], info["busy_timeout_s"], info["lock_timeout_s"])
    parent = info["parent_run_id"]
    swept = list(SweptKeys.from_json(info).labels)
    table = summary_table(client, info["experiment_id"], info["sweep_id"], parent, swept)
    write_summary(client, parent, table, info.get("objective", "rmse_test"), info.get("objective_asked", False),
                  swept)
    failed = int((table["status"] != "FINISHED").sum())
    client.set_terminated(parent, status="FAILED" if failed or aborted else "FINISHED")
    log.info("sweep %s: %d job(s), %d not FINISHED%s; summary in run %s (sweep/summary.md)", info["sweep_id"],
             len(table), failed, " (aborted)" if aborted else "", parent)
    return table


def best_label(objective: str, asked: bool) -> Optional[str]:
    """The prefix of the parent's best-job tag and metric (``<prefix>_run_id``, ``<prefix>_<objective>``),
    or None when no best is crowned: ``best`` on a validation metric (or any metric the config asks for
    that is not a test one), ``best_on_test`` on a test metric the config asks for (``objective=rmse_test``),
    None on the test metric that a split without a validation period falls back to."""
    if "test" not in objective.split("_"):
        return "best"
    return "best_on_test" if asked else None


def crown_best(client: Any, parent_run_id: str, table: pd.DataFrame, objective: str,
               asked: bool) -> Tuple[str, Optional[pd.Series]]:
    """Tag (and log) the finished job with the least objective, when `best_label` allows a choice on
    it; returns the selection (the parent's ``sweep_selection`` tag) and the best row (None: none)."""
    label = best_label(objective, asked)
    if label is None:
        log.info("sweep: no best run chosen: the objective %s is a test metric and the split has no validation "
                 "period (set split.validation_start; objective=%s chooses on the test period anyway)",
                 objective, objective)
        return f"none: {objective} is a test metric and the split has no validation period", None
    selection = f"best on {objective}"
    if label == "best_on_test":
        log.warning("sweep: the best run is chosen on %s, a test metric: choosing on the test period leaks it "
                    "into the choice, and that run's test metrics overstate how it forecasts (tagged "
                    "best_on_test_run_id; hold out a validation period with split.validation_start)", objective)
        selection += ", a test metric (asked for; the test period leaks into the choice)"
    done = table[table["status"] == "FINISHED"]
    done = done.dropna(subset=[objective]) if objective in done.columns else done.iloc[:0]
    if done.empty:
        return selection, None
    best = done.loc[done[objective].idxmin()]
    client.log_metric(parent_run_id, f"{label}_{objective}", float(best[objective]))
    client.set_tag(parent_run_id, f"{label}_run_id", best["run_id"])
    return selection, best


def sweep_description(table: pd.DataFrame, swept: Sequence[str], selection: str, objective: str,
                      best: Optional[pd.Series]) -> str:
    """The parent run's description (markdown, on its page in the UI): jobs, failures and the choice."""
    over = ", ".join(f"`{key}`" for key in swept) or "no swept key"
    failed = table[table["status"] != "FINISHED"]
    lines = [f"Sweep of {len(table)} job(s) over {over}: {len(table) - len(failed)} finished, {len(failed)} "
             "did not" + (" (" + ", ".join(f"job {r.job} {r.status}" for r in failed.itertuples()) + ")"
                          if len(failed) else "") + "."]
    if best is not None:
        lines.append(f"Selection: {selection}: job {best['job']} `{best['run_name']}` (run {best['run_id']}), "
                     f"{objective} = {best[objective]:.6g}.")
    else:
        lines.append(f"Selection: {selection}." + (" No job has it." if selection.startswith("best") else ""))
    lines.append("Every job and its metrics: sweep/summary.md; the objective against the swept values: "
                 "sweep/objective.png.")
    return "\n\n".join(lines)


def write_summary(client: Any, parent_run_id: str, table: pd.DataFrame, objective: str, asked: bool = False,
                  swept: Sequence[str] = ()) -> None:
    """The sweep's table (CSV and markdown), job and failure counts, best job (see `crown_best`),
    description and objective plot on the parent run."""
    import tempfile

    from mlflow.entities import RunTag

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "summary.csv"
        table.to_csv(path, index=False)
        client.log_artifact(parent_run_id, str(path), "sweep")
    client.log_text(parent_run_id, markdown_table(table), "sweep/summary.md")
    failed = table[table["status"] != "FINISHED"]
    client.log_metric(parent_run_id, "sweep_jobs", float(len(table)))
    client.log_metric(parent_run_id, "sweep_failed_jobs", float(len(failed)))
    selection, best = crown_best(client, parent_run_id, table, objective, asked)
    failed_jobs = f"{len(failed)} of {len(table)}"
    if len(failed):
        failed_jobs += f" (job(s) {', '.join(map(str, failed['job']))})"
    tags = {"sweep_objective": objective, "sweep_selection": selection, "sweep_params": ", ".join(swept),
            "sweep_failed_jobs": failed_jobs,
            "mlflow.note.content": sweep_description(table, swept, selection, objective, best)}
    client.log_batch(parent_run_id, tags=[RunTag(key, value[:5000]) for key, value in tags.items()])
    if len(table):
        figure = sweep_objective_figure(table, objective, swept, best_job=None if best is None else best["job"])
        client.log_figure(parent_run_id, figure, "sweep/objective.png")
