"""What a Ray sweep checks before any job starts (`prepare`): it joins the cluster, and refuses with exit
code 2 and one message a runtime environment that would send the jobs' runs elsewhere than the sweep's
parent (`tamrun.cluster.env.check_env`) and a job's request that no node can hold
(`tamrun.cluster.resources.refuse_impossible`). The sweep callback calls it as the sweep opens, before its
parent run exists (`tamrun.sweeps.sweep`); the launcher again before submitting (`tamrun.sweeps.ray_launch`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf

from tamrun.errors import ConfigError

log = logging.getLogger(__name__)


def options(config: DictConfig, key: str) -> Dict[str, Any]:
    """``hydra.launcher.ray.<key>`` (init or remote) as a plain dict."""
    return OmegaConf.to_container(config.hydra.launcher.ray.get(key) or {}, resolve=True) or {}


def start_ray(init: Dict[str, Any], setting: str = "hydra.launcher.ray.init.address") -> None:
    """Join (or start) the cluster ``ray.init`` names, once per process; a cluster that does not answer is
    refused naming ``setting`` (where its address was given)."""
    import ray

    if ray.is_initialized():
        return
    log.info("joining the Ray cluster: ray.init(%s)", init)
    try:
        ray.init(**init)
    except ConnectionError as exc:
        raise ConfigError(setting, init.get("address"),
                          f"no Ray cluster answers there ({str(exc).strip().splitlines()[0][:300]})",
                          "start one (ray start --head) or give its head's address, <host>:<port>; null starts "
                          "a Ray instance of this process's own") from None


def prepare(config: DictConfig) -> None:
    """Before any job starts: refuse a runtime environment that would send the jobs' runs elsewhere, join
    the cluster, refuse a request no node can hold (module doc)."""
    import ray

    from tamrun.cluster.env import check_env
    from tamrun.cluster.resources import refuse_impossible

    init, remote = options(config, "init"), options(config, "remote")
    check_env(config.get("tracking") or {}, init, remote)
    start_ray(init)
    refuse_impossible(remote, ray.nodes(), str(init.get("address") or "this process's own Ray"))
