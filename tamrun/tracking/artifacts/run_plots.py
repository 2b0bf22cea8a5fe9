"""The plots every run logs (plots/*.png): forecast with a one-week zoom, partial effects, residuals by
time of day (sub-daily dates), day of week (daily) or month (weekly or coarser), memory timeline, the
test period's intervals (`log_interval_figure`, every mode) and, when the CG route ran, its residual history."""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import pandas as pd

from tamrun.config.schema import Config
from tamrun.fit.partial import partial_effect_curves
from tamrun.pipeline import Fit
from tamrun.solve.cg import DEFAULT_TOL
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.artifacts.plots import (cg_residual_figure, forecast_figure, interval_figure, memory_timeline_figure,
                                   partial_effects_figure, residual_period, residuals_by_period_figure)

log = logging.getLogger(__name__)


def log_run_plots(tracked: TrackedRun, config: Config, fit: Fit, table: pd.DataFrame, metrics: Dict[str, float],
                  report: Dict[str, Any], limit: Optional[int]) -> None:
    """Draw and log every plot of a fitted run."""
    unit = config.data.unit
    title = f"{config.model.name}: test RMSE {metrics['rmse_test']:.1f} {unit}".strip()
    tracked.log_figure(forecast_figure(table, title=title, unit=unit), "plots/forecast.png")
    curves = partial_effect_curves(fit.model, fit.train, fit.device)
    tracked.log_figure(partial_effects_figure(curves, unit=unit), "plots/partial_effects.png")
    period = residual_period(table["date"])
    tracked.log_figure(residuals_by_period_figure(table, period, unit=unit), f"plots/residuals_by_{period}.png")
    tracked.log_figure(memory_timeline_figure(report["snapshots"], limit, fit.plan.predicted_peak),
                       "plots/memory_timeline.png")
    log_interval_figure(tracked, table[table["split"] == "test"], "predicted", unit)
    if fit.stats.cg_history:
        tol = config.solver.tol if config.solver.tol is not None else DEFAULT_TOL[fit.model.coef.dtype]
        tracked.log_figure(cg_residual_figure(fit.stats.cg_history, tol), "plots/cg_residuals.png")
    log.info("plots logged under plots/")


def log_interval_figure(tracked: TrackedRun, rows: pd.DataFrame, forecast: str, unit: str = "") -> None:
    """plots/intervals.png (`interval_figure`) of the test rows ``rows`` of a forecast column, when they
    carry intervals (intervals.levels)."""
    if any(column.startswith("lower_") for column in rows.columns):
        tracked.log_figure(interval_figure(rows, forecast, unit=unit), "plots/intervals.png")
