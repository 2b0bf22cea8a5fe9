"""A multirun's jobs as Ray tasks (`launch`, for hydra/launcher=ray_cluster's `RayClusterLauncher`).

Each job runs as hydra-ray-launcher's launcher runs it (Hydra's ``run_job`` inside a Ray task holding
``ray.remote``'s resources: its torch threads follow ``num_cpus``, `tamrun.threads`), and the launcher
waits for all of them. A job whose task is lost (`ray.exceptions.RayError`: its worker process died,
its node left) does not end the sweep: its run, left RUNNING by the dead process, is marked KILLED
with the reason (`tamrun.tracking.lost_jobs`), and the job returns NaN to the sweeper like any job
that failed alone; the parent's summary then lists it and the command exits 2.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from tamrun.run_folder import RUN_TAG

log = logging.getLogger(__name__)


def run_job_in_ray(hydra_context: Any, sweep_config: DictConfig, task_function: Any,
                   singleton_state: Dict[Any, Any], run_tag: str = "") -> JobReturn:
    """One job inside its Ray task: Hydra's state restored, the launching command's ``run_tag`` (the end
    of its sweep folder, `tamrun.run_folder`) set, then Hydra's ``run_job``."""
    os.environ[RUN_TAG] = run_tag
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


def start_ray(init: DictConfig) -> None:
    """Join (or start) the cluster ``ray.init`` names, once per process."""
    import ray

    if not ray.is_initialized():
        kwargs = OmegaConf.to_container(init, resolve=True) or {}
        log.info("joining the Ray cluster: ray.init(%s)", kwargs)
        ray.init(**kwargs)


def job_config(launcher: Any, overrides: Sequence[str], idx: int) -> DictConfig:
    """The config of job ``idx`` (its number in the sweep) with ``overrides``."""
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"ray_job_{idx}"
        sweep_config.hydra.job.num = idx
    return sweep_config


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> List[JobReturn]:
    """Submit every job as a Ray task, then collect each; a lost one becomes a failed job (module doc)."""
    import ray

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    start_ray(launcher.ray_cfg.init)
    remote = ray.remote(**(OmegaConf.to_container(launcher.ray_cfg.remote, resolve=True) or {}))(run_job_in_ray)
    log.info("Ray cluster launcher: %d job(s), %s each", len(job_overrides), dict(launcher.ray_cfg.remote or {}))
    submitted = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        config = job_config(launcher, overrides, idx)
        ref = remote.remote(hydra_context=launcher.hydra_context, sweep_config=config,
                            task_function=launcher.task_function, singleton_state=Singleton.get_state(),
                            run_tag=os.environ.get(RUN_TAG, ""))
        submitted.append((idx, overrides, config, ref))
    return [collect(ray, idx, overrides, config, ref) for idx, overrides, config, ref in submitted]


def collect(ray: Any, idx: int, overrides: Sequence[str], config: DictConfig, ref: Any) -> JobReturn:
    """Job ``idx``'s result; a lost task is recorded (`record_lost_job`) and returns NaN, completed."""
    from tamrun.tracking.lost_jobs import record_lost_job

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        reason = f"its Ray task was lost ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]})"
        log.error("sweep job #%d: %s", idx, reason)
        try:
            record_lost_job(config, idx, list(overrides), reason)
        except Exception as err:  # the other jobs' results matter more than this record
            log.warning("sweep job #%d: its run could not be marked KILLED (%s)", idx, err)
        return JobReturn(overrides=list(overrides), cfg=config, status=JobStatus.COMPLETED, _return_value=math.nan)
