"""The best run of `python -m tamrun.compare`'s selection, its logged model, and its registration.

The runs are ranked on one metric (``--sort``; by default the objective a sweep chooses on:
``rmse_validation`` when a shown run logged it, else ``rmse_backtest``, else ``rmse_test``), least first (``--descending``: most
first). The best is the first FINISHED run with a finite value: a failed run's metric never wins.
``--register NAME`` makes its LoggedModel a new version of the registered model NAME
(`tamrun.compare.register`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from tamrun.errors import ConfigError
from tamrun.tracking.metric_keys import logged_value

# The metric a selection is ranked on when --sort is not given: the first one a shown run logged.
DEFAULT_METRICS = ("rmse_validation", "rmse_backtest", "rmse_test")


@dataclass
class Best:
    """The best run, the metric it won on and its value."""

    run: Any
    metric: str
    value: float

    @property
    def name(self) -> str:
        return self.run.info.run_name or self.run.info.run_id


def ranking_metric(runs: Sequence[Any], sort: Optional[str]) -> str:
    """``sort`` when given, else the first of `DEFAULT_METRICS` a run of ``runs`` logged (the last one
    when none did)."""
    if sort:
        return sort
    logged = {key for run in runs for key in run.data.metrics}
    return next((key for key in DEFAULT_METRICS if key in logged), DEFAULT_METRICS[-1])


def _value(run: Any, metric: str) -> Optional[float]:
    """The run's finite value of ``metric`` when it FINISHED, else None (it cannot be the best)."""
    value = logged_value(run.data.metrics, metric)
    if run.info.status != "FINISHED" or value is None or not math.isfinite(value):
        return None
    return float(value)


def ranked(runs: Sequence[Any], metric: str, descending: bool = False) -> List[Any]:
    """``runs`` with a FINISHED, finite ``metric`` first, least first (most with ``descending``), then
    the others in their order."""
    scored = [run for run in runs if _value(run, metric) is not None]
    scored.sort(key=lambda run: _value(run, metric), reverse=descending)
    return scored + [run for run in runs if _value(run, metric) is None]


def best_run(runs: Sequence[Any], metric: str, descending: bool = False) -> Optional[Best]:
    """The first of `ranked`, when it has a value; None when no run FINISHED with one."""
    order = ranked(runs, metric, descending)
    if not order or _value(order[0], metric) is None:
        return None
    return Best(order[0], metric, _value(order[0], metric))


def check_sort(metric: str, runs: Sequence[Any]) -> None:
    """Refuse a ``--sort`` metric that no shown run logged, naming the metrics they did."""
    import difflib

    from tamrun.tracking.ui_view import DECISIVE_METRICS

    logged = sorted({key for run in runs for key in run.data.metrics})
    if runs and all(logged_value(run.data.metrics, metric) is None for run in runs):
        near = difflib.get_close_matches(metric, logged, n=3) + [key for key in DECISIVE_METRICS if key in logged]
        raise ConfigError("--sort", metric, "no shown run logged that metric",
                          f"sort on one they logged, e.g. {', '.join(dict.fromkeys(near)) or 'rmse_test'}")


def logged_model_uri(client: Any, run: Any) -> Optional[str]:
    """``models:/<model_id>`` of the newest LoggedModel the run logged (None: it logged none, e.g. with
    tracking.log_model=false)."""
    models = client.search_logged_models([run.info.experiment_id],
                                         filter_string=f"source_run_id = '{run.info.run_id}'",
                                         order_by=[{"field_name": "creation_time", "ascending": False}],
                                         max_results=1)
    return f"models:/{models[0].model_id}" if models else None
