"""``split.refit`` (mode=run): the model refitted on its validation period, its intervals calibrated before.

    fit on the training rows without the validation period -> predict the validation period: its scores
        (rmse_validation, mape_validation, the intervals' coverage) and its held-out residuals
    -> the training rows whole, the validation period's included: features, plan and fit again (the refit)
    -> the refit is the run's model (`tamrun.jobs.fit.fit_job`): its training and test predictions and
       metrics, its intervals the quantiles of those held-out residuals (`tamrun.jobs.bands.residual_bands`)

The refit's coefficients are those of a plain run trained on the same rows (split.validation_start=null);
its intervals are not calibrated on its own in-sample residuals, which are smaller than a forecast's. The
validation rows of its predictions table are the held-out fit's forecasts. Without a validation period
there is nothing to hold out: a plain run, its intervals calibrated on the training rows (the log says so).
``python -m tamrun.compare --best --register NAME --refit`` runs the best run's config with it.
"""

from __future__ import annotations

import logging

import pandas as pd

from tamrun.fit.intervals import level_label
from tamrun.jobs.bands import batch_bands, batch_residuals
from tamrun.jobs.fit import HeldOut, ScoredSplit, band_metrics, checked_metrics, fit_job, solve_phase
from tamrun.jobs.prepare import Prepared, planned
from tamrun.jobs.result import RunResult
from tamrun.memory.guard import HostRoomWatch
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)


def refit_job(prepared: Prepared, tracked: TrackedRun) -> RunResult:
    """A run with split.refit (the module doc): the held-out fit, then the refit, fitted and recorded."""
    splits, date = prepared.splits, prepared.config.data.date_column
    if splits.validation is None:
        log.info("split.refit: no validation period to hold out, nothing to refit: a plain fit; intervals: "
                 "calibrated on the training rows' in-sample residuals (narrower than a forecast's)")
        return fit_job(prepared, tracked)
    held = held_out(prepared)
    refit = refit_preparation(prepared)
    through = refit.splits.train[date].max()
    if held.bands is not None:
        log.info("intervals %s: calibrated on the validation period's held-out residuals (%d rows), before the "
                 "refit through %s", ", ".join(map(level_label, held.bands.levels)), len(held.residuals), through)
    tracked.log_params({"refit_through": str(through)})
    tracked.log_metrics({"held_out_fit_seconds": prepared.recorder.phases["solve"].seconds})
    return fit_job(refit, tracked, held)


def held_out(prepared: Prepared) -> HeldOut:
    """The fit on the training rows without the validation period, and its forecasts of that period: their
    metrics (the unsupported groups withheld, as a plain run's) and the residuals that calibrate the refit."""
    config, splits = prepared.config, prepared.splits
    fit = solve_phase(prepared)
    with prepared.recorder.phase("held_out", prepared.metered):
        train = ScoredSplit("train", splits.train, fit.train, fit.predict(fit.train, "train"))
        validation = ScoredSplit("validation", splits.validation, *fit.predict_split(splits.validation, "validation"))
    evaluated = checked_metrics(config, fit, [train, validation], whole=True)
    kept = evaluated.splits[1]
    bands = batch_bands(config, kept.batch, kept.predicted)
    metrics = {name: value for name, value in evaluated.metrics.items() if name.endswith("_validation")}
    metrics.update(band_metrics(config, [kept], bands))
    residuals, codes = batch_residuals(kept.batch, kept.predicted)
    labels = pd.Index(kept.batch.groups)[codes].to_numpy()
    return HeldOut(kept, bands, metrics, residuals, labels)


def refit_preparation(prepared: Prepared) -> Prepared:
    """``prepared`` on its training rows and validation period together, in the table's order: their
    features and plan (`tamrun.jobs.prepare.planned`), under the run's recorder and OOM log."""
    config, splits = prepared.config, prepared.splits
    rows = pd.concat([splits.train, splits.validation]).sort_index(kind="stable")
    union = splits.joined(rows)
    room = HostRoomWatch(config.memory.safety_margin_bytes)
    return planned(config, prepared.specs, prepared.devices, union, prepared.recorder, room, prepared.metered,
                   prepared.oom_log)
