"""Which runs `python -m tamrun.compare` shows: the experiment's last N runs, a sweep's jobs, or the
runs an MLflow search filter selects; a filter that names a metric no run logged is refused (MLflow
would silently select nothing)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from tamrun.errors import ConfigError
from tamrun.tracking.sweep_record.sweep_summary import PARENT_TAG, SWEEP_ID_TAG, SWEEP_JOB_TAG
from tamrun.tracking.ui_view import DECISIVE_METRICS

LAST = "last"  # --sweep last: the newest sweep of the experiment
SWEEP_FIX = "use a sweep id as its parent run's tag sweep_id shows it, or --sweep last"
# The parent's tags naming the job it crowned (`tamrun.tracking.sweep_record.sweep_summary.log_best`), the
# current names first: a parent recorded before 2026-11-29 carries best_run_id (best_on_test_run_id).
CROWN_TAGS = ("best_run", "best_run_id", "best_on_test_run", "best_on_test_run_id")


@dataclass
class Selection:
    """The runs to show, newest first (a sweep's jobs in job order), and the sweep's parent (if any)."""

    runs: List[Any]
    parent: Optional[Any] = None
    sweep_id: Optional[str] = None


def bad_filter(filter_string: str, reason: str) -> ConfigError:
    """The error for a filter MLflow refuses (``reason``: MLflow's message)."""
    return ConfigError("--filter", filter_string, f"MLflow refuses it ({reason})",
                       "write it in MLflow's search syntax, e.g. \"metrics.rmse_test < 1700 and "
                       "params.route = 'direct'\"")


def filter_metrics(filter_string: str) -> List[str]:
    """The metric keys a search filter compares (MLflow's own parser)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.search_utils import SearchUtils

    try:
        clauses = SearchUtils.parse_search_filter(filter_string)
        for clause in clauses:  # the comparators MLflow accepts for each kind of key
            SearchUtils.is_metric(clause["type"], clause["comparator"])
            SearchUtils.is_param(clause["type"], clause["comparator"])
            SearchUtils.is_tag(clause["type"], clause["comparator"])
    except MlflowException as exc:
        raise bad_filter(filter_string, exc.message) from None
    return [clause["key"] for clause in clauses if clause["type"] == "metric"]


def logged_metric(client: Any, experiment_id: str, key: str) -> bool:
    """Whether any run of the experiment logged the metric ``key``."""
    quoted = f"metrics.`{key}`"
    return any(client.search_runs([experiment_id], filter_string=f"{quoted} {test}", max_results=1)
               for test in ("> -1e308", "<= -1e308"))


def check_filter(client: Any, experiment_id: str, experiment: str, filter_string: str,
                 known: Sequence[str]) -> None:
    """Refuse a filter that compares a metric no run of the experiment logged, naming the nearest known
    metrics (``known``: metrics of the experiment's recent runs)."""
    for key in filter_metrics(filter_string):
        if key in known or logged_metric(client, experiment_id, key):
            continue
        near = difflib.get_close_matches(key, known, n=3) or list(DECISIVE_METRICS)
        raise ConfigError("--filter", filter_string, f"no run of experiment {experiment!r} logged a metric {key!r}",
                          f"use a metric the runs log, e.g. {', '.join(near)} (python -m tamrun.compare lists "
                          "the decisive ones; a run's page in the MLflow UI lists all)")


def last_runs(client: Any, experiment_id: str, count: int, filter_string: str = "") -> Selection:
    """The newest ``count`` runs (of those ``filter_string`` selects)."""
    runs = client.search_runs([experiment_id], filter_string=filter_string, max_results=count,
                              order_by=["attributes.start_time DESC"])
    return Selection(list(runs))


def sweep_runs(client: Any, experiment_id: str, sweep: str, filter_string: str = "") -> Selection:
    """A sweep's jobs in job order and its parent; ``sweep`` is its id or `LAST`."""
    if sweep == LAST:
        parents = client.search_runs([experiment_id], filter_string="tags.sweep_role = 'parent'", max_results=1,
                                     order_by=["attributes.start_time DESC"])
        if not parents:
            raise ConfigError("--sweep", sweep, "the experiment has no sweep", "run one with python -m tamrun -m ...")
        sweep = parents[0].data.tags[SWEEP_ID_TAG]
    if "'" in sweep:  # a sweep's id is 12 hex digits: a quote would end the filter's string
        raise ConfigError("--sweep", sweep, "not a sweep id (a quote cannot be in one)", SWEEP_FIX)
    clause = f"tags.{SWEEP_ID_TAG} = '{sweep}'"
    runs = client.search_runs([experiment_id], filter_string=" and ".join(filter(None, [clause, filter_string])),
                              max_results=10_000)
    if not runs:
        raise ConfigError("--sweep", sweep, "no run of the experiment belongs to that sweep", SWEEP_FIX)
    parent_ids = {run.data.tags.get(PARENT_TAG) for run in runs}
    parent = next((run for run in runs if run.info.run_id in parent_ids or run.data.tags.get("sweep_role") == "parent"),
                  None)
    jobs = [run for run in runs if run is not parent]
    jobs.sort(key=lambda run: int(run.data.tags.get(SWEEP_JOB_TAG, -1)))
    return Selection(jobs, parent, sweep)


def crowned(selection: Selection) -> Optional[Any]:
    """The job the sweep's parent crowned (the first of `CROWN_TAGS` it carries); None without a parent, when
    it crowned none, or when that job is not among the selection's runs (a filter left it out)."""
    if selection.parent is None:
        return None
    tags = selection.parent.data.tags
    run_id = next((tags[key] for key in CROWN_TAGS if tags.get(key)), None)
    return next((run for run in selection.runs if run.info.run_id == run_id), None)
