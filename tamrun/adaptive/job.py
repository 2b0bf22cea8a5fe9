"""``mode=adaptive``: the static fit, then sliding-window refits over the test period, evaluated and recorded.

    prepare (data, features, static plan) -> static fit + forecast -> history batch (the rows from the
    first window's start to the test end, date-sorted per group) -> schedule -> window plan -> window
    fits (batches of windows x groups) -> per-step and overall metrics -> MLflow

The overall adaptive forecast of a test day comes from the latest refit on or before it (the days
[t_k, t_k + step) from refit k); the stepped metrics rmse_step / mape_step score each refit's whole
horizon [t_k, t_k + horizon).
"""

from __future__ import annotations

import logging
from typing import Any, Dict

import numpy as np
import pandas as pd
import torch

from tamrun.adaptive.budget import plan_windows
from tamrun.adaptive.fit import WindowFit, WindowFitter
from tamrun.adaptive.plots import adaptive_figure
from tamrun.adaptive.windows import WindowSchedule, build_schedule, gather_systems, history_dates
from tamrun.config.schema import Config
from tamrun.device import DeviceManager
from tamrun.evaluate import mape, rmse
from tamrun.memory.guard import OomLog
from tamrun.memory.meter import TensorMeter
from tamrun.memory.profiler import PhaseRecorder
from tamrun.memory.tracker import MemoryTracker
from tamrun.memory.units import parse_size
from tamrun.pipeline import Features, prediction_batch, problem_size, solve
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)


def own_rows(schedule: WindowSchedule):
    """(k, g, n, j): for every history row n of group g in refit k's own days, its offset j in k's forecast."""
    counts = (schedule.own - schedule.hi).ravel()
    k, g = np.divmod(np.repeat(np.arange(counts.size), counts), schedule.n_groups)
    j = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return k, g, schedule.hi[k, g] + j, j


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


def run_adaptive(config: Config, specs: Dict[str, Any], devices: DeviceManager, tracked: TrackedRun):
    """Fit the static model and the sliding-window refits, evaluate both on the test period, record."""
    from tamrun.runner import RunResult, _prepare  # the runner imports this module lazily

    if config.memory.meter:
        TensorMeter.warm_up()
    recorder = PhaseRecorder(devices)
    train_frame, test_frame, features, test, plan, _ = _prepare(config, specs, devices, recorder)  # no validation: refused in config checks
    limit, oom_log = parse_size(config.memory.limit), OomLog()
    data, ada = config.data, config.adaptive
    with recorder.phase("static"):
        static = solve(config, features, plan, devices, oom_log, MemoryTracker(plan.budget if limit else None,
                                                                                plan.overhead))
    with recorder.phase("schedule"):
        test_start = pd.Timestamp(config.split.test_start).normalize()
        first = test_start - pd.Timedelta(days=ada.window)
        frame = pd.concat([train_frame, test_frame]).sort_values(data.date_column, kind="stable")
        frame = frame[frame[data.date_column] >= first].reset_index(drop=True)
        history = prediction_batch(config, features.design, features.train.groups, frame, features.train.x.dtype)
        dates = history_dates(history, frame[data.date_column].to_numpy())
        schedule = build_schedule(dates, train_frame[data.date_column].min(), test_start,
                                  test_frame[data.date_column].max(), ada)
        first_window = gather_systems(history, np.arange(schedule.n_groups), schedule.lo[0], schedule.hi[0])
        size = problem_size(Features(first_window, features.design), schedule.horizon_rows, config)
        window_plan = plan_windows(config, size, devices, schedule.n_windows, schedule.step_rows, len(history.columns))
        static_history = static.dispatcher.predict(history, static.coef)
    log.info("adaptive: %d refits every %d day(s) on %d-day windows (up to %d rows), route %s%s, %d window(s) x "
             "%d group(s) per batch, window budget %d bytes", schedule.n_windows, ada.step, ada.window,
             schedule.window_rows, window_plan.plan.route, " (up/down-dated Grams)" if window_plan.updating else "",
             window_plan.windows, window_plan.groups, window_plan.budget)
    tracker = MemoryTracker(window_plan.budget if limit is not None else None, window_plan.plan.overhead)
    with recorder.phase("adaptive", config.memory.meter):
        fitted = WindowFitter(config, features.design.to(devices.device), devices, history, schedule, window_plan,
                              oom_log, tracker, recorder.snapshot).fit()
    with recorder.phase("evaluate"):
        k, g, n, j = own_rows(schedule)
        table = pd.DataFrame({
            "date": dates[g, n], "group": np.asarray(history.groups, dtype=object)[g],
            "refit": schedule.dates.to_numpy()[k], "actual": history.y[g, n].numpy(),
            "adaptive": fitted.forecast[k, g, j].numpy(), "static": static_history[g, n].numpy(),
        }).sort_values(["date", "group"], kind="stable").reset_index(drop=True)
        steps = step_metrics(schedule, history, fitted.forecast)
    metrics = _metrics(table, fitted, schedule, window_plan, recorder, oom_log, tracker)
    log.info("adaptive: rmse_test=%.1f (static %.1f), %.4f s per refit, %d windows per batch",
             metrics["rmse_test"], metrics["rmse_test_static"], metrics["seconds_per_refit"],
             fitted.windows_per_batch)
    _record(tracked, config, table, metrics, steps, window_plan, static, fitted, recorder, oom_log)
    coef = fitted.coef if fitted.coef is not None else torch.empty(0)
    return RunResult(run_id=None, route=window_plan.plan.route, width=features.design.width,
                     groups=features.train.groups, coef=coef, metrics=metrics, predictions=table,
                     plan=window_plan.plan, stats=fitted.stats)


def _metrics(table, fitted: WindowFit, schedule, window_plan, recorder, oom_log, tracker) -> Dict[str, float]:
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
    if window_plan.plan.route == "cg":
        metrics.update({"cg_iterations": fitted.stats.cg_iterations,
                        "cg_unconverged_groups": fitted.stats.cg_unconverged_groups})
    metrics.update(recorder.metrics())
    metrics["working_peak_bytes"] = recorder.working_peak(("adaptive",))  # the phase the window budget governs
    return metrics


def _record(tracked: TrackedRun, config: Config, table, metrics, steps, window_plan, static, fitted, recorder,
            oom_log) -> None:
    tracked.log_params({"route": window_plan.plan.route, "route_reason": window_plan.plan.reason,
                        "D": static.design.width, "adaptive_updating": window_plan.updating,
                        "adaptive_windows_per_batch": window_plan.windows,
                        "adaptive_groups_per_batch": window_plan.groups})
    tracked.log_metrics(metrics)
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
