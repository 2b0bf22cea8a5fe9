"""`RayClusterLauncher`: hydra/launcher=ray_cluster, a multirun's jobs as Ray tasks on a running Ray
cluster (conf/hydra/launcher/ray_cluster.yaml).

It takes the config shape of hydra-ray-launcher's RayLauncher (``ray.init``, ``ray.remote``) and runs
jobs the same way, on Ray's core alone (the plugin itself is not needed), but waits for every job and
does not end the sweep when one is lost: a job whose Ray worker died (SIGKILL, a kernel OOM kill, a
lost node) has its run marked KILLED in the tracking store and counts as a failed job in the parent's
summary, while the other jobs finish (`tamrun.sweeps.ray_launch`).
Importing this module imports neither Ray nor tamrun: Hydra imports every plugin module at start.
"""

from __future__ import annotations

from typing import Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class RayClusterLauncher(Launcher):
    """Hydra's launcher interface over `tamrun.sweeps.ray_launch.launch`; ``ray``: {init: ray.init's keyword
    arguments, remote: ray.remote's options for each job}."""

    def __init__(self, ray: DictConfig) -> None:
        self.ray_cfg = ray
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from tamrun.sweeps.ray_launch import launch

        return launch(self, job_overrides, initial_job_idx)

    def __repr__(self) -> str:
        return f"RayClusterLauncher(ray={self.ray_cfg!r})"


__all__ = ["RayClusterLauncher"]
