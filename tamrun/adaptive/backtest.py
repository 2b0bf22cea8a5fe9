"""``mode=backtest``: a rolling-origin backtest, each window trained up to its cut-off and scored after it.

    `Prepared` (every row from split.train_start to the last horizon, `backtest_split`) -> history batch
    (date-sorted per group) -> windows (`tamrun.adaptive.backtest_windows`) -> each window's design
    fitted on its training rows -> window plan -> segments of windows x groups fitted
    (`tamrun.adaptive.backtest_fit`) -> each window's RMSE / MAPE -> MLflow

Window k's forecast equals a plain run's (mode=run) with split.train_start its first training day,
split.train_end the day before its cut-off and the test period its horizon (docs/backtest.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pandas as pd
import torch

from tamrun.adaptive.backtest_fit import BacktestFit, fit_backtest
from tamrun.adaptive.fit import solver_and_phase_metrics
from tamrun.adaptive.backtest_windows import BacktestSchedule, build_backtest, check_windows, window_designs
from tamrun.adaptive.budget import WindowPlan, plan_windows
from tamrun.adaptive.plots import backtest_figure
from tamrun.adaptive.windows import gather_systems, history_dates, span_rows
from tamrun.config.offsets import cutoff_days, horizon_ends
from tamrun.config.schema import BacktestRefit, Config
from tamrun.data.batch import GroupedBatch, build_batch
from tamrun.data.table import Table
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign
from tamrun.errors import DataError
from tamrun.fit.evaluate import mape, require_finite, require_plausible, rmse
from tamrun.fit.progress import ChunkProgress
from tamrun.device.manager import DeviceManager
from tamrun.jobs.prepare import Prepared, prepare
from tamrun.jobs.result import RunResult
from tamrun.machine.tracker import MemoryTracker
from tamrun.memory.footprint import problem_size, recording_bytes
from tamrun.numbers import significant
from tamrun.pipeline import numerical_fix
from tamrun.tco.run import priced_phases, priced_work
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)

DAY = pd.Timedelta(days=1)


def backtest_split(config: Config) -> Config:
    """The split a backtest reads: training up to the day before split.test_start, the test period up to
    the day after the last window's horizon (a local day of data.timezone may end on the next day of the
    table's time; the windows' rows are cut at their own bounds). split.train_end and split.test_end are not
    used by mode=backtest.
    `ConfigError` when split.train_start leaves the first window no day to train on."""
    cutoffs = cutoff_days(config.split.test_start, config.backtest)
    start = config.split.train_start
    if start is not None and pd.Timestamp(str(start)).normalize() >= cutoffs[0]:
        raise DataError("split.test_start", config.split.test_start, f"the first window's cut-off is on or before "
                        f"split.train_start={start}, so it has no training rows",
                        "start split.test_start after split.train_start")
    last = horizon_ends(cutoffs, config.backtest)[-1]
    split = replace(config.split, train_end=f"{cutoffs[0] - DAY:%Y-%m-%d}", test_end=f"{last:%Y-%m-%d}")
    return replace(config, split=split)


def prepare_backtest(config: Config, specs: Dict[str, Any], devices: DeviceManager,
                     libraries_loaded: Optional[Callable[[], None]], table: Optional[Table] = None) -> Prepared:
    """`prepare` on the backtest's split (`backtest_split`) of ``table`` (the job's); a training split
    without rows is the first window's (its split.train_end is the backtest's, not the user's)."""
    try:
        return prepare(config, specs, devices, libraries_loaded=libraries_loaded, table=table)
    except DataError as error:
        if error.field != "split.train_end":
            raise
        raise DataError("split.test_start", config.split.test_start, f"the first window has no training rows "
                        f"before its cut-off: {error.problem}", "start split.test_start later, after the data's "
                        "first days") from None


@dataclass
class Backtest:
    """Every row the windows are cut from, as a batch of the training groups (date-sorted per group), their
    dates (G, N), the windows over them and each window's design."""

    batch: GroupedBatch
    dates: np.ndarray
    schedule: BacktestSchedule
    designs: List[AdditiveDesign]


def backtest_history(prepared: Prepared) -> Backtest:
    """The history batch, the windows (checked against the data) and each window's design."""
    config, splits, train = prepared.config, prepared.splits, prepared.features.train
    data = config.data
    frame = pd.concat([splits.train, splits.test]).sort_values(data.date_column, kind="stable").reset_index(drop=True)
    design = prepared.features.design
    batch = build_batch(frame, design.columns, data.target, data.group, train.x.dtype, groups=train.groups)
    dates = history_dates(batch, frame[data.date_column].to_numpy())
    first = pd.Timestamp(config.split.train_start).normalize() if config.split.train_start else None
    schedule = build_backtest(dates, config.backtest, config.split.test_start, first, data.timezone)
    check_windows(schedule, batch, frame[data.date_column].max(), data.timezone, config.backtest)
    designs = window_designs(design, batch, schedule.rows, config.backtest.refit)
    check_levels(designs, batch, schedule)
    return Backtest(batch, dates, schedule, designs)


def check_levels(designs: List[AdditiveDesign], batch: GroupedBatch, schedule: BacktestSchedule) -> None:
    """`DataError` when a window scores a categorical level its training rows never had (a plain run refuses
    it so, `tamrun.fit.fitted.prediction_batch`)."""
    every = np.arange(len(batch.groups))
    for k, design in enumerate(designs):
        effects = [e for e in design.effects if isinstance(e, CategoricalEffect)]
        if not effects:
            return
        scored = gather_systems(batch, every, schedule.ahead[k], schedule.rows.end[k])
        for effect in effects:
            values = scored.x[..., design.columns.index(effect.column)][scored.weight > 0].numpy()
            unseen = effect.unseen_levels(values)
            if unseen:
                raise DataError(f"model.effects.{effect.name}.column", effect.column,
                                f"level(s) {unseen[:5]} appear in window {k}'s horizon (cut-off "
                                f"{schedule.cutoffs[k]:%Y-%m-%d}) but never in its training rows",
                                "start split.test_start later, train on a longer period, or merge rare levels")


def backtest_plan(prepared: Prepared, past: Backtest) -> WindowPlan:
    """The plan of one window's problem (the longest window, the widest design) and its batches."""
    config, rows = prepared.config, past.schedule.rows
    widest = max(past.designs, key=lambda design: design.width)
    horizon = max(1, int((rows.end - past.schedule.ahead).max()))
    size = problem_size(rows.n_groups, rows.window_rows, widest, past.batch.x.element_size(), config.solver, horizon)
    tracking = config.tracking
    reserve = recording_bytes(int(past.schedule.scored_rows().sum()), True, tracking.enabled and tracking.log_plots,
                              False, 0)
    return plan_windows(config, size, prepared.devices, rows.n_windows, rows.step_rows, len(past.batch.columns),
                        reserve, backtest=True)


def backtest_job(prepared: Prepared, tracked: TrackedRun) -> RunResult:
    """Fit every window, score each on its horizon, record."""
    config, recorder = prepared.config, prepared.recorder
    with recorder.phase("schedule"):
        past = backtest_history(prepared)
        plan = backtest_plan(prepared, past)
    log.info("backtest: %d window(s) (refit %s, step %s, horizon %s), route %s%s, %d window(s) x %d group(s) per "
             "batch, window budget %d bytes", past.schedule.n_windows, config.backtest.refit.value,
             config.backtest.step, config.backtest.horizon, plan.plan.route,
             " (up/down-dated Grams)" if plan.updating else "", plan.windows, plan.groups, plan.budget)
    tracker = MemoryTracker(plan.budget if prepared.limit is not None or plan.plan.hard_bound else None,
                            plan.plan.overhead)
    loop = prepared.chunk_loop(ChunkProgress(config.progress.value, "windows"), tracker)
    with recorder.phase("backtest", prepared.metered):
        fitted = fit_backtest(config, past.designs, prepared.devices, past.batch, past.schedule, plan, loop)
    with recorder.phase("evaluate"):
        table = backtest_table(past, fitted)
        windows = window_table(past, table, config.backtest.refit)
    metrics = backtest_metrics(windows, fitted, plan, prepared, tracker)
    metrics.update(priced_work(config, prepared.measured_on, priced_phases(recorder.seconds())))
    require_finite({"rmse_backtest": metrics["rmse_backtest"], "mape_backtest": metrics["mape_backtest"],
                    **{f"rmse_window[{k}]": value for k, value in enumerate(windows["rmse"])}},
                   "a forecast metric", numerical_fix(config))
    require_plausible({"backtest": table["predicted"].to_numpy()}, {"rmse_backtest": metrics["rmse_backtest"]},
                      prepared.splits.train[config.data.target].to_numpy(), numerical_fix(config))
    log.info("backtest: rmse_backtest=%s mape_backtest=%s%% over %d windows (%d design segment(s)), %s s per window",
             significant(metrics["rmse_backtest"]), significant(metrics["mape_backtest"]), len(windows),
             len(fitted.segments), significant(metrics["seconds_per_window"]))
    record_backtest(tracked, prepared, table, windows, metrics, plan, fitted, past.designs[0].width)
    return RunResult(run_id=None, route=plan.plan.route, width=past.designs[0].width, groups=list(past.batch.groups),
                     coef=torch.empty(0), metrics=metrics, table=lambda: table, plan=plan.plan, stats=fitted.stats)


def backtest_table(past: Backtest, fitted: BacktestFit) -> pd.DataFrame:
    """One row per scored row of every window: window, cutoff, date, group, actual, predicted."""
    schedule, batch = past.schedule, past.batch
    k, g, n, j = span_rows(schedule.ahead, schedule.rows.end)
    return pd.DataFrame({
        "window": k, "cutoff": schedule.cutoffs.to_numpy()[k], "date": past.dates[g, n],
        "group": np.asarray(batch.groups, dtype=object)[g], "actual": batch.y[g, n].numpy(),
        "predicted": fitted.forecast[k, g, j].numpy(),
    }).sort_values(["window", "date", "group"], kind="stable").reset_index(drop=True)


def window_table(past: Backtest, table: pd.DataFrame, refit: BacktestRefit) -> pd.DataFrame:
    """One row per window: its cut-off, first and last training day, training rows, last day of its horizon,
    scored rows, RMSE and MAPE (over every group's rows)."""
    schedule, rows = past.schedule, past.schedule.rows
    first = []
    for k, start in enumerate(schedule.starts):
        fed = np.nonzero(rows.hi[k] > rows.lo[k])[0]
        first.append(start if start is not None else pd.Timestamp(past.dates[fed, rows.lo[k, fed]].min()).normalize())
    scores = [(rmse(part["actual"].to_numpy(), part["predicted"].to_numpy()),
               mape(part["actual"].to_numpy(), part["predicted"].to_numpy()))
              for _, part in table.groupby("window", sort=True)]
    ends = schedule.cutoffs[:1].repeat(schedule.n_windows) if refit == BacktestRefit.once else schedule.cutoffs
    return pd.DataFrame({
        "window": np.arange(schedule.n_windows), "cutoff": schedule.cutoffs.strftime("%Y-%m-%d"),
        "train_start": [f"{day:%Y-%m-%d}" for day in first], "train_end": (ends - DAY).strftime("%Y-%m-%d"),
        "train_rows": schedule.train_rows(), "horizon_end": (schedule.ends - DAY).strftime("%Y-%m-%d"),
        "scored_rows": schedule.scored_rows(), "rmse": [s[0] for s in scores], "mape": [s[1] for s in scores],
    })


def backtest_metrics(windows: pd.DataFrame, fitted: BacktestFit, plan: WindowPlan, prepared: Prepared,
                     tracker: MemoryTracker) -> Dict[str, float]:
    """rmse_backtest / mape_backtest (means over the windows), the batches, the budget, the phases."""
    recorder = prepared.recorder
    seconds = recorder.phases["backtest"].seconds
    metrics = {
        "rmse_backtest": float(windows["rmse"].mean()), "mape_backtest": float(windows["mape"].mean()),
        "backtest_windows": float(len(windows)), "design_segments": float(len(fitted.segments)),
        "fresh_grams": float(fitted.fresh_grams), "windows_per_batch": float(fitted.windows_per_batch),
        "window_batches": float(len(fitted.batch_seconds)), "groups_per_batch": float(plan.groups),
        "window_budget_bytes": float(plan.budget), "predicted_batch_bytes": float(plan.batch_bytes),
        "tracker_peak_bytes": float(tracker.peak), "backtest_fit_seconds": seconds,
        "seconds_per_window": seconds / max(1, len(windows)), "oom_retries": float(prepared.oom_log.retries),
    }
    return solver_and_phase_metrics(metrics, plan.plan.route, fitted.stats, recorder, "backtest")


def record_backtest(tracked: TrackedRun, prepared: Prepared, table: pd.DataFrame, windows: pd.DataFrame,
                    metrics: Dict[str, float], plan: WindowPlan, fitted: BacktestFit, width: int) -> None:
    """Log the backtest: params, metrics, each window's RMSE / MAPE as stepped metrics, the window table,
    the plan, the predictions and the plot."""
    config, recorder = prepared.config, prepared.recorder
    tracked.set_tags({"route_reason": plan.plan.reason})
    tracked.log_params({"route": plan.plan.route, "D": width,
                        "backtest_updating": plan.updating, "backtest_windows_per_batch": plan.windows,
                        "backtest_groups_per_batch": plan.groups, "memory_bound_by": plan.plan.bound_by})
    tracked.log_metrics(metrics)
    tracked.log_metric_history("rmse_window", windows["rmse"].tolist())
    tracked.log_metric_history("mape_window", windows["mape"].tolist())
    tracked.log_metric_history("batch_seconds", fitted.batch_seconds)
    tracked.log_frame(windows, "backtest/windows.csv")
    tracked.log_json({"window_plan": {"groups": plan.groups, "windows": plan.windows, "budget": plan.budget,
                                      "batch_bytes": plan.batch_bytes, "plan": plan.plan.as_dict()},
                      "segments": fitted.segments, "oom_events": prepared.oom_log.as_dicts(),
                      "phases": {name: vars(p) for name, p in recorder.phases.items()}}, "memory/backtest.json")
    if config.tracking.log_predictions:
        tracked.log_frame(table, "backtest/predictions.parquet")
    if config.tracking.log_plots and tracked.enabled:
        title = (f"{config.model.name}: rmse_backtest {significant(metrics['rmse_backtest'])} over {len(windows)} "
                 f"windows (refit {config.backtest.refit.value}, step {config.backtest.step}, horizon "
                 f"{config.backtest.horizon})")
        tracked.log_figure(backtest_figure(windows, table, title), "plots/backtest.png")
