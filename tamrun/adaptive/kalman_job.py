"""``mode=adaptive adaptive.method=kalman``: the static fit, its effects' weights adapted day by day by a
Kalman filter (tamrun/adaptive/kalman.py), evaluated on the test period and recorded.

    with a validation period (split.validation_start) and a grid of (q, p0) pairs:
        static fit on the training rows -> filters of every pair over training + validation (burn-in on
        the training rows) -> the pair with the lowest validation RMSE -> static refit on training + validation
    then: filters of the chosen pair over every row up to the test end (burn-in on every row before
        split.test_start) -> day-ahead forecasts of the test period -> metrics, tables, plots -> MLflow

The test period never reaches the selection: its rows are not in the table the pairs are scored on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from tamrun.adaptive.filtering import (FilterInputs, FilterRun, check_input_room, filter_inputs, input_bytes,
                                      run_filters, slot_rmse)
from tamrun.adaptive.plots import adaptive_figure, weights_figure
from tamrun.config.schema import KalmanConfig
from tamrun.fit.evaluate import mape, require_finite, require_plausible, rmse
from tamrun.jobs.bands import day_ahead_bands, naive_bands, residual_history
from tamrun.jobs.prepare import Prepared
from tamrun.jobs.record import record_selection
from tamrun.jobs.result import RunResult
from tamrun.numbers import significant
from tamrun.pipeline import Fit, fit_model, numerical_fix, solve
from tamrun.tco.run import priced_phases, priced_work
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.artifacts.run_plots import log_interval_figure

log = logging.getLogger(__name__)


@dataclass
class Selection:
    """The validation scores (C,) of the (q, p0) pairs, and the chosen pair's index."""

    pairs: List[Tuple[float, float]]
    scores: List[float]
    static_score: float
    best: int
    forecasts: Optional[pd.DataFrame] = None  # the chosen pair's validation days (`forecast_table`): the intervals' calibration

    @property
    def pair(self) -> Tuple[float, float]:
        return self.pairs[self.best]

    def as_dict(self) -> Dict[str, object]:
        return {"pairs": [{"q": q, "p0": p0, "rmse_validation": s} for (q, p0), s in zip(self.pairs, self.scores)],
                "chosen": {"q": self.pair[0], "p0": self.pair[1]}, "rmse_validation_static": self.static_score}


def grid_pairs(prepared: Prepared) -> List[Tuple[float, float]]:
    kal = prepared.config.adaptive.kalman
    return [(float(q), float(p0)) for q in kal.q for p0 in kal.p0]


def adapt(prepared: Prepared, fit: Fit, frame: pd.DataFrame, start: pd.Timestamp, pairs: List[Tuple[float, float]],
          keep_weights: bool, kal: Optional[KalmanConfig] = None) -> Tuple[FilterInputs, FilterRun]:
    """Filters of ``pairs`` over the rows of ``frame``, burnt in on the rows before ``start``; ``kal``: the
    state and skip_updates (default: the run's adaptive.kalman)."""
    config, kal = prepared.config, kal or prepared.config.adaptive.kalman
    check_input_room(input_bytes(fit.model, len(frame), kal.state), prepared.plan.budget, kal.state)
    data = filter_inputs(fit.model, frame, start, kal.state, kal.skip_updates, prepared.devices.device,
                         fit.plan.predict.rows)
    with prepared.tracker.hold(data.nbytes(), "kalman inputs"), prepared.devices.serial():
        run = run_filters(data, pairs, data.day_index(start), prepared.chunk_loop(), prepared.plan.budget,
                          prepared.plan.overhead, keep_weights, prepared.devices.device)
    log.info("kalman: %d pair(s) x %d group(s), k=%d inputs, %d days (%.2f s burn-in, %.2f s from %s)",
             len(pairs), data.inputs.shape[0], data.inputs.shape[-1], data.inputs.shape[1], run.seconds["burn_in"],
             run.seconds["adaptation"], start.date())
    require_finite({"kalman forecast": float(run.forecast.abs().max())}, "a Kalman forecast", numerical_fix(config))
    return data, run


def select_pair(prepared: Prepared, static: Fit) -> Selection:
    """Score every pair on the validation period (the static model fitted on the rows before it)."""
    splits, split = prepared.splits, prepared.config.split
    start = pd.Timestamp(split.validation_start)
    pairs = grid_pairs(prepared)
    data, run = adapt(prepared, static, pd.concat([splits.train, splits.validation]), start, pairs, False)
    scored = data.observed.clone()
    scored[:, :data.day_index(start)] = False
    scores = slot_rmse(run.forecast, data.target, scored).tolist()
    static_score = float(slot_rmse(data.static.unsqueeze(0), data.target, scored)[0])
    best = int(np.argmin(scores))
    selection = Selection(pairs, scores, static_score, best, forecast_table(data, run, start, best))
    log.info("kalman: validation RMSE %s (static %.1f): q=%g, p0=%g chosen",
             ", ".join(f"{s:.1f}" for s in scores), static_score, *selection.pair)
    return selection


def forecast_table(data: FilterInputs, run: FilterRun, start: pd.Timestamp, pair: int = 0) -> pd.DataFrame:
    """One row per row from ``start`` on: date, group, actual, adaptive (the day-ahead forecast of the filter
    of ``pair``), static."""
    g, n = np.nonzero((data.batch.row_index >= 0) & (data.dates >= np.datetime64(start)))
    day, slot = data.grid.day[g, n], data.grid.slot[g, n]
    return pd.DataFrame({
        "date": data.dates[g, n], "group": np.asarray(data.batch.groups, dtype=object)[g],
        "actual": data.batch.y[g, n].numpy(), "adaptive": run.forecast[pair, g, day, slot].numpy(),
        "static": data.static[g, day, slot].numpy(),
    }).sort_values(["date", "group"], kind="stable").reset_index(drop=True)


def monthly_rmse(table: pd.DataFrame) -> pd.DataFrame:
    """RMSE of the static and adaptive forecasts per calendar month of the table."""
    month = pd.to_datetime(table["date"]).dt.to_period("M").astype(str)
    squared = pd.DataFrame({name: (table[name] - table["actual"]) ** 2 for name in ("static", "adaptive")})
    out = np.sqrt(squared.groupby(month).mean())
    return out.rename_axis("month").reset_index()


def kalman_job(prepared: Prepared, tracked: TrackedRun) -> RunResult:
    """Fit, choose (q, p0) on the validation period when there is one, adapt over the test period, record."""
    config, recorder, splits = prepared.config, prepared.recorder, prepared.splits
    with recorder.phase("static"):
        static = solve(config, prepared.features, prepared.plan, prepared.devices, prepared.chunk_loop(), splits.recipe)
    selection: Optional[Selection] = None
    if splits.validation is not None:
        with recorder.phase("selection"):
            selection = select_pair(prepared, static)
        with recorder.phase("refit"):  # the final static model sees the validation rows too
            union = splits.joined(pd.concat([splits.train, splits.validation]))
            static = fit_model(config, prepared.specs, union, prepared.devices, prepared.chunk_loop())
    pair = selection.pair if selection else grid_pairs(prepared)[0]
    test_start = pd.Timestamp(config.split.test_start)
    rows = pd.concat([frame for frame in (splits.train, splits.validation, splits.test) if frame is not None])
    with recorder.phase("adaptive"):  # not metered: the meter's hook would cost more than the filter's small steps
        data, run = adapt(prepared, static, rows, test_start, [pair], True)
    with recorder.phase("evaluate"):
        table = forecast_table(data, run, test_start)
        months = monthly_rmse(table)
    metrics = kalman_metrics(prepared, table, run, pair, selection)
    calibration = selection.forecasts if selection is not None else table.iloc[:0]
    table, interval_metrics = day_ahead_bands(config, table, "adaptive", residual_history(calibration, "adaptive"),
                                              naive_bands(config, static), static.model.groups)
    metrics.update(interval_metrics)
    require_finite({name: metrics[name] for name in ("rmse_test", "mape_test", "rmse_test_static")},
                   "a forecast metric", numerical_fix(config))
    require_plausible({"test (adaptive)": table["adaptive"].to_numpy(), "test (static)": table["static"].to_numpy()},
                      metrics, prepared.splits.train[config.data.target].to_numpy(), numerical_fix(config))
    log.info("kalman: rmse_test=%s (static %s), adaptation %s s over the test period, static fit %s s",
             *(significant(metrics[name]) for name in ("rmse_test", "rmse_test_static", "kalman_test_seconds",
                                                       "static_fit_seconds")))
    record_kalman(tracked, prepared, static, table, months, metrics, data, run, selection)
    return RunResult(run_id=None, route=static.plan.route, width=static.model.design.width, groups=static.model.groups,
                     coef=static.model.coef, metrics=metrics, table=lambda: table, plan=static.plan, stats=static.stats)


def kalman_metrics(prepared: Prepared, table: pd.DataFrame, run: FilterRun, pair: Tuple[float, float],
                   selection: Optional[Selection]) -> Dict[str, float]:
    """Test RMSE / MAPE of the filtered and static forecasts, the chosen pair, the seconds, the phases."""
    recorder = prepared.recorder
    actual = table["actual"].to_numpy()
    metrics = {
        "rmse_test": rmse(actual, table["adaptive"].to_numpy()), "mape_test": mape(actual, table["adaptive"].to_numpy()),
        "rmse_test_static": rmse(actual, table["static"].to_numpy()),
        "mape_test_static": mape(actual, table["static"].to_numpy()),
        "kalman_q": pair[0], "kalman_p0": pair[1], "kalman_sigma": float(run.sigma2[0].median().sqrt()),
        "kalman_test_seconds": run.seconds["adaptation"], "kalman_burn_in_seconds": run.seconds["burn_in"],
        "kalman_groups_per_chunk": float(run.groups), "oom_retries": float(prepared.oom_log.retries),
        "static_fit_seconds": recorder.phases["refit" if selection else "static"].seconds,
    }
    if selection is not None:
        metrics.update(rmse_validation=selection.scores[selection.best], rmse_validation_static=selection.static_score)
    metrics.update(recorder.metrics())
    metrics["working_peak_bytes"] = recorder.working_peak(("adaptive",))
    metrics.update(priced_work(prepared.config, prepared.measured_on, priced_phases(recorder.seconds())))
    return metrics


def record_kalman(tracked: TrackedRun, prepared: Prepared, static: Fit, table: pd.DataFrame, months: pd.DataFrame,
                  metrics: Dict[str, float], data: FilterInputs, run: FilterRun, selection: Optional[Selection]) -> None:
    """Log the run: metrics, the monthly RMSE, the selections ((q, p0); the penalties under
    model.penalties=gcv), predictions, the forecast and weights plots."""
    config = prepared.config
    tracked.log_params({"route": prepared.plan.route, "kalman_inputs": ",".join(data.names)})
    tracked.log_metrics(metrics)
    record_selection(tracked, static.selection, config.model.gcv.offsets)  # model.penalties=gcv
    tracked.log_metric_history("rmse_month", months["adaptive"].tolist())
    tracked.log_metric_history("rmse_month_static", months["static"].tolist())
    tracked.log_frame(months, "kalman/monthly_rmse.csv")
    if selection is not None:
        tracked.log_json(selection.as_dict(), "kalman/selection.json")
    if config.tracking.log_predictions:
        tracked.log_frame(table, "predictions/adaptive.csv")
    if config.tracking.log_plots:
        title = (f"{config.model.name}: test RMSE Kalman {metrics['rmse_test']:.1f}, static "
                 f"{metrics['rmse_test_static']:.1f} (q={metrics['kalman_q']:g})")
        tracked.log_figure(adaptive_figure(table, title, label="adaptive (Kalman filter)"), "plots/adaptive_forecast.png")
        log_interval_figure(tracked, table, "adaptive", config.data.unit)
        if run.weights is not None and config.adaptive.kalman.state.value == "effects":
            tracked.log_figure(weights_figure(run.weights, data.theta0, data.grid.days, data.names),
                               "plots/kalman_weights.png")
