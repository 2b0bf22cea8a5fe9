"""``mode=adaptive``: the static fit, then sliding-window refits over the test period, evaluated and recorded.

    `Prepared` (data, features, static plan) -> static fit + forecast -> history batch (the rows from the
    first window's start to the test end, date-sorted per group) -> schedule -> window plan -> window
    fits (batches of windows x groups) -> per-step and overall metrics -> MLflow

The overall adaptive forecast of a test day comes from the latest refit on or before it (the days
[t_k, t_k + step) from refit k); the stepped metrics rmse_step / mape_step score each refit's whole
horizon [t_k, t_k + horizon).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict

import numpy as np
import pandas as pd
import torch

from tamrun.adaptive.budget import WindowPlan, plan_windows
from tamrun.adaptive.fit import WindowFit, WindowFitter, solver_and_phase_metrics
from tamrun.adaptive.kalman_job import kalman_job
from tamrun.adaptive.plots import adaptive_figure
from tamrun.adaptive.windows import WindowSchedule, build_schedule, gather_systems, history_dates, span_rows
from tamrun.config.schema import AdaptiveMethod
from tamrun.data.batch import GroupedBatch
from tamrun.fit.evaluate import mape, require_finite, require_plausible, rmse
from tamrun.fit.fitted import prediction_batch
from tamrun.jobs.bands import day_ahead_bands, naive_bands, residual_history
from tamrun.jobs.prepare import Prepared
from tamrun.jobs.record import record_selection
from tamrun.jobs.result import RunResult
from tamrun.numbers import significant
from tamrun.memory.footprint import problem_size, recording_bytes
from tamrun.memory.guard import OomLog
from tamrun.device.profiler import PhaseRecorder
from tamrun.machine.tracker import MemoryTracker
from tamrun.pipeline import Fit, numerical_fix, solve
from tamrun.fit.progress import ChunkProgress
from tamrun.tco.run import priced_phases, priced_work
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.artifacts.run_plots import log_interval_figure

log = logging.getLogger(__name__)


def own_rows(schedule: WindowSchedule):
    """(k, g, n, j): for every history row n of group g in refit k's own days, its offset j in k's forecast."""
    return span_rows(schedule.hi, schedule.own)


def step_metrics(schedule: WindowSchedule, history, forecast: torch.Tensor) -> Dict[str, list]:
    """rmse and mape of every refit's forecast over its horizon rows (all groups)."""
    out: Dict[str, list] = {"rmse_step": [], "mape_step": []}
    groups = np.arange(schedule.n_groups)
    for k in range(schedule.n_windows):
        actual = gather_systems(history, groups, schedule.hi[k], schedule.end[k])
        real = actual.weight > 0
        y, predicted = actual.y[real].numpy(), forecast[k, :, :real.shape[1]][real].numpy()
        out["rmse_step"].append(rmse(y, predicted) if y.size else float("nan"))
        out["mape_step"].append(mape(y, predicted) if y.size else float("nan"))
    return out


@dataclass
class History:
    """The rows the windows are cut from: every row from the first window's start to the test end, as
    a batch of the training groups (date-sorted per group), with their dates (G, N) and the refit
    schedule over them."""

    batch: GroupedBatch
    dates: np.ndarray
    schedule: WindowSchedule


def history(prepared: Prepared) -> History:
    """The history batch and the schedule of the refits over the test period."""
    config, splits, train = prepared.config, prepared.splits, prepared.features.train
    data, ada = config.data, config.adaptive
    test_start = pd.Timestamp(config.split.test_start).normalize()
    frame = pd.concat([splits.train, splits.test]).sort_values(data.date_column, kind="stable")
    frame = frame[frame[data.date_column] >= test_start - pd.Timedelta(days=ada.window)].reset_index(drop=True)
    batch = prediction_batch(prepared.features.design, train.groups, splits.recipe, train.x.dtype, frame)
    dates = history_dates(batch, frame[data.date_column].to_numpy())
    schedule = build_schedule(dates, splits.train[data.date_column].min(), test_start,
                              splits.test[data.date_column].max(), ada)
    return History(batch, dates, schedule)


def window_plan(prepared: Prepared, past: History) -> WindowPlan:
    """The plan of one window's problem (the first window's rows) and its batches."""
    config, schedule, design = prepared.config, past.schedule, prepared.features.design
    first = gather_systems(past.batch, np.arange(schedule.n_groups), schedule.lo[0], schedule.hi[0])
    size = problem_size(len(first.groups), first.x.shape[1], design, first.x.element_size(), config.solver,
                        schedule.horizon_rows)
    tracking = config.tracking  # the forecast table is built for the metrics, recorded or not
    reserve = recording_bytes(len(prepared.splits.test), True, tracking.enabled and tracking.log_plots, False,
                              len(config.intervals.levels))
    return plan_windows(config, size, prepared.devices, schedule.n_windows, schedule.step_rows,
                        len(past.batch.columns), reserve)


def adaptive_job(prepared: Prepared, tracked: TrackedRun) -> RunResult:
    """``mode=adaptive``: sliding-window refits (`sliding_job`) or the Kalman filter (`kalman_job`)."""
    if prepared.config.adaptive.method == AdaptiveMethod.kalman:
        return kalman_job(prepared, tracked)
    return sliding_job(prepared, tracked)


def sliding_job(prepared: Prepared, tracked: TrackedRun) -> RunResult:
    """Fit the static model and the sliding-window refits, evaluate both on the test period, record."""
    config, recorder, devices = prepared.config, prepared.recorder, prepared.devices
    with recorder.phase("static"):
        static = solve(config, prepared.features, prepared.plan, devices, prepared.chunk_loop(),
                       prepared.splits.recipe)
    with recorder.phase("schedule"):
        past = history(prepared)
        plan = window_plan(prepared, past)
        static_history = static.predict(past.batch)
    schedule, ada = past.schedule, config.adaptive
    log.info("adaptive: %d refits every %d day(s) on %d-day windows (up to %d rows), route %s%s, %d window(s) x "
             "%d group(s) per batch, window budget %d bytes", schedule.n_windows, ada.step, ada.window,
             schedule.window_rows, plan.plan.route, " (up/down-dated Grams)" if plan.updating else "",
             plan.windows, plan.groups, plan.budget)
    tracker = MemoryTracker(plan.budget if prepared.limit is not None or plan.plan.hard_bound else None,
                            plan.plan.overhead)
    loop = prepared.chunk_loop(ChunkProgress(config.progress.value, "windows"), tracker)
    with recorder.phase("adaptive", prepared.metered):
        fitted = WindowFitter(config, static.model.design, devices, past.batch, schedule, plan, loop).fit()
    with recorder.phase("evaluate"):
        table = adaptive_table(past, fitted, static_history)
        steps = step_metrics(schedule, past.batch, fitted.forecast)
    metrics = _metrics(table, fitted, schedule, plan, recorder, prepared.oom_log, tracker)
    metrics.update(priced_work(config, prepared.measured_on, priced_phases(recorder.seconds())))
    table, interval_metrics = day_ahead_bands(config, table, "adaptive", residual_history(table.iloc[:0], "adaptive"),
                                              naive_bands(config, static), static.model.groups)
    metrics.update(interval_metrics)
    require_finite({name: metrics[name] for name in ("rmse_test", "mape_test", "rmse_test_static", "mape_test_static")},
                   "a forecast metric", numerical_fix(config))
    require_plausible({"test (adaptive)": table["adaptive"].to_numpy(), "test (static)": table["static"].to_numpy()},
                      metrics, prepared.splits.train[config.data.target].to_numpy(), numerical_fix(config))
    log.info("adaptive: rmse_test=%s (static %s), %s s per refit, %d windows per batch",
             significant(metrics["rmse_test"]), significant(metrics["rmse_test_static"]),
             significant(metrics["seconds_per_refit"]),
             fitted.windows_per_batch)
    _record(tracked, prepared, table, metrics, steps, plan, static, fitted)
    coef = fitted.coef if fitted.coef is not None else torch.empty(0)
    return RunResult(run_id=None, route=plan.plan.route, width=static.model.design.width,
                     groups=static.model.groups, coef=coef, metrics=metrics, table=lambda: table,
                     plan=plan.plan, stats=fitted.stats)


def adaptive_table(past: History, fitted: WindowFit, static_history: torch.Tensor) -> pd.DataFrame:
    """One row per test row: date, group, the refit that forecast it, actual, adaptive and static."""
    schedule, batch = past.schedule, past.batch
    k, g, n, j = own_rows(schedule)
    return pd.DataFrame({
        "date": past.dates[g, n], "group": np.asarray(batch.groups, dtype=object)[g],
        "refit": schedule.dates.to_numpy()[k], "actual": batch.y[g, n].numpy(),
        "adaptive": fitted.forecast[k, g, j].numpy(), "static": static_history[g, n].numpy(),
    }).sort_values(["date", "group"], kind="stable").reset_index(drop=True)


def _metrics(table: pd.DataFrame, fitted: WindowFit, schedule: WindowSchedule, window_plan: WindowPlan,
             recorder: PhaseRecorder, oom_log: OomLog, tracker: MemoryTracker) -> Dict[str, float]:
    """Test RMSE / MAPE of the adaptive and static forecasts, the batches, the budget, the phases."""
    seconds = recorder.phases["adaptive"].seconds
    metrics = {
        "rmse_test": rmse(table["actual"].to_numpy(), table["adaptive"].to_numpy()),
        "mape_test": mape(table["actual"].to_numpy(), table["adaptive"].to_numpy()),
        "rmse_test_static": rmse(table["actual"].to_numpy(), table["static"].to_numpy()),
        "mape_test_static": mape(table["actual"].to_numpy(), table["static"].to_numpy()),
        "n_refits": float(schedule.n_windows), "window_rows": float(schedule.window_rows),
        "windows_per_batch": float(fitted.windows_per_batch), "window_batches": float(len(fitted.batch_seconds)),
        "groups_per_batch": float(window_plan.groups), "window_budget_bytes": float(window_plan.budget),
        "predicted_batch_bytes": float(window_plan.batch_bytes), "tracker_peak_bytes": float(tracker.peak),
        "adaptive_fit_seconds": seconds, "seconds_per_refit": seconds / schedule.n_windows,
        "static_fit_seconds": recorder.phases["static"].seconds, "oom_retries": float(oom_log.retries),
    }
    return solver_and_phase_metrics(metrics, window_plan.plan.route, fitted.stats, recorder, "adaptive")


def _record(tracked: TrackedRun, prepared: Prepared, table: pd.DataFrame, metrics: Dict[str, float],
            steps: Dict[str, list], window_plan: WindowPlan, static: Fit, fitted: WindowFit) -> None:
    """Log the adaptive run: params, metrics, stepped metrics, the window plan, predictions, plot."""
    config, recorder, oom_log = prepared.config, prepared.recorder, prepared.oom_log
    tracked.set_tags({"route_reason": window_plan.plan.reason})
    tracked.log_params({"route": window_plan.plan.route, "D": static.model.design.width, "adaptive_updating": window_plan.updating,
                        "adaptive_windows_per_batch": window_plan.windows,
                        "adaptive_groups_per_batch": window_plan.groups, "memory_bound_by": window_plan.plan.bound_by})
    tracked.log_metrics(metrics)
    record_selection(tracked, static.selection, config.model.gcv.offsets)
    for name, values in steps.items():
        tracked.log_metric_history(name, values)
    tracked.log_metric_history("batch_seconds", fitted.batch_seconds)
    tracked.log_json({"window_plan": {"groups": window_plan.groups, "windows": window_plan.windows,
                                      "budget": window_plan.budget, "batch_bytes": window_plan.batch_bytes,
                                      "plan": window_plan.plan.as_dict()},
                      "oom_events": oom_log.as_dicts(), "phases": {name: vars(p) for name, p in recorder.phases.items()}},
                     "memory/adaptive.json")
    if config.tracking.log_predictions:
        tracked.log_frame(table, "predictions/adaptive.csv")
    if config.tracking.log_plots:
        title = (f"{config.model.name}: test RMSE adaptive {metrics['rmse_test']:.1f}, static "
                 f"{metrics['rmse_test_static']:.1f} ({config.adaptive.window}-day windows, step {config.adaptive.step})")
        tracked.log_figure(adaptive_figure(table, title), "plots/adaptive_forecast.png")
        log_interval_figure(tracked, table, "adaptive", config.data.unit)
