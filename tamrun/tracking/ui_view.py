"""The MLflow UI's runs table as tamrun's users want it first: the runs and the figures they compare.

MLflow's UI opens an experiment on the view its browser last saved, and a fresh browser on its GenAI
overview with three attribute columns and no metric. Two things of the UI's own make tamrun's
experiments open on their runs table with the metrics that matter:

- a shared view, stored on the experiment as the tag ``mlflow.sharedViewState.tamrun``
  (`RUNS_VIEW_TAG`): the runs table's columns (`METRIC_COLUMNS`, `PARAM_COLUMNS`, the dataset and
  the model, and a sweep's swept values: `store_runs_view`);
- the link that opens it in the model-training workflow (`runs_table_url`), logged by every run:

      <UI>/#/experiments/<id>/runs?workflowType=machine_learning&viewStateShareKey=tamrun
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterable, List

log = logging.getLogger(__name__)

VIEW_KEY = "tamrun"
RUNS_VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
# What `mlflow ui` / `mlflow server` serve by default: the link's base for a store that is not a server.
DEFAULT_UI = "http://127.0.0.1:5000"
ATTRIBUTE_COLUMNS = ("Dataset", "Models")
METRIC_COLUMNS = ("rmse_validation", "rmse_test", "mape_test", "fit_seconds", "peak_memory_bytes", "oom_retries")
PARAM_COLUMNS = ("model.name", "route")


def column(kind: str, name: str) -> str:
    """A runs-table column as the UI names it: ``metrics.`rmse_test```."""
    return f"{kind}.`{name}`"


def runs_view(extra_tags: Iterable[str] = ()) -> dict:
    """The shared view: runs newest first, the columns above, then the tags ``extra_tags``. (A shared
    view cannot expand a parent run: MLflow drops ``runsExpanded`` from it; a sweep's ``+`` lists its jobs.)"""
    columns: List[str] = [column("attributes", name) for name in ATTRIBUTE_COLUMNS]
    columns += [column("metrics", name) for name in METRIC_COLUMNS]
    columns += [column("params", name) for name in PARAM_COLUMNS]
    columns += [column("tags", name) for name in extra_tags]
    return {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
            "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
            "selectedColumns": columns}


def store_runs_view(client: Any, experiment_id: str, extra_tags: Iterable[str] = ()) -> None:
    """Store `runs_view` (with the tags ``extra_tags`` as columns) on the experiment."""
    client.set_experiment_tag(experiment_id, RUNS_VIEW_TAG, json.dumps(runs_view(extra_tags)))


def ensure_runs_view(client: Any, experiment: Any) -> None:
    """Store the shared view on ``experiment`` (an MLflow Experiment) unless it has one already. Runs
    starting at once on a fresh experiment race to store it (the tag's unique key): the view is a
    convenience of the UI, so a failure to store it is logged, never the run's end."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    if RUNS_VIEW_TAG in (experiment.tags or {}):
        return
    try:
        store_runs_view(client, experiment.experiment_id)
    except (MlflowException, SQLAlchemyError) as exc:
        if RUNS_VIEW_TAG not in (client.get_experiment(experiment.experiment_id).tags or {}):
            log.warning("could not store the runs table's view on experiment %s: %s", experiment.experiment_id,
                        str(exc).splitlines()[0])


def ui_base(tracking_uri: str) -> str:
    """The UI's address: the tracking server itself, or `DEFAULT_UI` for a database or file store."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else DEFAULT_UI


def runs_table_url(tracking_uri: str, experiment_id: str) -> str:
    """The link that opens the experiment's runs table in the shared view."""
    return (f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")
