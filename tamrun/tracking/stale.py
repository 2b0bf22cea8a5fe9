"""Runs left RUNNING by a process that is gone (SIGKILL, a kernel OOM kill, a lost node).

Every run is tagged with its process: ``tamrun.host``, ``tamrun.pid`` and ``tamrun.process_started``
(the process's start time, so that a reused pid is not mistaken for the run's process). When a run
opens, the RUNNING runs of its experiment started on the same host whose process is no longer there
are marked KILLED, with the tag ``tamrun.killed_reason`` saying why and by which run.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Dict

import psutil

log = logging.getLogger(__name__)

HOST, PID, STARTED, REASON = "tamrun.host", "tamrun.pid", "tamrun.process_started", "tamrun.killed_reason"


def process_tags() -> Dict[str, str]:
    """This process's identity as run tags."""
    return {HOST: socket.gethostname(), PID: str(os.getpid()), STARTED: repr(psutil.Process().create_time())}


def process_alive(pid: int, started: float) -> bool:
    """Whether process ``pid`` exists and is the one that started at ``started`` (seconds since the epoch)."""
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1e-3
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def close_stale_runs(client, experiment_id: str, current_run_id: str) -> int:
    """Mark KILLED every RUNNING run of the experiment from this host whose process is gone; returns
    how many. Runs without the process tags (older tamrun, other tools) are left alone."""
    host = socket.gethostname()
    running = client.search_runs([experiment_id], filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST}` = '{host}'",
                                 max_results=1000)
    closed = 0
    for stale in running:
        tags = stale.data.tags
        if stale.info.run_id == current_run_id or PID not in tags or STARTED not in tags:
            continue
        if process_alive(int(tags[PID]), float(tags[STARTED])):
            continue
        reason = f"its process (pid {tags[PID]} on {host}) ended without recording the run's end; found by run {current_run_id}"
        client.set_tag(stale.info.run_id, REASON, reason)
        client.set_terminated(stale.info.run_id, status="KILLED")
        log.warning("MLflow run %s was left RUNNING by a process that is gone: marked KILLED", stale.info.run_id)
        closed += 1
    return closed
