"""run(cfg): build every part from the config and call them in order.

    config -> device manager -> data (load, derive, check, split, batch) -> effects + design
           -> memory oracle (route, chunks) -> dispatcher (fit under the OOM guard) -> predict
           -> evaluation -> MLflow (params, metrics, artifacts, tags)
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

import tamrun
from tamrun.config.load import resolved_container, typed_config
from tamrun.config.schema import Config, ModeName
from tamrun.device import DeviceManager
from tamrun.effects.design import describe
from tamrun.evaluate import group_metrics, predictions_table, split_metrics
from tamrun.memory.guard import OomLog
from tamrun.memory.meter import TensorMeter
from tamrun.memory.oracle import Plan
from tamrun.memory.profiler import PhaseRecorder
from tamrun.memory.report import memory_report, report_text
from tamrun.memory.tracker import MemoryTracker
from tamrun.memory.units import parse_size
from tamrun.pipeline import DTYPES, build_features, load_splits, plan_memory, prediction_batch, solve
from tamrun.solve.dispatcher import FitStats
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.plots import forecast_figure, memory_timeline_figure

log = logging.getLogger(__name__)

@dataclass
class RunResult:
    """What one run produced. ``coef`` is (G, D) in group order ``groups``."""

    run_id: Optional[str]
    route: str
    width: int
    groups: list
    coef: torch.Tensor
    metrics: Dict[str, float]
    predictions: pd.DataFrame
    plan: Plan
    stats: FitStats


def git_commit() -> Optional[str]:
    """The checkout's HEAD commit when tamrun runs from a git clone, else None."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(tamrun.__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def run(cfg: Any, overrides: Optional[List[str]] = None) -> RunResult:
    """Fit, evaluate and record one experiment described by a composed config (``mode=plan``: only
    plan the memory, without fitting and without an MLflow run).

    Raises:
        tamrun.errors.TamrunError: bad config, data, device or memory limit (the MLflow run, if
            started, is left FAILED).
    """
    config, specs = typed_config(cfg)
    torch.manual_seed(config.seed)
    if config.mode.name == ModeName.plan:
        devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
        return _plan_only(config, specs, devices)
    tags = {"tamrun_version": tamrun.__version__, "model": config.model.name, "data": config.data.name}
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
    with TrackedRun(config.tracking, run_name=f"{config.model.name}-{config.data.name}", tags=tags) as tracked:
        tracked.log_params(resolved_container(cfg))
        resolved_yaml = OmegaConf.to_yaml(cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg), resolve=True)
        tracked.log_text(resolved_yaml, "config/resolved.yaml")
        tracked.log_text("\n".join(overrides or []) + "\n", "config/overrides.txt")
        devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
        tracked.set_tags({"device": devices.name, "device_kind": devices.kind})
        if config.mode.name == ModeName.adaptive:
            from tamrun.adaptive.job import run_adaptive

            result = run_adaptive(config, specs, devices, tracked)
        else:
            result = _fit_and_evaluate(config, specs, devices, tracked)
        result.run_id = tracked.run_id
    return result


def _prepare(config: Config, specs: Dict[str, Any], devices: DeviceManager, recorder: PhaseRecorder):
    """Data and features phases, then the oracle's plan: (train frame, test frame, features, test batch, plan)."""
    limit = parse_size(config.memory.limit)
    devices.set_limit(limit)
    with recorder.phase("data"):
        train_frame, test_frame = load_splits(config, specs)
    with recorder.phase("features"):
        features = build_features(config, specs, train_frame)
        test = prediction_batch(config, features.design, features.train.groups, test_frame, features.train.x.dtype)
    plan = plan_memory(config, features, devices, n_predict_rows=test.x.shape[1])
    return train_frame, test_frame, features, test, plan


def _plan_only(config: Config, specs: Dict[str, Any], devices: DeviceManager) -> RunResult:
    recorder = PhaseRecorder(devices)
    _, _, features, _, plan = _prepare(config, specs, devices, recorder)
    log.info("mode=plan: nothing fitted")
    return RunResult(run_id=None, route=plan.route, width=features.design.width, groups=features.train.groups,
                     coef=torch.empty(0), metrics={"predicted_peak_bytes": plan.predicted_peak,
                                                   "minimal_limit_bytes": plan.minimal_limit},
                     predictions=pd.DataFrame(), plan=plan, stats=FitStats(plan.route, plan.fit.groups, plan.fit.rows))


def _fit_and_evaluate(config: Config, specs: Dict[str, Any], devices: DeviceManager,
                      tracked: TrackedRun) -> RunResult:
    if config.memory.meter:
        TensorMeter.warm_up()
    recorder = PhaseRecorder(devices)
    train_frame, test_frame, features, test, plan = _prepare(config, specs, devices, recorder)
    limit = parse_size(config.memory.limit)
    oom_log = OomLog()
    tracker = MemoryTracker(plan.budget if limit is not None else None, plan.overhead)
    metered = config.memory.meter
    with recorder.phase("solve", metered):
        model = solve(config, features, plan, devices, oom_log, tracker, recorder.snapshot)
    with recorder.phase("predict", metered):
        predicted_train = model.dispatcher.predict(features.train, model.coef)
        predicted_test = model.dispatcher.predict(test, model.coef)
    with recorder.phase("evaluate"):
        data = config.data
        table = pd.concat([
            predictions_table(train_frame, features.train, predicted_train, data.date_column, data.group, "train"),
            predictions_table(test_frame, test, predicted_test, data.date_column, data.group, "test"),
        ], ignore_index=True)
        metrics = split_metrics(table)
    stats, design, coef = model.stats, model.design, model.coef
    metrics.update(recorder.metrics())
    metrics.update({
        "fit_seconds": recorder.phases["features"].seconds + recorder.phases["solve"].seconds,
        "predicted_peak_bytes": plan.predicted_peak, "minimal_limit_bytes": plan.minimal_limit,
        "tracker_peak_bytes": tracker.peak, "oom_retries": oom_log.retries,
        "chunk_groups": stats.group_chunk, "chunk_rows": plan.fit.rows,
        "n_train_rows": float(len(train_frame)), "n_test_rows": float(len(test_frame)),
    })
    if plan.route == "cg":
        metrics.update({"cg_iterations": stats.cg_iterations, "cg_final_residual": stats.cg_final_residual,
                        "cg_unconverged_groups": stats.cg_unconverged_groups})
    log.info("rmse_train=%.1f rmse_test=%.1f mape_test=%.3f%% fit=%.2fs", metrics["rmse_train"], metrics["rmse_test"],
             metrics["mape_test"], metrics["fit_seconds"])

    tracked.log_params({"route": plan.route, "route_reason": plan.reason, "D": design.width,
                        "n_groups": len(model.groups), "chunk_groups": stats.group_chunk, "chunk_rows": plan.fit.rows,
                        "predict_chunk_groups": plan.predict.groups, "predict_chunk_rows": plan.predict.rows,
                        "cg_cache_design": plan.cache_design})
    tracked.log_metrics(metrics)
    if stats.cg_history:
        tracked.log_metric_history("cg_residual", stats.cg_history)
    report = memory_report(plan, recorder, oom_log, limit, tracker.peak)
    tracked.log_json(report, "memory/report.json")
    tracked.log_text(report_text(report, plan), "memory/report.txt")
    tracked.log_text(describe(design) + "\n", "model/design.txt")
    if config.tracking.log_predictions:
        tracked.log_frame(table, "predictions/predictions.csv")
        tracked.log_frame(group_metrics(table), "predictions/group_metrics.csv")
    tracked.log_frame(pd.DataFrame(coef.numpy(), index=pd.Index(model.groups, name="group"),
                                   columns=[f"{name}[{i - s.start}]" for name, s in design.block_slices()
                                            for i in range(s.start, s.stop)]).reset_index(), "model/coefficients.csv")
    if config.tracking.log_plots:
        figure = forecast_figure(table, title=f"{config.model.name}: test RMSE {metrics['rmse_test']:.1f}")
        tracked.log_figure(figure, "plots/forecast.png")
        tracked.log_figure(memory_timeline_figure(report["snapshots"], limit, plan.predicted_peak),
                           "plots/memory_timeline.png")
    return RunResult(run_id=None, route=plan.route, width=design.width, groups=model.groups, coef=coef,
                     metrics=metrics, predictions=table, plan=plan, stats=stats)
