"""What a ``mode=run`` job records in MLflow: params, metrics, the memory report, the design, the
predictions, the coefficients, the plots and the fitted model (and the GCV search that chose the
penalties, `record_selection`)."""

from __future__ import annotations

from typing import Callable, Dict, Optional

import pandas as pd

from tamrun.effects.design import describe
from tamrun.fit.evaluate import group_metrics
from tamrun.fit.unsupported import ARTIFACT
from tamrun.jobs.prepare import Prepared
from tamrun.device.memory_report import memory_report, report_text
from tamrun.pipeline import Fit
from tamrun.fit.gcv import GcvSelection
from tamrun.tracking.artifacts.datasets import dataset_inputs
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.artifacts.run_plots import log_run_plots


def coefficients_frame(fit: Fit) -> pd.DataFrame:
    """One row per group: ``group``, then one column ``<effect>[i]`` per coefficient."""
    model = fit.model
    columns = [f"{name}[{i - s.start}]" for name, s in model.design.block_slices() for i in range(s.start, s.stop)]
    return pd.DataFrame(model.coef.numpy(), index=pd.Index(model.groups, name="group"), columns=columns).reset_index()


def record_selection(tracked: TrackedRun, selection: Optional[GcvSelection], offsets: list) -> None:
    """The GCV search (model.penalties=gcv): params ``gcv_ap.<effect>`` (the chosen log10 penalties),
    metrics gcv_score, gcv_score_configured, gcv_candidates, gcv_seconds, and ``gcv/path.json``."""
    if selection is None:
        return
    tracked.log_params(selection.params())
    tracked.log_metrics(selection.metrics())
    tracked.log_json(selection.path(offsets), "gcv/path.json")


def record_inputs(tracked: TrackedRun, prepared: Prepared) -> None:
    """The run's splits as MLflow dataset inputs (`tamrun.tracking.artifacts.datasets`)."""
    if not tracked.enabled:
        return
    data, splits = prepared.config.data, prepared.splits
    frames = {"train": splits.train, "validation": splits.validation, "test": splits.test}
    tracked.log_inputs(dataset_inputs(data.name, splits.table.path, frames, data.date_column))


def record_fit(tracked: TrackedRun, prepared: Prepared, fit: Fit, table: Callable[[], pd.DataFrame],
               metrics: Dict[str, float], unsupported: pd.DataFrame) -> None:
    """Log everything a fitted run produced (a no-op for every call when tracking is off). ``table``
    builds the predictions table, called only when the CSV or the plots are logged; ``unsupported``: the
    groups withheld from it (`tamrun.fit.unsupported`), logged when there are some, and left out of the
    LoggedModel's input example."""
    config, plan, stats = prepared.config, fit.plan, fit.stats
    tracked.log_params({"route": plan.route, "D": fit.model.design.width, "n_groups": len(fit.model.groups),
                        "memory_bound_by": plan.bound_by})
    tracked.set_tags({"route_reason": plan.reason, "cg_cache_design": plan.cache_design})
    tracked.log_metrics({**metrics, "predict_chunk_groups": plan.predict.groups, "predict_chunk_rows": plan.predict.rows})
    record_selection(tracked, fit.selection, config.model.gcv.offsets)
    if stats.cg_history:
        tracked.log_metric_history("cg_residual", stats.cg_history)
    report = memory_report(plan, prepared.recorder, prepared.oom_log, prepared.limit, prepared.tracker.peak)
    tracked.log_json(report, "memory/report.json")
    tracked.log_text(report_text(report, plan), "memory/report.txt")
    tracked.log_text(describe(fit.model.design) + "\n", "fit/design.txt")
    if config.tracking.log_predictions and tracked.enabled:
        tracked.log_frame(table(), "predictions/predictions.parquet")
        tracked.log_frame(group_metrics(table()), "predictions/group_metrics.csv")
    if len(unsupported):
        tracked.log_frame(unsupported, ARTIFACT)
    tracked.log_frame(coefficients_frame(fit), "fit/coefficients.csv")
    if config.tracking.log_plots and tracked.enabled:
        log_run_plots(tracked, config, fit, table(), metrics, report, prepared.limit)
    if config.tracking.log_model and tracked.enabled:
        from tamrun.tracking.pyfunc_model import LOGGED_MODEL_NAME, log_pyfunc_model  # imported only when used

        test = prepared.splits.test
        if len(unsupported):  # the example's forecasts are the supported groups'
            test = test[~test[config.data.group].isin(unsupported["group"])]
        log_pyfunc_model(tracked, LOGGED_MODEL_NAME, fit.model, test)
