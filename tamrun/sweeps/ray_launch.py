"""A multirun's jobs as Ray tasks (`launch`, for hydra/launcher=ray_cluster's `RayClusterLauncher`).

Before any job starts (`prepare`, called as the sweep opens), the launching process joins the cluster and
refuses, with exit code 2 and one message, a job's request that no node can hold (`tamrun.cluster.resources`)
and a runtime environment that would send the jobs' runs elsewhere than the sweep's parent
(`tamrun.cluster.env`). Each job then runs as hydra-ray-launcher's launcher runs it (Hydra's ``run_job`` inside a
Ray task holding ``ray.remote``'s resources: its torch threads follow ``num_cpus``, `tamrun.machine.threads`), with
the launching shell's tracking variables, run tag and sweep id (`tamrun.cluster.env.job_env`), in the launching
folder when its node has it, and the sweep folder's absolute path; the launcher waits for all of them.

A job whose task raised (its error crossed Ray whole: `tamrun.errors` pickle) is named and recorded as a
failed job; a job whose task is lost (`ray.exceptions.RayError`: its worker process died, its node left)
does not end the sweep: its run, left RUNNING by the dead process, is marked KILLED with the reason
(`tamrun.sweeps.lost_jobs`, held when the store does not answer). Either returns NaN to the sweeper like
any job that failed alone; the parent's summary then lists it and the command exits non-zero. SIGTERM or
SIGINT while the jobs run cancels them (their runs KILLED) and ends the command as an interrupt.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, open_dict

from tamrun.cluster.start import options, prepare

log = logging.getLogger(__name__)


def run_job_in_ray(hydra_context: Any, sweep_config: DictConfig, task_function: Any,
                   singleton_state: Dict[Any, Any], cwd: str = "",
                   secret_env: Optional[Dict[str, str]] = None) -> JobReturn:
    """One job inside its Ray task: the launching shell's secret variables set (``secret_env``, handed as an
    argument, never in the runtime environment Ray logs: `tamrun.cluster.env.split_secrets`), in the launching
    folder ``cwd`` when this node has it (relative paths of the config mean what they meant there), Hydra's
    state restored, then Hydra's ``run_job``."""
    os.environ.update(secret_env or {})
    from tamrun.tracking.worker import SECRET_NAMES

    os.environ[SECRET_NAMES] = ",".join(sorted(secret_env or {}))  # their names, for the run's ray.env tag
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    own = OwnLines(sys.stderr)
    with contextlib.redirect_stderr(own):
        result = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                         job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    result.tamrun_lines = own.lines  # the launcher prints them: the worker's terminal is not this one
    return result


class OwnLines(io.TextIOBase):
    """A stream that passes everything to ``stream`` and keeps tamrun's own lines (``tamrun: ...``, a job's
    error), which a Ray job hands back to the launcher (`run_job_in_ray`)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.lines, self.partial = stream, [], ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        *done, self.partial = (self.partial + text).split("\n")
        self.lines.extend(line for line in done if line.startswith("tamrun:"))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def job_config(launcher: Any, overrides: Sequence[str], idx: int) -> DictConfig:
    """The config of job ``idx`` (its number in the sweep) with ``overrides``; its sweep folder absolute,
    as the launching process resolved it (a worker's own folder is another)."""
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"ray_job_{idx}"
        sweep_config.hydra.job.num = idx
        sweep_config.hydra.sweep.dir = str(Path(str(launcher.config.hydra.sweep.dir)).resolve())
    return sweep_config


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> List[JobReturn]:
    """Submit every job as a Ray task, then collect each (module doc)."""
    import ray

    from tamrun.cluster.env import job_env, remote_options, split_secrets

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    prepare(launcher.config)
    env, secret_env = split_secrets(job_env(launcher.config.get("tracking") or {}))
    remote = ray.remote(**remote_options(options(launcher.config, "remote"), env))(run_job_in_ray)
    log.info("Ray cluster launcher: %d job(s), %s each; from this shell: %s", len(job_overrides),
             dict(launcher.ray_cfg.remote or {}), ", ".join(sorted({**env, **secret_env})))
    submitted = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        config = job_config(launcher, overrides, idx)
        ref = remote.remote(hydra_context=launcher.hydra_context, sweep_config=config,
                            task_function=launcher.task_function, singleton_state=Singleton.get_state(),
                            cwd=os.getcwd(), secret_env=secret_env)
        submitted.append((idx, list(overrides), config, ref))
    return collect_all(ray, submitted)


def collect_all(ray: Any, submitted: List[tuple]) -> List[JobReturn]:
    """Every job's result in order (`collect`); SIGTERM (or SIGINT) meanwhile cancels the jobs not done,
    their runs marked KILLED, and is raised as the interrupt it is."""
    from tamrun.tracking.signals import signals_as_interrupts

    results: List[JobReturn] = []
    try:
        with signals_as_interrupts():  # Ray's own SIGTERM handler would exit without a word
            for idx, overrides, config, ref in submitted:
                results.append(collect(ray, idx, overrides, config, ref))
    except KeyboardInterrupt as interrupt:
        for idx, overrides, config, ref in submitted[len(results):]:
            ray.cancel(ref, force=True)
            lost(config, idx, overrides, f"the sweep was interrupted ({interrupt or 'SIGINT'}): its Ray task was "
                                         "cancelled")
        raise
    return results


def collect(ray: Any, idx: int, overrides: List[str], config: DictConfig, ref: Any) -> JobReturn:
    """Job ``idx``'s result; a job whose task raised or was lost is recorded as such and returns NaN."""
    try:
        result = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the task raised: its own error, unpickled whole
        return failed(config, idx, overrides, exc.cause if exc.cause is not None else exc)
    except ray.exceptions.RayError as exc:
        reason = f"its Ray task was lost ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]})"
        log.error("sweep job #%d: %s", idx, reason)
        lost(config, idx, overrides, reason)
        return nan_result(config, overrides)
    if result.status == JobStatus.FAILED:  # Hydra's run_job caught an error the job did not name
        return failed(config, idx, overrides, result._return_value)
    said(idx, config, result)
    return result


def said(idx: int, config: DictConfig, result: JobReturn) -> None:
    """Job ``idx``'s end, said once by the launcher, in job order (Ray's forwarding of the workers' own lines
    is off: `log_to_driver` in conf/hydra/launcher/ray_cluster.yaml): the job's own tamrun lines (its
    error), then its objective and where its log is."""
    from tamrun.numbers import significant
    from tamrun.sweeps.sweep import objective_name

    for line in getattr(result, "tamrun_lines", []):
        log.error("sweep job #%d: %s", idx, line)
    value = result.return_value
    folder = result.hydra_cfg.hydra.runtime.output_dir if getattr(result, "hydra_cfg", None) else config.hydra.sweep.dir
    state = f"{objective_name(config)}={significant(value)}" if isinstance(value, float) and math.isfinite(value) \
        else "did not finish"
    log.info("sweep job #%d: %s (its log: %s)", idx, state, Path(str(folder)) / "tamrun.log")


def failed(config: DictConfig, idx: int, overrides: List[str], error: BaseException) -> JobReturn:
    """A job whose error came back through Ray: named as the job would name it, recorded FAILED (unless it
    ended a run of its own) and held when the store does not answer; NaN to the sweeper."""
    from tamrun.errors import TamrunError, internal_error_line
    from tamrun.process.outcome import folder_place, named
    from tamrun.sweeps.sweep import record_failed_job, sweep_run_name, sweep_tags

    sweep_dir = str(config.hydra.sweep.dir)
    error = named(error, [folder_place(True, Path(sweep_dir))])
    line = error.report_line() if isinstance(error, TamrunError) else internal_error_line(error, None)
    log.error("sweep job #%d: %s", idx, line.strip())
    if getattr(error, "run_id", None) is None:
        record_failed_job(config, sweep_tags(sweep_dir, idx, overrides), error,
                          sweep_run_name(sweep_dir, idx, overrides, config), sweep_dir=sweep_dir)
    return nan_result(config, overrides)


def lost(config: DictConfig, idx: int, overrides: List[str], reason: str) -> None:
    """Record job ``idx``'s lost task (`record_lost_job`), or hold it when the store does not answer."""
    from tamrun.sweeps.lost_jobs import hold_lost_job, record_lost_job

    try:
        record_lost_job(config, idx, overrides, reason)
    except Exception as err:  # the store did not answer: held, written when it does
        hold_lost_job(config, idx, overrides, reason, err)


def nan_result(config: DictConfig, overrides: List[str]) -> JobReturn:
    """A failed job's result for the sweeper: completed, NaN (the sweep goes on; the summary names it)."""
    return JobReturn(overrides=list(overrides), cfg=config, status=JobStatus.COMPLETED, _return_value=math.nan)
