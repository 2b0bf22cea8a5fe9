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
from tamrun.config.schema import Config
from tamrun.device import DeviceManager
from tamrun.effects.design import describe
from tamrun.evaluate import group_metrics, split_metrics
from tamrun.memory.guard import OomLog
from tamrun.memory.oracle import Plan
from tamrun.memory.profiler import PhaseRecorder
from tamrun.memory.units import parse_size
from tamrun.pipeline import DTYPES, fit_model, load_splits
from tamrun.solve.dispatcher import FitStats
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.plots import forecast_figure

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
        result = _fit_and_evaluate(config, specs, devices, tracked)
        result.run_id = tracked.run_id
    return result


def _fit_and_evaluate(config: Config, specs: Dict[str, Any], devices: DeviceManager,
                      tracked: TrackedRun) -> RunResult:
    recorder = PhaseRecorder(devices)
    devices.set_limit(parse_size(config.memory.limit))
    oom_log = OomLog()
    with recorder.phase("data"):
        train_frame, test_frame = load_splits(config, specs)
    with recorder.phase("fit"):
        model = fit_model(config, specs, train_frame, devices, oom_log,
                          n_predict_rows=int(test_frame.groupby(config.data.group).size().max())
                          if config.data.group else len(test_frame))
    with recorder.phase("predict"):
        table = pd.concat([model.predict_frame(train_frame, "train"), model.predict_frame(test_frame, "test")],
                          ignore_index=True)
    plan, stats, design, coef = model.plan, model.stats, model.design, model.coef
    metrics = split_metrics(table)
    metrics.update(recorder.metrics())
    metrics.update({
        "predicted_peak_bytes": plan.predicted_peak, "oom_retries": oom_log.retries,
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
    tracked.log_json({"plan": plan.as_dict(), "oom_events": oom_log.as_dicts(),
                      "phases": {k: vars(v) for k, v in recorder.phases.items()}}, "memory/report.json")
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
    return RunResult(run_id=None, route=plan.route, width=design.width, groups=model.groups, coef=coef,
                     metrics=metrics, predictions=table, plan=plan, stats=stats)



