"""The runs as a fixed-width text table: the UI view's decisive columns (`tamrun.tracking.ui_view`),
figures to 4 significant digits (`tamrun.numbers`), "-" where a run has none."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from tamrun.numbers import significant
from tamrun.tracking.metric_keys import logged_value
from tamrun.tracking.sweep_record.sweep_names import VALUE_TAG_PREFIX
from tamrun.tracking.ui_view import DECISIVE_METRICS, DECISIVE_PARAMS, DECISIVE_TAGS

MISSING = "-"
# Metrics shown before the decisive ones when a run logged them (the objective with a validation split).
OBJECTIVE_METRICS = ("rmse_validation", "rmse_backtest")
GAP = "  "
BEST_MARK = "*"  # the best run's cell in the first column of a ranked table


# A run's cost (tamrun/tco/: its compute seconds at its machine class's price), beside its accuracy.
COST_METRIC = "cost_usd"
ACCURACY = ("rmse", "mape")


def metric_columns(runs: Sequence[Any]) -> List[str]:
    """`OBJECTIVE_METRICS` some run logged, then `DECISIVE_METRICS` with `COST_METRIC` after their accuracy."""
    logged = {key for run in runs for key in run.data.metrics}
    accuracy = [key for key in DECISIVE_METRICS if key.startswith(ACCURACY)]
    rest = [key for key in DECISIVE_METRICS if key not in accuracy]
    return [key for key in OBJECTIVE_METRICS if key in logged] + accuracy + [COST_METRIC] + rest


def swept_values(tags: Dict[str, str]) -> str:
    """A sweep job's swept values, ``toy.m=8`` (the last two parts of each key), or `MISSING`."""
    values = [f"{'.'.join(key[len(VALUE_TAG_PREFIX):].split('.')[-2:])}={value}" for key, value in sorted(tags.items())
              if key.startswith(VALUE_TAG_PREFIX)]
    return " ".join(values) or MISSING


def metric_value(metrics: Dict[str, float], key: str) -> str:
    """A metric (plain name or key, `logged_value`) to 4 significant digits; ``peak_memory_mib`` from
    ``peak_memory_bytes`` for a run older than that metric."""
    value = logged_value(metrics, key)
    if key == "peak_memory_mib" and value is None and logged_value(metrics, "peak_memory_bytes") is not None:
        return significant(logged_value(metrics, "peak_memory_bytes") / 2**20)
    return significant(value) if value is not None else MISSING


def row(run: Any, metrics: Sequence[str]) -> List[str]:
    """One run's cells: name, status, ``metrics``, the decisive params and tags, its swept values."""
    data = run.data
    return ([run.info.run_name or run.info.run_id, run.info.status]
            + [metric_value(data.metrics, key) for key in metrics]
            + [data.params.get(key, MISSING) for key in DECISIVE_PARAMS]
            + [data.tags.get(key, MISSING) for key in DECISIVE_TAGS] + [swept_values(data.tags)])


def render(runs: Sequence[Any], marked: Optional[str] = None) -> str:
    """The table of ``runs`` (header first), columns padded to their widest cell, numbers right-aligned;
    given a ``marked`` run id, a first column `BEST_MARK`s that run."""
    metrics = metric_columns(runs)
    header = ["name", "status", *metrics, *DECISIVE_PARAMS, *DECISIVE_TAGS, "swept"]
    rows = [header] + [row(run, metrics) for run in runs]
    if marked is not None:
        rows = [["best", *rows[0]]] + [[BEST_MARK if run.info.run_id == marked else "", *cells]
                                       for run, cells in zip(runs, rows[1:])]
        header = rows[0]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = {header.index(key) for key in metrics}
    lines = [GAP.join(cell.rjust(width) if i in numeric else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(r, widths))).rstrip() for r in rows]
    return "\n".join(lines)
