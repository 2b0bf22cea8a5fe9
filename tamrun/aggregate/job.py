"""``mode=aggregate``: experts' day-ahead forecasts combined online, the rule chosen on the validation period.

    aggregate.experts -> composed experts (tamrun/aggregate/experts.py) -> families sharing a design
    -> each expert's validation and test forecasts (tamrun/aggregate/forecasts.py)
    -> every candidate rule over the validation days, the lowest validation RMSE chosen
       (tamrun/aggregate/selection.py) -> the chosen rule over the validation and the test days
    -> rmse_test / rmse_validation of the aggregate and of each expert, tables, plots -> MLflow

Day d's weights use the losses of the days before d only (tamrun/aggregate/rules.py); the test period's
truth reaches neither the experts' choices nor the rule's.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.aggregate.experts import Expert, compose_experts, families
from tamrun.aggregate.forecasts import TEST, VALIDATION, ExpertForecasts, expert_forecasts
from tamrun.aggregate.plots import monthly_figure, weights_figure
from tamrun.aggregate.pruning import Pruning, prune
from tamrun.aggregate.selection import Combined, Selection, combine, select
from tamrun.config.schema import Config
from tamrun.device.manager import DeviceManager
from tamrun.fit.evaluate import mape, require_finite, rmse
from tamrun.jobs.bands import day_ahead_bands, naive_bands, residual_history
from tamrun.jobs.prepare import import_recording_libraries
from tamrun.jobs.record import record_inputs
from tamrun.jobs.result import RunResult
from tamrun.pipeline import DTYPES, Fit, numerical_fix
from tamrun.tco.run import priced_phases, priced_work
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.artifacts.run_plots import log_interval_figure

log = logging.getLogger(__name__)


def target_scale(forecasts: ExpertForecasts) -> float:
    """s: the target's standard deviation over the training rows (before the validation period)."""
    splits = forecasts.prepared.splits
    scale = float(np.std(splits.train[splits.recipe.target].to_numpy(dtype=np.float64)))
    return scale if scale > 0 else 1.0


def expert_table(forecasts: ExpertForecasts, experts: List[Expert]) -> pd.DataFrame:
    """One row per expert: its model, mode (run or kalman), chosen (q, p0), validation and test RMSE, and its
    family's seconds."""
    table, rows = forecasts.table, []
    for expert in experts:
        name, config = expert.name, expert.config
        q, p0 = forecasts.chosen.get(name, {}).get("pair", (None, None))
        mode = config.adaptive.method.value if expert.filtered else config.mode.name.value
        rows.append({"expert": name, "model": config.model.name, "mode": mode, "kalman_q": q, "kalman_p0": p0,
                     **{f"rmse_{period}": rmse(part["actual"].to_numpy(), part[name].to_numpy())
                        for period, part in table.groupby("period", sort=False)},
                     "family_seconds": forecasts.seconds.get(name, np.nan)})
    return pd.DataFrame(rows)


def aggregate_metrics(table: pd.DataFrame, experts: pd.DataFrame, selection: Selection, seconds: Dict[str, float]
                      ) -> Dict[str, float]:
    """rmse / mape of the aggregate on both periods, each expert's rmse, the best expert's, the choice, seconds."""
    metrics: Dict[str, float] = {}
    for period in (VALIDATION, TEST):
        part = table[table["period"] == period]
        metrics[f"rmse_{period}"] = rmse(part["actual"].to_numpy(), part["aggregate"].to_numpy())
        metrics[f"mape_{period}"] = mape(part["actual"].to_numpy(), part["aggregate"].to_numpy())
        for row in experts.itertuples():
            metrics[f"rmse_{period}_{row.expert}"] = float(getattr(row, f"rmse_{period}"))
        metrics[f"rmse_{period}_best_expert"] = float(experts[f"rmse_{period}"].min())
    chosen = selection.chosen
    metrics.update(aggregate_gradient=float(chosen.gradient), aggregate_per_group=float(chosen.per_group),
                   aggregate_candidates=float(len(selection.scores)), aggregate_experts=float(experts["kept"].sum()),
                   **seconds)
    if chosen.eta is not None:
        metrics["aggregate_eta"] = chosen.eta
    return metrics


def aggregate_job(cfg: Any, config: Config, devices: DeviceManager, tracked: TrackedRun,
                  libraries_loaded: Optional[Callable[[], None]] = None) -> RunResult:
    """Compose the experts, forecast with each, choose the rule on the validation period, combine, record."""
    import_recording_libraries(config)
    began = time.perf_counter()
    experts = compose_experts(cfg, config)
    forecasts = expert_forecasts(families(experts), devices, [e.name for e in experts], libraries_loaded)
    experts_seconds = time.perf_counter() - began
    record_inputs(tracked, forecasts.prepared)
    dtype, scale = DTYPES[config.dtype], target_scale(forecasts)
    began = time.perf_counter()
    with devices.serial():
        pruning = choose(forecasts, config, scale, devices, dtype)
        combined = combine(forecasts.table, pruning.kept, pruning.selection.chosen, scale, devices.device, dtype)
    table = forecasts.table.assign(aggregate=combined.forecast)
    seconds = {"experts_seconds": experts_seconds, "aggregate_seconds": time.perf_counter() - began}
    experts_frame = expert_table(forecasts, experts).assign(kept=lambda f: f["expert"].isin(pruning.kept))
    metrics = aggregate_metrics(table, experts_frame, pruning.selection, seconds)
    metrics.update(priced_work(config, forecasts.prepared.measured_on, priced_phases(seconds)))
    table, interval_metrics = aggregate_bands(config, table, forecasts.fits[0])
    metrics.update(interval_metrics)
    require_finite({name: metrics[name] for name in ("rmse_test", "rmse_validation")}, "an aggregate metric",
                   numerical_fix(config))
    log.info("aggregate: rmse_test=%.5g (best expert %.5g), rmse_validation=%.5g (best expert %.5g), %s, experts %s",
             metrics["rmse_test"], metrics["rmse_test_best_expert"], metrics["rmse_validation"],
             metrics["rmse_validation_best_expert"], pruning.selection.chosen.label, ", ".join(pruning.kept))
    record_aggregate(tracked, config, table, experts_frame, metrics, pruning, combined, forecasts)
    fit = forecasts.fits[0]
    return RunResult(run_id=None, route=fit.plan.route, width=fit.model.design.width, groups=fit.model.groups,
                     coef=fit.model.coef, metrics=metrics, table=lambda: table, plan=fit.plan, stats=fit.stats)


def aggregate_bands(config: Config, table: pd.DataFrame, static: Fit) -> Tuple[pd.DataFrame, Dict[str, float]]:
    """The aggregate's intervals over the test days, calibrated on its validation days' residuals
    (`tamrun.jobs.bands.day_ahead_bands`; the naive baseline from ``static``, the first family's refit);
    the validation rows keep no interval (they calibrate)."""
    validation, test = (table[table["period"] == period] for period in (VALIDATION, TEST))
    banded, metrics = day_ahead_bands(config, test, "aggregate", residual_history(validation, "aggregate"),
                                      naive_bands(config, static), static.model.groups)
    return pd.concat([validation, banded], ignore_index=True), metrics


def choose(forecasts: ExpertForecasts, config: Config, scale: float, devices: DeviceManager, dtype: torch.dtype
           ) -> Pruning:
    """The experts (all, or those backward elimination keeps: aggregate.select_experts) and their rule,
    chosen on the validation days."""
    settings, test_start = config.aggregate, pd.Timestamp(config.split.test_start)

    def chosen_rule(experts: List[str]) -> Selection:
        return select(forecasts.table, experts, settings, test_start, scale, devices.device, dtype)

    if settings.select_experts:
        return prune(forecasts.names, chosen_rule)
    return Pruning(forecasts.names, chosen_rule(forecasts.names))


def monthly_rmse(table: pd.DataFrame, names: list) -> pd.DataFrame:
    """RMSE per calendar month of the aggregate and of each expert (rows: months)."""
    month = pd.to_datetime(table["date"]).dt.to_period("M")
    columns = ["aggregate", *names]
    squared = pd.DataFrame({name: (table[name] - table["actual"]) ** 2 for name in columns})
    return np.sqrt(squared.groupby(month).mean())


def record_aggregate(tracked: TrackedRun, config: Config, table: pd.DataFrame, experts: pd.DataFrame,
                     metrics: Dict[str, float], pruning: Pruning, combined: Combined,
                     forecasts: ExpertForecasts) -> None:
    """Log the run: metrics, the experts' table and choices, the candidates, the weights, predictions, plots."""
    selection, kept = pruning.selection, pruning.kept
    tracked.log_params({"aggregate_chosen": selection.chosen.label, "aggregate_experts": ",".join(kept)})
    tracked.log_metrics(metrics)
    tracked.log_frame(experts, "aggregate/experts.csv")
    tracked.log_json({"candidates": selection.as_dict(), "experts": forecasts.chosen, "pruning": pruning.steps},
                     "aggregate/selection.json")
    weights = pd.DataFrame(combined.daily, columns=kept).assign(day=combined.days.astype(str))
    tracked.log_frame(weights[["day", *kept]], "aggregate/weights.csv")
    months = monthly_rmse(table, forecasts.names)
    tracked.log_frame(months.rename_axis("month").reset_index().astype({"month": str}), "aggregate/monthly_rmse.csv")
    if config.tracking.log_predictions:
        tracked.log_frame(table, "predictions/aggregate.csv")
    if config.tracking.log_plots:
        title = (f"{selection.chosen.label}: test RMSE {metrics['rmse_test']:.1f} "
                 f"(best expert {metrics['rmse_test_best_expert']:.1f})")
        tracked.log_figure(weights_figure(combined.days, combined.daily, kept,
                                          pd.Timestamp(config.split.test_start), title), "plots/aggregate_weights.png")
        tracked.log_figure(monthly_figure(months, pd.Timestamp(config.split.test_start),
                                          "Monthly RMSE of the aggregate and the experts"),
                           "plots/aggregate_monthly_rmse.png")
        log_interval_figure(tracked, table[table["period"] == TEST], "aggregate", config.data.unit)
