"""A sweep's summary on its parent run: the table of its jobs, the best one, and the parent's end.

`close_sweep` reads the sweep's job runs from the store (one row per job, in job order, plus a row for a
job that started but left no run: ``UNRECORDED``), writes the table to the parent run (``sweep/summary.csv``
and ``.md``), crowns the best job (`crown_best`), describes the sweep and ends the parent: FINISHED when
every job finished, else FAILED. The launching process calls it at the sweep's end (`tamrun.sweeps.sweep`),
or the next run on the store does, when the store did not answer then (`tamrun.tracking.sweep_record.held`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd

from tamrun.errors import LOST
from tamrun.tracking.metric_keys import logged_value
from tamrun.tracking.artifacts.plots import sweep_objective_figure
from tamrun.tracking.sweep_record.sweep_names import SweptKeys, value_tag

log = logging.getLogger(__name__)

SWEEP_ID_TAG = "sweep_id"
SWEEP_JOB_TAG = "sweep_job"
PARENT_TAG = "mlflow.parentRunId"
UNRECORDED = "UNRECORDED"  # the status of a job that started and left no run in the store
# Metrics of the summary table, in this order when a job logged them.
SUMMARY_METRICS = ("rmse_validation", "rmse_backtest", "mape_backtest", "rmse_test", "mape_test", "cost_usd", "rmse_train", "fit_seconds",
                   "peak_memory_bytes", "oom_retries", "cg_iterations")
# The best job's metrics its parent carries besides the objective (`log_best`).
BEST_METRICS = ("rmse_validation", "rmse_backtest", "rmse_test")


def summary_table(client: Any, experiment_id: str, sweep_id: str, parent_run_id: Optional[str],
                  swept: Sequence[str] = (), started: Optional[Dict[int, List[str]]] = None) -> pd.DataFrame:
    """One row per job of the sweep (job number order): run id and name, status, its value of each
    swept key (a column named by the key), overrides, error type and kind (a job that failed: on bad
    input, ``config``, ``data``...; on a bug, ``internal``) and metrics. A job of ``started`` (job number ->
    overrides) with no run gets a row of its own: status `UNRECORDED`, error kind ``lost``."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.{SWEEP_ID_TAG} = '{sweep_id}'",
                              max_results=10_000)
    rows = [job_row(run, swept) for run in runs if run.info.run_id != parent_run_id]
    recorded = {row["job"] for row in rows}
    rows += [{"job": job, "run_id": "", "run_name": "", "status": UNRECORDED, **{key: None for key in swept},
              "overrides": " ".join(overrides), "error_type": "", "error_kind": LOST}
             for job, overrides in sorted((started or {}).items()) if job not in recorded]
    columns = ["job", "run_id", "run_name", "status", *swept, "overrides", "error_type", "error_kind"]
    table = pd.DataFrame(rows, columns=[*columns, *(n for n in SUMMARY_METRICS if any(n in r for r in rows))])
    return table.sort_values("job").reset_index(drop=True)


def job_row(run: Any, swept: Sequence[str]) -> Dict[str, Any]:
    """A job's row of the summary table, from its run."""
    tags, metrics = run.data.tags, run.data.metrics
    row = {"job": int(tags.get(SWEEP_JOB_TAG, -1)), "run_id": run.info.run_id, "run_name": run.info.run_name,
           "status": run.info.status, **{key: tags.get(value_tag(key)) for key in swept},
           "overrides": tags.get("sweep_overrides", ""), "error_type": tags.get("error_type", ""),
           "error_kind": tags.get("error_kind", "")}
    values = {name: logged_value(metrics, name) for name in SUMMARY_METRICS}
    row.update({name: value for name, value in values.items() if value is not None})
    return row


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


def close_sweep(info: Dict[str, Any], aborted: bool = False, client: Any = None,
                started: Optional[Dict[int, List[str]]] = None) -> pd.DataFrame:
    """Write the summary to the parent run and end it: FINISHED when every job finished, else FAILED.
    ``client``: an open client on the sweep's store (default: one opened on ``info["tracking_uri"]``);
    ``started``: the jobs that started (`summary_table`)."""
    if client is None:
        from tamrun.tracking.store.store import open_client

        client = open_client(info["tracking_uri"], info["busy_timeout_s"], info["lock_timeout_s"])
    parent = info["parent_run_id"]
    swept = list(SweptKeys.from_json(info).labels)
    table = summary_table(client, info["experiment_id"], info["sweep_id"], parent, swept, started)
    objective = info.get("objective", "rmse_test")
    selection, best = write_summary(client, parent, table, objective, info.get("objective_asked", False), swept)
    failed = int((table["status"] != "FINISHED").sum())
    client.set_terminated(parent, status="FAILED" if failed or aborted else "FINISHED")
    log.info("sweep %s: %d job(s), %d not FINISHED%s; %s; summary in run %s (sweep/summary.md)", info["sweep_id"],
             len(table), failed, " (aborted)" if aborted else "",
             chosen_job(selection, best, objective, info["tracking_uri"], info["experiment_id"]), parent)
    return table


def chosen_job(selection: str, best: Optional[pd.Series], objective: str, tracking_uri: str,
               experiment_id: str) -> str:
    """The sweep's choice in words: ``<selection>: job <n> '<run name>' <objective>=<value>: <its page>``;
    the selection alone when no job was chosen (`crown_best`)."""
    from tamrun.numbers import significant
    from tamrun.redact import redacted
    from tamrun.tracking.ui_view import run_url

    if best is None:
        return selection + (" (no job has it)" if selection.startswith("best") else "")
    return (f"{selection}: job {best['job']} '{best['run_name']}' {objective}={significant(float(best[objective]))}: "
            f"{redacted(run_url(tracking_uri, experiment_id, best['run_id']))}")


def best_label(objective: str, asked: bool) -> Optional[str]:
    """The prefix of the parent's best-job tags and metrics (``<prefix>_run``, ``<prefix>_<objective>``),
    or None when no best is crowned: ``best`` on a validation metric (or any metric the config asks for
    that is not a test one), ``best_on_test`` on a test metric the config asks for (``objective=rmse_test``),
    None on the test metric that a split without a validation period falls back to."""
    if "test" not in objective.split("_"):
        return "best"
    return "best_on_test" if asked else None


def crown_best(client: Any, parent_run_id: str, table: pd.DataFrame, objective: str,
               asked: bool) -> Tuple[str, Optional[pd.Series]]:
    """Tag (and log: `log_best`) the finished job with the least objective, when `best_label` allows a
    choice on it; returns the selection (the parent's ``sweep_selection`` tag) and the best row (None: none)."""
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
                    "best_on_test_run; hold out a validation period with split.validation_start)", objective)
        selection += ", a test metric (asked for; the test period leaks into the choice)"
    done = table[table["status"] == "FINISHED"]
    done = done.dropna(subset=[objective]) if objective in done.columns else done.iloc[:0]
    if done.empty:
        return selection, None
    best = done.loc[done[objective].idxmin()]
    log_best(client, parent_run_id, label, best, objective)
    return selection, best


def log_best(client: Any, parent_run_id: str, label: str, best: pd.Series, objective: str) -> None:
    """The best job on its parent, so that the parent's row shows it: tags ``<label>_run`` (its run id) and
    ``<label>_job`` (its run name), metrics ``<label>_<metric>`` of the objective and each of
    `BEST_METRICS` the job logged."""
    from mlflow.entities import Metric, RunTag

    names = dict.fromkeys([objective, *BEST_METRICS])
    values = {name: float(best[name]) for name in names if name in best.index and pd.notna(best[name])}
    now = int(time.time() * 1000)
    client.log_batch(parent_run_id, metrics=[Metric(f"{label}_{name}", value, now, 0)
                                             for name, value in values.items()],
                     tags=[RunTag(f"{label}_run", best["run_id"]), RunTag(f"{label}_job", best["run_name"])])


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
                  swept: Sequence[str] = ()) -> Tuple[str, Optional[pd.Series]]:
    """The sweep's table (CSV and markdown), job and failure counts, best job (see `crown_best`),
    description and objective plot on the parent run; returns `crown_best`'s selection and best row."""
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
    return selection, best
