"""Sweep jobs whose process was lost before it could record the run's end (a cluster launcher's
worker killed, its node gone): their run is marked KILLED from the launching process, which knows
the job is over, whatever host the job ran on (`tamrun.tracking.stale` only sees this host's runs).
"""

from __future__ import annotations

import logging
from typing import List

from omegaconf import DictConfig

from tamrun.tracking.stale import REASON
from tamrun.tracking.sweep import (SWEEP_ID_TAG, SWEEP_JOB_TAG, read_sweep_file, record_refused_job, sweep_run_name,
                                   sweep_tags)

log = logging.getLogger(__name__)


def record_lost_job(config: DictConfig, job_num: int, overrides: List[str], reason: str) -> None:
    """Mark KILLED (tag ``tamrun.killed_reason``: ``reason``) the RUNNING run of sweep job ``job_num``
    (one already closed KILLED by another job's stale-run check gets ``reason`` added to its tag); a job
    lost before its run started gets a FAILED run of its own (the summary then lists it)."""
    from tamrun.tracking.store import open_client

    sweep_dir = str(config.hydra.sweep.dir)
    info = read_sweep_file(sweep_dir)
    if not info.get("tracking_uri"):
        return
    client = open_client(info["tracking_uri"], info["busy_timeout_s"], info["lock_timeout_s"])
    query = f"tags.{SWEEP_ID_TAG} = '{info['sweep_id']}' and tags.{SWEEP_JOB_TAG} = '{job_num}'"
    runs = client.search_runs([info["experiment_id"]], filter_string=query, max_results=100)
    for run in runs:
        if run.info.status == "RUNNING":
            client.set_tag(run.info.run_id, REASON, reason)
            client.set_terminated(run.info.run_id, status="KILLED")
            log.warning("sweep job #%d: run %s marked KILLED: %s", job_num, run.info.run_id, reason)
        elif run.info.status == "KILLED" and reason not in run.data.tags.get(REASON, ""):
            # closed already by another job's stale-run check on the same host: keep its note, add why
            client.set_tag(run.info.run_id, REASON, f"{reason}; {run.data.tags.get(REASON, 'closed KILLED')}")
    if not runs:
        tags = sweep_tags(sweep_dir, job_num, overrides)
        record_refused_job(config, tags, RuntimeError(reason), sweep_run_name(sweep_dir, job_num, overrides, config))
