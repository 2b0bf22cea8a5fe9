"""run(cfg): build the parts from the config and hand them to the job the config names.

    config -> device manager -> MLflow run -> prepare (data, features, plan: `tamrun.jobs.prepare`)
           -> job: run (`tamrun.jobs.fit`), plan (`tamrun.jobs.plan`), adaptive (`tamrun.adaptive.job`) or
              backtest (`tamrun.adaptive.backtest`)
    mode=aggregate: config -> device manager -> MLflow run -> `tamrun.aggregate.job` (prepares each expert)
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

import torch
from omegaconf import DictConfig, OmegaConf

import tamrun
from tamrun.adaptive.backtest import backtest_job, backtest_split, prepare_backtest
from tamrun.adaptive.job import adaptive_job
from tamrun.aggregate.job import aggregate_job
from tamrun.config.load import resolved_container, typed_config
from tamrun.config.schema import Config, ModeName, ShardOver
from tamrun.device.manager import DeviceManager, resolved_kind
from tamrun.errors import note_run
from tamrun.data.table import Table
from tamrun.jobs.fit import fit_job
from tamrun.jobs.plan import plan_job
from tamrun.jobs.prepare import Prepared, prepare
from tamrun.jobs.record import record_inputs
from tamrun.jobs.refit import refit_job
from tamrun.jobs.result import RunResult
from tamrun.jobs.shard import shard_job
from tamrun.jobs.stream import stream_job, stream_plan
from tamrun.pipeline import DTYPES
from tamrun.machine.threads import applied_wait_policy
from tamrun.tracking.mlflow_run import TrackedRun, close_stale_runs_of
from tamrun.tracking.params import experiment_params
from tamrun.tracking import run_names
from tamrun.sweeps.sweep import objective_name
from tamrun.tracking.source import source_tags

log = logging.getLogger(__name__)

# The jobs that fit and record, by mode (mode=plan runs `plan_job`, without an MLflow run).
TRACKED_JOBS: Dict[ModeName, Callable[[Prepared, TrackedRun], RunResult]] = {
    ModeName.run: fit_job,
    ModeName.adaptive: adaptive_job,
    ModeName.backtest: backtest_job,
}


def run(cfg: Any, overrides: Optional[List[str]] = None, tags: Optional[Dict[str, str]] = None,
        run_name: Optional[str] = None, libraries_loaded: Optional[Callable[[], None]] = None,
        folder: Optional[str] = None) -> RunResult:
    """Fit, evaluate and record one experiment described by a composed config (``mode=plan``: only
    plan the memory, without fitting and without an MLflow run). ``tags`` are added to the run's
    (a sweep job's sweep id and parent run); ``run_name`` names it (default: `plain_run_name`, numbered
    when the experiment has a run of that name; a sweep job's: its swept values; ``tracking.run_name``
    wins over both). ``libraries_loaded`` is called
    once the run has imported every library it uses, before its data is read (`tamrun.process.collector`).
    ``folder``: the command's run folder (Hydra's output_dir), which the run's last line names.

    Raises:
        tamrun.errors.TamrunError: bad config, data, device or memory limit (the MLflow run, if
            started, is left FAILED).
        Exception: any other error is a bug (the MLflow run, if started, is left FAILED too). Either
            error's ``run_id`` names the run it ended, if one had started (`tamrun.errors.note_run`).
    """
    config, specs = typed_config(cfg)
    torch.manual_seed(config.seed)
    if config.mode.name == ModeName.plan:
        devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
        close_stale_runs_of(config.tracking, "mode=plan")  # the store it would record in, if it exists
        with devices.session(), devices.oom_refused(config.memory.safety_margin_bytes):
            table = Table.open(config.data)
            stream = stream_plan(config, specs, devices, table)  # a streamed run's plan: its first chunk's
            return plan_job(prepare(config, specs, devices, fitting=False, libraries_loaded=libraries_loaded,
                                    chunk=stream.chunks[0] if stream is not None else None, table=table))
    name = run_name or plain_run_name(config, overrides)
    with TrackedRun(config.tracking, run_name=name, tags=run_tags(config, tags), objective=objective_name(config),
                    number_reruns=run_name is None, folder=folder) as tracked:
        try:
            log_config(tracked, cfg, overrides)
            devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
            tracked.set_tags({"device": devices.name, "device_kind": devices.kind, **thread_tags(devices)})
            with devices.session(), devices.oom_refused(config.memory.safety_margin_bytes):
                result = tracked_job(cfg, config, specs, devices, tracked, libraries_loaded)
        except Exception as error:  # bad input or a bug: the caller learns which run the error ended FAILED
            note_run(error, tracked.run_id)
            raise
        result.run_id = tracked.run_id
    return result


def plain_run_name(config: Config, overrides: Optional[List[str]]) -> str:
    """``<model>-<data>`` and what the command line's ``overrides`` and the device change
    (`tamrun.tracking.run_names.run_name`)."""
    kind = resolved_kind(config.hw.device.value, config.hw.preference)
    return run_names.run_name(model_label(config), config.data.name, overrides or (), kind)


def tracked_job(cfg: Any, config: Config, specs: Dict[str, Any], devices: DeviceManager, tracked: TrackedRun,
                libraries_loaded: Optional[Callable[[], None]]) -> RunResult:
    """The job of ``config.mode``: mode=aggregate prepares each of its experts itself; the others open the
    table once (`tamrun.data.table.Table`), share one preparation (`prepare`) and record the splits as the
    run's inputs."""
    if config.mode.name == ModeName.aggregate:
        return aggregate_job(cfg, config, devices, tracked, libraries_loaded)
    if config.mode.name == ModeName.backtest:  # its split: every row up to the last window's horizon
        config = backtest_split(config)
    table = Table.open(config.data)  # the run's one opening of its table (`tamrun.data.table`)
    if config.shard.over == ShardOver.ray:  # chunks of groups as tasks of a Ray cluster
        if libraries_loaded is not None:
            libraries_loaded()
        return shard_job(resolved_container(cfg), config, specs, devices, tracked, table)
    stream = stream_plan(config, specs, devices, table)
    if stream is not None:  # the table does not fit in memory: chunks of groups, one after another
        if libraries_loaded is not None:
            libraries_loaded()
        return stream_job(stream, config, specs, devices, tracked)
    if config.mode.name == ModeName.backtest:
        prepared = prepare_backtest(config, specs, devices, libraries_loaded, table)
    else:
        prepared = prepare(config, specs, devices, libraries_loaded=libraries_loaded, table=table)
    record_inputs(tracked, prepared)
    job = refit_job if config.split.refit else TRACKED_JOBS[config.mode.name]  # split.refit: mode=run only
    return job(prepared, tracked)


def model_label(config: Config) -> str:
    """What the run fits: the model preset's name, or ``aggregate`` for mode=aggregate (its experts' models)."""
    return "aggregate" if config.mode.name == ModeName.aggregate else config.model.name


def run_tags(config: Config, extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    """The run's tags: tamrun's version, the model and data names, MLflow's source and user tags
    (`tamrun.tracking.source`), tracking.tags, and ``extra``."""
    return {"tamrun_version": tamrun.__version__, "model": model_label(config), "data": config.data.name,
            **source_tags(), **config.tracking.tags, **(extra or {})}


def thread_tags(devices: DeviceManager) -> Dict[str, str]:
    """``threads`` (torch's intra-op threads on the CPU), ``threads_reason`` (the rule that chose them,
    `tamrun.machine.threads`) and ``omp_wait`` (how they wait between parallel regions, `applied_wait_policy`);
    none off the CPU."""
    if devices.threads is None:
        return {}
    return {"threads": str(devices.threads.count), "threads_reason": devices.threads.reason,
            "omp_wait": applied_wait_policy()}


def log_config(tracked: TrackedRun, cfg: Any, overrides: Optional[List[str]]) -> None:
    """The experiment's settings as params (`tamrun.tracking.params.experiment_params`), the whole
    resolved config as config/resolved.yaml, and the command line's overrides."""
    tracked.log_params(experiment_params(resolved_container(cfg), resolved_container(Config())))
    resolved_yaml = OmegaConf.to_yaml(cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg), resolve=True)
    tracked.log_text(resolved_yaml, "config/resolved.yaml")
    tracked.log_text("\n".join(overrides or []) + "\n", "config/overrides.txt")
