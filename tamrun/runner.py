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
from tamrun.config.schema import Config, DType
from tamrun.data.batch import GroupedBatch, build_batch
from tamrun.data.checks import apply_nan_policy, check_table
from tamrun.data.derive import add_derived_columns
from tamrun.data.load import load_table
from tamrun.data.split import split_by_date
from tamrun.device import DeviceManager
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign, describe, needed_columns
from tamrun.effects.registry import build_effects
from tamrun.errors import DataError
from tamrun.evaluate import group_metrics, predictions_table, split_metrics
from tamrun.memory.footprint import ProblemSize
from tamrun.memory.guard import OomLog, oom_settings
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.memory.profiler import PhaseRecorder
from tamrun.memory.units import parse_size
from tamrun.solve.dispatcher import Dispatcher, FitStats
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.plots import forecast_figure

log = logging.getLogger(__name__)

DTYPES = {DType.float64: torch.float64, DType.float32: torch.float32}


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


@dataclass
class PreparedData:
    train_frame: pd.DataFrame
    test_frame: pd.DataFrame
    train: GroupedBatch
    test: GroupedBatch
    design: AdditiveDesign


def git_commit() -> Optional[str]:
    """The checkout's HEAD commit when tamrun runs from a git clone, else None."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(tamrun.__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def prepare_data(config: Config, specs: Dict[str, Any], dtype: torch.dtype) -> PreparedData:
    """Load, derive, check, split and batch the data; build and fit the design on the training split."""
    data = config.data
    frame = add_derived_columns(load_table(data), data.derived, data.date_column)
    effects = build_effects(specs)
    numeric = {"data.target": data.target}
    numeric.update({f"model.effects.{e.name}.column": e.column for e in effects})
    group_field = {"data.group": data.group} if data.group else {}
    check_table(frame, numeric, group_field)
    frame = apply_nan_policy(frame, numeric, data.nan_policy)
    train_frame, test_frame = split_by_date(frame, config.split, data.date_column)
    columns = needed_columns(effects)
    train = build_batch(train_frame, columns, data.target, data.group, dtype)
    test = build_batch(test_frame, columns, data.target, data.group, dtype, groups=train.groups)
    design = AdditiveDesign(effects, columns, config.model.intercept, config.model.intercept_ap).fit(train)
    smallest = int(train.counts.min())
    if smallest < design.width:
        group = train.groups[int(train.counts.argmin())]
        raise DataError("data.group", data.group, f"group {group!r} has {smallest} training rows, fewer than the "
                        f"model's {design.width} coefficients", "train on a longer period, or use fewer/smaller effects")
    for effect in effects:
        if isinstance(effect, CategoricalEffect):
            unseen = effect.unseen_levels(test_frame[effect.column].to_numpy())
            if unseen:
                raise DataError(f"model.effects.{effect.name}.column", effect.column,
                                f"level(s) {unseen[:5]} appear in the test split but never in training",
                                "train on a period that contains every level, or merge rare levels")
    return PreparedData(train_frame, test_frame, train, test, design)


def run(cfg: Any, overrides: Optional[List[str]] = None) -> RunResult:
    """Fit, evaluate and record one experiment described by a composed config.

    Raises:
        tamrun.errors.TamrunError: bad config, data, device or memory limit (the MLflow run, if
            started, is left FAILED).
    """
    config, specs = typed_config(cfg)
    dtype = DTYPES[config.dtype]
    torch.manual_seed(config.seed)
    tags = {"tamrun_version": tamrun.__version__, "model": config.model.name, "data": config.data.name}
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
    with TrackedRun(config.tracking, run_name=f"{config.model.name}-{config.data.name}", tags=tags) as tracked:
        tracked.log_params(resolved_container(cfg))
        resolved_yaml = OmegaConf.to_yaml(cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg), resolve=True)
        tracked.log_text(resolved_yaml, "config/resolved.yaml")
        tracked.log_text("\n".join(overrides or []) + "\n", "config/overrides.txt")
        devices = DeviceManager(config.hw.device.value, config.hw.preference, dtype, config.hw.threads)
        tracked.set_tags({"device": devices.name, "device_kind": devices.kind})
        result = _fit_and_evaluate(config, specs, dtype, devices, tracked)
        result.run_id = tracked.run_id
    return result


def _fit_and_evaluate(config: Config, specs: Dict[str, Any], dtype: torch.dtype, devices: DeviceManager,
                      tracked: TrackedRun) -> RunResult:
    recorder = PhaseRecorder(devices)
    limit = parse_size(config.memory.limit)
    devices.set_limit(limit)
    with recorder.phase("data"):
        prepared = prepare_data(config, specs, dtype)
    train, test, design = prepared.train, prepared.test, prepared.design.to(devices.device)

    size = ProblemSize(n_groups=len(train.groups), n_rows=train.x.shape[1], width=design.width,
                       n_features=len(design.columns), itemsize=torch.finfo(dtype).bits // 8)
    oracle = MemoryOracle(config.memory, limit, on_gpu=devices.kind != "cpu")
    plan = oracle.plan(size, devices.memory().free, config.solver.name.value,
                       n_predict_rows=max(train.x.shape[1], test.x.shape[1]))
    oom_log = OomLog()
    dispatcher = Dispatcher(design, devices, plan, config.solver, oom_settings(config.memory.oom), oom_log)
    log.info("fitting %d groups, D=%d, route=%s", size.n_groups, size.width, plan.route)
    with recorder.phase("fit"):
        coef, stats = dispatcher.fit(train)
    with recorder.phase("predict"):
        predicted_train = dispatcher.predict(train, coef)
        predicted_test = dispatcher.predict(test, coef)

    data = config.data
    table = pd.concat([
        predictions_table(prepared.train_frame, train, predicted_train, data.date_column, data.group, "train"),
        predictions_table(prepared.test_frame, test, predicted_test, data.date_column, data.group, "test"),
    ], ignore_index=True)
    metrics = split_metrics(table)
    metrics.update(recorder.metrics())
    metrics.update({
        "predicted_peak_bytes": plan.predicted_peak, "oom_retries": oom_log.retries,
        "n_train_rows": float(train.counts.sum()), "n_test_rows": float(test.counts.sum()),
    })
    if plan.route == "cg":
        metrics.update({"cg_iterations": stats.cg_iterations, "cg_final_residual": stats.cg_final_residual,
                        "cg_unconverged_groups": stats.cg_unconverged_groups})
    log.info("rmse_train=%.1f rmse_test=%.1f mape_test=%.3f%% fit=%.2fs", metrics["rmse_train"], metrics["rmse_test"],
             metrics["mape_test"], metrics["fit_seconds"])

    tracked.log_params({"route": plan.route, "route_reason": plan.reason, "D": design.width,
                        "n_groups": size.n_groups, "chunk_groups": stats.group_chunk, "chunk_rows": plan.fit.rows,
                        "predict_chunk_groups": plan.predict.groups, "predict_chunk_rows": plan.predict.rows,
                        "cg_cache_design": plan.cache_design})
    tracked.log_metrics(metrics)
    if stats.cg_history:
        tracked.log_metric_history("cg_residual", stats.cg_history)
    tracked.log_json({"plan": plan.as_dict(), "oom_events": oom_log.as_dicts(),
                      "phases": {k: vars(v) for k, v in recorder.phases.items()}}, "memory/report.json")
    tracked.log_text(describe(design) + "\n", "model/design.txt")
    if config.tracking.log_predictions:
        tracked.log_frame(table, "predictions/predictions.csv")
        tracked.log_frame(group_metrics(table), "predictions/group_metrics.csv")
    tracked.log_frame(pd.DataFrame(coef.numpy(), index=pd.Index(train.groups, name="group"),
                                   columns=[f"{name}[{i - s.start}]" for name, s in design.block_slices()
                                            for i in range(s.start, s.stop)]).reset_index(), "model/coefficients.csv")
    if config.tracking.log_plots:
        figure = forecast_figure(table, title=f"{config.model.name}: test RMSE {metrics['rmse_test']:.1f}")
        tracked.log_figure(figure, "plots/forecast.png")
    return RunResult(run_id=None, route=plan.route, width=design.width, groups=train.groups, coef=coef,
                     metrics=metrics, predictions=table, plan=plan, stats=stats)



