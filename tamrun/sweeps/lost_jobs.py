"""Sweep jobs whose process was lost before it could record the run's end (a cluster launcher's
worker killed, its node gone): their run is marked KILLED from the launching process, which knows
the job is over, whatever host the job ran on (`tamrun.tracking.stale` only sees this host's runs).

The launcher's reason goes in a tag of its own, ``tamrun.lost_reason``, which nothing else writes: the
stale-run check of another job starting on the same host may find the same run at the same moment,
and the two writes of ``tamrun.killed_reason`` would race (one of them overwrites the other).

When the store does not answer then, the job's end is held in the sweep's folder (`hold_lost_job`,
`tamrun.tracking.sweep_record.held`): its RUNNING run ends KILLED, or it gets a FAILED run, once the store answers.
"""

from __future__ import annotations

import logging
from typing import List

from omegaconf import DictConfig

from tamrun.errors import LOST
from tamrun.tracking.stale import REASON
from tamrun.tracking.sweep_record.held import error_tags, hold_job
from tamrun.sweeps.sweep import record_failed_job, sweep_run_name, sweep_tags
from tamrun.tracking.sweep_record.sweep_files import read_sweep_file
from tamrun.tracking.sweep_record.sweep_summary import SWEEP_ID_TAG, SWEEP_JOB_TAG

log = logging.getLogger(__name__)


LOST_REASON = "tamrun.lost_reason"


def record_lost_job(config: DictConfig, job_num: int, overrides: List[str], reason: str) -> None:
    """Mark KILLED the RUNNING run of sweep job ``job_num``, its tag ``tamrun.lost_reason`` (and
    ``tamrun.killed_reason``, unless another job's stale-run check closed it first) set to ``reason``;
    a job lost before its run started gets a FAILED run of its own (the summary then lists it)."""
    from tamrun.tracking.store.store import open_client

    sweep_dir = str(config.hydra.sweep.dir)
    info = read_sweep_file(sweep_dir)
    if not info.get("tracking_uri"):
        return
    client = open_client(info["tracking_uri"], info["busy_timeout_s"], info["lock_timeout_s"])
    query = f"tags.{SWEEP_ID_TAG} = '{info['sweep_id']}' and tags.{SWEEP_JOB_TAG} = '{job_num}'"
    runs = client.search_runs([info["experiment_id"]], filter_string=query, max_results=100)
    for run in runs:
        if run.info.status not in ("RUNNING", "KILLED"):
            continue  # the job recorded its own end (FINISHED, FAILED) before its process was lost
        client.set_tag(run.info.run_id, LOST_REASON, reason)
        if run.info.status == "RUNNING":
            client.set_tag(run.info.run_id, REASON, reason)
            client.set_tag(run.info.run_id, "error_kind", LOST)
            client.set_terminated(run.info.run_id, status="KILLED")
            log.warning("sweep job #%d: run %s marked KILLED: %s", job_num, run.info.run_id, reason)
    if not runs:
        tags = {**sweep_tags(sweep_dir, job_num, overrides), LOST_REASON: reason}
        record_failed_job(config, tags, RuntimeError(reason), sweep_run_name(sweep_dir, job_num, overrides, config),
                           kind=LOST)


def hold_lost_job(config: DictConfig, job_num: int, overrides: List[str], reason: str, error: BaseException) -> None:
    """Hold what `record_lost_job` could not write (``error``: the store's): the job's RUNNING run ends
    KILLED, or a FAILED run is created for it, once the store answers (`tamrun.tracking.sweep_record.held`)."""
    sweep_dir = str(config.hydra.sweep.dir)
    lost = RuntimeError(reason)
    tags = {**sweep_tags(sweep_dir, job_num, overrides), LOST_REASON: reason, REASON: reason,
            **error_tags(lost, LOST)}
    hold_job(sweep_dir, job_num, sweep_run_name(sweep_dir, job_num, overrides, config), tags, error, status="KILLED")
