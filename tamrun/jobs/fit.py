"""``mode=run``: fit every group, predict the splits, evaluate, record (`tamrun.jobs.record`).

    solve (under the tracker and the OOM guard) -> predict train / validation / test -> metrics
          -> record (the predictions table is built here, and only if the recording uses it)
"""

from __future__ import annotations

import functools
import logging
from typing import Dict, List, NamedTuple, Optional

import numpy as np
import pandas as pd
import torch

from tamrun.config.schema import Config, DataConfig
from tamrun.data.batch import GroupedBatch
from tamrun.fit.evaluate import predictions_table, require_finite, require_plausible, scored, split_scores
from tamrun.fit.intervals import GroupBands, interval_metrics, level_label
from tamrun.jobs.bands import batch_bands, residual_bands, row_groups
from tamrun.jobs.prepare import Prepared
from tamrun.jobs.record import record_fit
from tamrun.jobs.result import RunResult
from tamrun.device.profiler import PhaseRecorder
from tamrun.numbers import significant
from tamrun.pipeline import Fit, numerical_fix, recording_reserve, solve, support_fix
from tamrun.fit.progress import ChunkProgress, IterationProgress
from tamrun.fit.unsupported import find_unsupported, log_unsupported, n_unsupported, require_share, withhold
from tamrun.tco.run import record_tco, run_plan, tco_metrics
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)


class ScoredSplit(NamedTuple):
    """A split's rows: the table they came from, their batch and their predictions (G, N)."""

    name: str
    frame: pd.DataFrame
    batch: GroupedBatch
    predicted: torch.Tensor


class HeldOut(NamedTuple):
    """A refit's validation period (split.refit, `tamrun.jobs.refit`) as the fit without it predicted it:
    its split (the unsupported groups withheld), the bands its residuals calibrate in that fit's group order,
    its metrics (``*_validation``), and those residuals with their groups' labels (n,)."""

    split: ScoredSplit
    bands: Optional[GroupBands]
    metrics: Dict[str, float]
    residuals: np.ndarray
    labels: np.ndarray


def fit_job(prepared: Prepared, tracked: TrackedRun, held: Optional[HeldOut] = None) -> RunResult:
    """Fit, evaluate and record one run from its preparation. The predictions table is built only when
    something uses it (the recorded CSV and plots, `RunResult.predictions`): the metrics come from the
    predictions themselves. ``held``: a refit's validation period, held out of an earlier fit: its
    residuals calibrate the intervals, its metrics and rows are the run's validation split's."""
    config, recorder, metered = prepared.config, prepared.recorder, prepared.metered
    fit = solve_phase(prepared)
    with recorder.phase("predict", metered):
        splits = predict_splits(prepared, fit)
    with recorder.phase("evaluate"):
        evaluated = checked_metrics(config, fit, splits, whole=True)
        metrics, splits = evaluated.metrics, evaluated.splits
        fit.model.intervals = (calibration_bands(config, splits) if held is None else
                               residual_bands(config, held.residuals, held.labels, fit.model.groups))
        metrics.update(band_metrics(config, splits, fit.model.intervals))
        metrics.update(held.metrics if held is not None else {})
    metrics.update(run_metrics(prepared, fit))
    tco = run_plan(prepared.classes, prepared.measured_on, metrics, fit.plan, len(fit.model.groups))
    metrics.update(tco_metrics(config, tco, metrics))
    log.info("rmse_train=%s rmse_test=%s mape_test=%s%% fit=%ss", *(significant(metrics[name]) for name in
                                                                    ("rmse_train", "rmse_test", "mape_test", "fit_seconds")))
    log.info("%s", memory_line(metrics))
    table = functools.cache(lambda: evaluation_table(config.data, splits, fit.model.intervals, held))
    with recorder.phase("record"):
        record_fit(tracked, prepared, fit, table, metrics, evaluated.unsupported)
        record_tco(tracked, tco)
    after = {"peak_after_planning_bytes": recorder.peak_after_planning(), **recorder.phase_metrics("record")}
    tracked.log_metrics(after)
    metrics.update(after)
    return RunResult(run_id=None, route=fit.plan.route, width=fit.model.design.width, groups=fit.model.groups,
                     coef=fit.model.coef, metrics=metrics, table=table, plan=fit.plan, stats=fit.stats, tco=tco)


class Evaluated(NamedTuple):
    """A run's (or a streamed chunk's) checked metrics, its splits with the unsupported groups withheld (their
    rows marked as padding: `tamrun.fit.unsupported.withhold`) and the table of those groups."""

    metrics: Dict[str, float]
    splits: List[ScoredSplit]
    unsupported: pd.DataFrame
    withheld: List[int]  # the withheld groups' indices in the batches' group order


def checked_metrics(config: Config, fit: Fit, splits: List[ScoredSplit], whole: bool) -> Evaluated:
    """RMSE / MAPE of every split from its predictions, the groups whose forecasts the training data does not
    support withheld (`tamrun.fit.unsupported`), checked: the training rows' predictions plausible before
    anything is withheld (an absurd one is a fit on absurd targets), at most evaluate.max_unsupported_share of
    the groups withheld (``whole``: a run's every group; a streamed chunk's share is checked over every chunk,
    and its splits without a row left are not scored), the rest finite (`require_finite`) and plausible against
    the training target's scale (`require_plausible`)."""
    train_target, train_predicted = scored(splits[0].batch, splits[0].predicted)
    found = find_unsupported({split.name: (split.batch, split.predicted) for split in splits if split.name != "train"},
                             fit.train, fit.model.coef.shape[1])
    finite = train_predicted[np.isfinite(train_predicted)]  # a non-finite one: `require_finite` below names it
    require_plausible({"train": finite}, {}, train_target, numerical_fix(config))
    if whole:
        share = config.evaluate.max_unsupported_share
        require_share(found.table, len(fit.model.groups), share, support_fix(config))
        log_unsupported(found.table, len(fit.model.groups), share)
    kept = [split._replace(batch=withhold(split.batch, found.indices)) for split in splits]
    scores = {split.name: scored(split.batch, split.predicted) for split in kept}
    metrics: Dict[str, float] = {}
    for name, (actual, predicted) in scores.items():
        if whole or actual.size:
            metrics.update(split_scores(name, actual, predicted))
    require_finite(metrics, "a forecast metric", numerical_fix(config))
    require_plausible({name: predicted for name, (_, predicted) in scores.items()}, metrics, train_target,
                      numerical_fix(config))
    metrics["groups_unsupported"] = float(n_unsupported(found.table))
    return Evaluated(metrics, kept, found.table, found.indices)


def solve_phase(prepared: Prepared) -> Fit:
    """The fit along the plan, as the solve phase of a run (metered with memory.meter, its chunks and CG
    iterations reported by the run's progress)."""
    config = prepared.config
    loop = prepared.chunk_loop(ChunkProgress(config.progress.value))
    iterations = IterationProgress(config.progress.value)
    with prepared.recorder.phase("solve", prepared.metered):
        fit = solve(config, prepared.features, prepared.plan, prepared.devices, loop, prepared.splits.recipe,
                    iterations)
    iterations.close()
    return fit


def fit_seconds(recorder: PhaseRecorder) -> float:
    """A run's fit: its features and solve phases (the ``fit=`` of its log line, metric fit_seconds)."""
    return recorder.phases["features"].seconds + recorder.phases["solve"].seconds


def predict_splits(prepared: Prepared, fit: Fit) -> List[ScoredSplit]:
    """The predictions of every split, in table order: train, validation (if any), test (their progress
    named "predict train", ...)."""
    splits = prepared.splits
    scored_splits = [ScoredSplit("train", splits.train, fit.train, fit.predict(fit.train, "train"))]
    if splits.validation is not None:
        scored_splits.append(ScoredSplit("validation", splits.validation,
                                         *fit.predict_split(splits.validation, "validation")))
    scored_splits.append(ScoredSplit("test", splits.test, prepared.test, fit.predict(prepared.test, "test")))
    return scored_splits


def evaluation_table(data: DataConfig, splits: List[ScoredSplit], bands: Optional[GroupBands] = None,
                     held: Optional[HeldOut] = None) -> pd.DataFrame:
    """The predictions table of every split (date, group, split, actual, predicted, the intervals); ``held``:
    a refit's validation rows as the fit without them predicted them, after its training rows."""
    tables = [predictions_table(split.frame, split.batch, split.predicted, data.date_column, data.group,
                                split.name, bands) for split in splits]
    if held is not None:
        tables.insert(1, predictions_table(held.split.frame, held.split.batch, held.split.predicted, data.date_column,
                                           data.group, held.split.name, held.bands))
    return pd.concat(tables, ignore_index=True)


def calibration_split(splits: List[ScoredSplit]) -> ScoredSplit:
    """The rows a run's intervals are calibrated on: its validation split (out of the fit), else its
    training rows (in the fit: their residuals are smaller than a forecast's, the intervals narrower)."""
    return next((split for split in splits if split.name == "validation"), splits[0])


def calibration_bands(config: Config, splits: List[ScoredSplit]) -> Optional[GroupBands]:
    """The run's fixed intervals (`tamrun.jobs.bands.batch_bands` of `calibration_split`); None without levels."""
    calibration = calibration_split(splits)
    bands = batch_bands(config, calibration.batch, calibration.predicted)
    if bands is not None:
        log.info("intervals %s calibrated on the %s rows' residuals", ", ".join(map(level_label, bands.levels)),
                 calibration.name)
    return bands


def band_metrics(config: Config, splits: List[ScoredSplit], bands: Optional[GroupBands]) -> Dict[str, float]:
    """coverage / width per level and the pinball loss of ``bands`` on every split with rows scored
    (`interval_metrics`; a streamed chunk's split may have none: its every group withheld)."""
    if bands is None:
        return {}
    metrics: Dict[str, float] = {}
    for split in splits:
        actual, predicted = scored(split.batch, split.predicted)
        if not actual.size:
            continue
        metrics.update(interval_metrics(actual, bands.columns(predicted, row_groups(split.batch)), bands.levels,
                                        split.name))
    return metrics


# The phases whose working memory the plan predicts (its fit and predict chunks).
PLANNED_PHASES = ("solve", "predict")


def memory_line(metrics: Dict[str, float]) -> str:
    """The plan's working-memory prediction against the measured working peak of the phases it plans, and
    the process's peak apart (it holds the interpreter, the libraries and the data besides)."""
    mib = 2**20
    process = (f"the process peaked at {significant(metrics.get('peak_memory_mib', 0.0))} MiB (peak_memory_mib: "
               "interpreter, libraries and data included)")
    if "working_peak_ratio" not in metrics:
        return (f"memory: {significant(metrics['predicted_peak_bytes'] / mib)} MiB of working memory predicted, not "
                f"measured (memory.meter off); {process}")
    return (f"memory: working peak {significant(metrics['working_peak_planned_bytes'] / mib)} MiB of the fit and "
            f"predictions against {significant(metrics['predicted_peak_bytes'] / mib)} MiB predicted "
            f"(working_peak_ratio {significant(metrics['working_peak_ratio'])}); {process}")


def run_metrics(prepared: Prepared, fit: Fit) -> Dict[str, float]:
    """The phases' times and peaks, the plan's figures, the OOM retries and the CG's report."""
    recorder, plan, stats = prepared.recorder, fit.plan, fit.stats
    metrics = dict(recorder.metrics())
    metrics.update({
        "fit_seconds": fit_seconds(recorder),
        "predicted_peak_bytes": plan.predicted_peak, "minimal_limit_bytes": plan.minimal_limit,
        "tracker_peak_bytes": prepared.tracker.peak, "oom_retries": prepared.oom_log.retries,
        "chunk_groups": stats.group_chunk, "chunk_rows": plan.fit.rows,
        "n_train_rows": float(len(prepared.splits.train)), "n_test_rows": float(len(prepared.splits.test)),
        "safety_margin_bytes": prepared.config.memory.safety_margin_bytes,
        "recording_reserve_bytes": recording_reserve(prepared.config.tracking, prepared.splits.n_scored,
                                                     len(prepared.config.intervals.levels)),
    })
    metrics.update({"fit_setup_seconds": stats.setup_seconds, "fit_solve_seconds": stats.solve_seconds})
    planned = recorder.working_peak(PLANNED_PHASES)  # the measured side of the plan's prediction (0: not metered)
    if planned > 0 and plan.predicted_peak > 0:
        metrics.update({"working_peak_planned_bytes": planned, "working_peak_ratio": planned / plan.predicted_peak})
    if fit.selection is not None:
        metrics.update(fit.selection.metrics())
    if plan.route == "cg":
        metrics.update({"cg_iterations": stats.cg_iterations, "cg_final_residual": stats.cg_final_residual,
                        "cg_unconverged_groups": stats.cg_unconverged_groups})
    return metrics
