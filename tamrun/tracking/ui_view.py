"""The MLflow UI's runs table as tamrun's users want it first: the runs and the figures they compare.

MLflow's UI (3.17) opens an experiment on the view its browser last saved, and a fresh browser on its
GenAI overview with no metric. Two things of the UI's own make tamrun's experiments open on their runs
table with the decisive columns first:

- a shared view, stored on the experiment as the tag ``mlflow.sharedViewState.tamrun``
  (`RUNS_VIEW_TAG`): which columns show (``selectedColumns``), their order (``columnOrder``) and
  widths (``columnWidths``), so that at 1600 x 1000 with MLflow's assistant panel open the table shows,
  without scrolling: the run's name, its status (the Created column's icon; both pinned left by the
  UI), a sweep's swept values, its best job (the parent's tag `BEST_JOB_TAG`) and that job's objective
  (metric ``best_<objective>``), the objective when it is not rmse_test, rmse_test and mape_test;
  fit_seconds, peak_memory_mib, the route and the device follow, then Duration (which the UI cannot
  hide), the dataset, the model and the rest (`runs_view`). Every run merges its objective and a sweep
  its swept keys into the stored view (`ensure_runs_view`);
- the link that opens it in the model-training workflow (`runs_table_url`), logged by every run:

      <UI>/#/experiments/<id>/runs?workflowType=machine_learning&viewStateShareKey=tamrun

The bare ``#/experiments/<id>`` cannot be made to land on the runs: MLflow 3.17 picks that page by
the browser's last workflow (GenAI in a fresh browser), not by the experiment.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from tamrun.tracking.metric_keys import LEGACY_PREFIXES, metric_key

log = logging.getLogger(__name__)

VIEW_KEY = "tamrun"
RUNS_VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
# What `mlflow ui` / `mlflow server` serve by default: the link's base for a store that is not a server.
DEFAULT_UI = "http://127.0.0.1:5000"
DECISIVE_METRICS = ("rmse_test", "mape_test", "fit_seconds", "peak_memory_mib")
DECISIVE_PARAMS = ("route",)
DECISIVE_TAGS = ("device",)
SWEEP_TAG_PREFIX = "sweep."
# A sweep's parent names its best job and logs that job's objective (tamrun/tracking/sweep_record/sweep_summary.py).
BEST_PREFIX = "best_"
BEST_JOB_TAG = f"{BEST_PREFIX}job"
# Columns after the decisive ones: shown, but to the right (Duration cannot be hidden in the UI).
# The run's cost (metric cost_usd, tamrun/tco/) first of them: the decisive columns use the width there is.
TRAILING_COLUMNS = ("duration", "metrics.`cost_usd`", "attributes.`Dataset`", "attributes.`Models`",
                    "metrics.`system/memory/oom_retries`", "params.`model.name`")
# The UI's own ids of its pinned columns and of the run's duration.
RUN_NAME_COLUMN = "attributes.`Run Name`"
CREATED_COLUMN = "runDateAndNestInfo"  # the Created column: the run's status icon and its age
# Pixel widths: at 1600 x 1000 with the assistant panel open the table shows 545 px beside its pinned
# columns (checkbox 73, Run Name 190, Created): a swept value, the best job, its objective, the objective,
# rmse_test and mape_test take 448 of them (fit_seconds fits too); tests/test_best_ui.py measures it.
WIDTHS = {"metrics": 72, "params": 62, "tags": 80, CREATED_COLUMN: 130}


def column(kind: str, name: str) -> str:
    """A runs-table column as the UI names it: ``metrics.`rmse_test```."""
    return f"{kind}.`{name}`"


@dataclass(frozen=True)
class RunsView:
    """What varies between experiments' views: the objectives their runs minimise (beyond
    `DECISIVE_METRICS`) and the tags of the values their sweeps swept, each in the order shown."""

    objectives: Tuple[str, ...] = ()
    swept_tags: Tuple[str, ...] = ()

    def decisive(self) -> List[str]:
        """The decisive columns in their order, after the pinned name and status: the swept values, a
        sweep's best job and its objective (``best_<objective>``: a sweep whose objective is not a decisive
        metric, e.g. rmse_validation, crowns one), the metrics, the route, the device."""
        best = []
        if self.swept_tags and self.objectives:
            best = [column("tags", BEST_JOB_TAG), *(column("metrics", metric_key(BEST_PREFIX + name))
                                                   for name in self.objectives)]
        metrics = [*self.objectives, *DECISIVE_METRICS]
        return ([column("tags", name) for name in self.swept_tags] + best
                + [column("metrics", metric_key(name)) for name in metrics]
                + [column("params", name) for name in DECISIVE_PARAMS]
                + [column("tags", name) for name in DECISIVE_TAGS])

    def merged(self, objective: Optional[str] = None, swept_tags: Iterable[str] = ()) -> "RunsView":
        """This view with ``objective`` (when not already a decisive metric) and ``swept_tags`` (first)."""
        objectives = self.objectives
        if objective and objective not in DECISIVE_METRICS and objective not in objectives:
            objectives = (objective, *objectives)
        swept = tuple(dict.fromkeys([*swept_tags, *self.swept_tags]))
        return RunsView(objectives, swept)

    @classmethod
    def parse(cls, stored: Optional[str]) -> "RunsView":
        """The view stored as the tag's JSON (an empty view when there is none, or it is not readable;
        the objectives of a view older than ``columnOrder``, whose metrics were fixed, are not kept)."""
        try:
            view = json.loads(stored or "{}")
            columns = view.get("selectedColumns") or []
        except (ValueError, AttributeError):
            return cls()
        metrics = [c[len("metrics.`"):-1] for c in columns if c.startswith("metrics.`") and "columnOrder" in view]
        tags = [c[len("tags.`"):-1] for c in columns if c.startswith("tags.`")]
        trailing = [name for name in metrics if column("metrics", name) in TRAILING_COLUMNS]
        return cls(tuple(m for m in metrics if m not in DECISIVE_METRICS and m not in trailing
                         and not m.startswith((BEST_PREFIX, *LEGACY_PREFIXES))),
                   tuple(t for t in tags if t.startswith(SWEEP_TAG_PREFIX)))


def widths(columns: Iterable[str]) -> Dict[str, int]:
    """Each column's width (`WIDTHS` by kind), the Created column's too."""
    out = {CREATED_COLUMN: WIDTHS[CREATED_COLUMN]}
    out.update({name: WIDTHS[name.split(".", 1)[0]] for name in columns})
    return out


def runs_view(view: RunsView = RunsView()) -> Dict[str, Any]:
    """The shared view's JSON: runs newest first, `RunsView.decisive` then `TRAILING_COLUMNS`. (A shared
    view cannot expand a parent run: MLflow drops ``runsExpanded`` from it; a sweep's ``+`` lists its jobs.)"""
    decisive = view.decisive()
    shown = [*decisive, *(name for name in TRAILING_COLUMNS if name != "duration")]
    return {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
            "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
            "selectedColumns": shown, "columnOrder": [RUN_NAME_COLUMN, CREATED_COLUMN, *decisive, *TRAILING_COLUMNS],
            "columnWidths": widths(decisive)}


def ensure_runs_view(client: Any, experiment: Any, objective: Optional[str] = None,
                     swept_tags: Iterable[str] = ()) -> None:
    """Store on ``experiment`` (an MLflow Experiment) its view merged with ``objective`` and
    ``swept_tags``, unless the stored one is that already. Runs starting at once on a fresh experiment
    race to store it (the tag's unique key): the view is a convenience of the UI, so a failure to store
    it is logged, never the run's end."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    stored = (experiment.tags or {}).get(RUNS_VIEW_TAG)
    wanted = json.dumps(runs_view(RunsView.parse(stored).merged(objective, swept_tags)))
    if stored == wanted:
        return
    try:
        client.set_experiment_tag(experiment.experiment_id, RUNS_VIEW_TAG, wanted)
    except (MlflowException, SQLAlchemyError) as exc:
        if RUNS_VIEW_TAG not in (client.get_experiment(experiment.experiment_id).tags or {}):
            log.warning("could not store the runs table's view on experiment %s: %s", experiment.experiment_id,
                        str(exc).splitlines()[0])


def ui_base(tracking_uri: str) -> str:
    """The UI's address: the tracking server itself, or `DEFAULT_UI` for a database or file store."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else DEFAULT_UI


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The link that opens one run's page."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}"


def runs_table_url(tracking_uri: str, experiment_id: str) -> str:
    """The link that opens the experiment's runs table in the shared view."""
    return (f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")
