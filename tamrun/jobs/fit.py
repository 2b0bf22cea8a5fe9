"""``mode=run``: fit every group, predict the splits, evaluate, record (`tamrun.jobs.record`).

    solve (under the tracker and the OOM guard) -> predict train / validation / test -> metrics
"""

from __future__ import annotations

import logging
from typing import Dict

import pandas as pd

from tamrun.evaluate import predictions_table, require_finite, split_metrics
from tamrun.jobs.prepare import Prepared
from tamrun.jobs.record import record_fit
from tamrun.jobs.result import RunResult
from tamrun.pipeline import Fit, numerical_fix, solve
from tamrun.progress import ChunkProgress, IterationProgress
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)


def fit_job(prepared: Prepared, tracked: TrackedRun) -> RunResult:
    """Fit, evaluate and record one run from its preparation."""
    config, recorder, metered = prepared.config, prepared.recorder, prepared.metered
    loop = prepared.chunk_loop(ChunkProgress(config.progress.value))
    iterations = IterationProgress(config.solver.max_iter, config.progress.value)
    with recorder.phase("solve", metered):
        fit = solve(config, prepared.features, prepared.plan, prepared.devices, loop, prepared.splits.recipe,
                    iterations)
    iterations.close()
    with recorder.phase("predict", metered):
        predicted_train = fit.predict(fit.train)
        predicted_test = fit.predict(prepared.test)
        validation = prepared.splits.validation
        validation = None if validation is None else fit.predict_frame(validation, "validation")
    with recorder.phase("evaluate"):
        table = evaluation_table(prepared, predicted_train, predicted_test, validation)
        metrics = split_metrics(table)
        require_finite(metrics, "a forecast metric", numerical_fix(config))
    metrics.update(run_metrics(prepared, fit))
    log.info("rmse_train=%.1f rmse_test=%.1f mape_test=%.3f%% fit=%.2fs", metrics["rmse_train"], metrics["rmse_test"],
             metrics["mape_test"], metrics["fit_seconds"])
    with recorder.phase("record"):
        record_fit(tracked, prepared, fit, table, metrics)
    after = {"peak_after_planning_bytes": recorder.peak_after_planning(), **recorder.phase_metrics("record")}
    tracked.log_metrics(after)
    metrics.update(after)
    return RunResult(run_id=None, route=fit.plan.route, width=fit.model.design.width, groups=fit.model.groups,
                     coef=fit.model.coef, metrics=metrics, predictions=table, plan=fit.plan, stats=fit.stats)


def evaluation_table(prepared: Prepared, predicted_train, predicted_test, validation) -> pd.DataFrame:
    """The predictions table of every split: train, validation (if any), test."""
    data, splits = prepared.config.data, prepared.splits
    return pd.concat([
        predictions_table(splits.train, prepared.features.train, predicted_train, data.date_column, data.group, "train"),
        *([] if validation is None else [validation]),
        predictions_table(splits.test, prepared.test, predicted_test, data.date_column, data.group, "test"),
    ], ignore_index=True)


def run_metrics(prepared: Prepared, fit: Fit) -> Dict[str, float]:
    """The phases' times and peaks, the plan's figures, the OOM retries and the CG's report."""
    recorder, plan, stats = prepared.recorder, fit.plan, fit.stats
    metrics = dict(recorder.metrics())
    metrics.update({
        "fit_seconds": recorder.phases["features"].seconds + recorder.phases["solve"].seconds,
        "predicted_peak_bytes": plan.predicted_peak, "minimal_limit_bytes": plan.minimal_limit,
        "tracker_peak_bytes": prepared.tracker.peak, "oom_retries": prepared.oom_log.retries,
        "chunk_groups": stats.group_chunk, "chunk_rows": plan.fit.rows,
        "n_train_rows": float(len(prepared.splits.train)), "n_test_rows": float(len(prepared.splits.test)),
    })
    if plan.route == "cg":
        metrics.update({"cg_iterations": stats.cg_iterations, "cg_final_residual": stats.cg_final_residual,
                        "cg_unconverged_groups": stats.cg_unconverged_groups})
    return metrics
