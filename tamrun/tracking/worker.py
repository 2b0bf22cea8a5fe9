"""Where a job ran when a cluster launcher placed it: the Ray node, task and the resources Ray
reserved for it, as run tags (``ray.node_id``, ``ray.task_id``, ``ray.resources``), and the names (never the
values) of the variables its runtime environment handed it (``ray.env``: `tamrun.cluster.env`).

Ray is looked at only when the process already imported it (a Ray worker has): a run outside Ray
gets no tags and imports nothing."""

from __future__ import annotations

import json
import os
import logging
import sys
from typing import Dict

log = logging.getLogger(__name__)

# The names of the secret variables a Ray task was handed as its argument (`tamrun.sweeps.ray_launch`), not in
# its runtime environment: the run's ray.env tag lists them with the others.
SECRET_NAMES = "TAMRUN_RAY_SECRET_NAMES"


def ray_worker_tags() -> Dict[str, str]:
    """The Ray tags of this process's run; {} outside a Ray task (or when Ray cannot tell)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    try:
        context = ray.get_runtime_context()
        task_id = context.get_task_id()
        if task_id is None:  # the driver, not a task
            return {}
        secrets = [name for name in os.environ.get(SECRET_NAMES, "").split(",") if name]
        env = sorted({*(context.runtime_env.get("env_vars") or {}).keys(), *secrets})
        return {"ray.node_id": context.get_node_id(), "ray.task_id": task_id,
                "ray.resources": json.dumps(context.get_assigned_resources(), sort_keys=True),
                "ray.env": ", ".join(env)}
    except Exception as exc:  # tags are housekeeping: never fail the run for them
        log.warning("could not read the Ray task's context: %s", exc)
        return {}
