"""Runs left RUNNING by a process that is gone (SIGKILL, a kernel OOM kill, a lost node).

Every run is tagged with its process: ``tamrun.host``, ``tamrun.pid`` and ``tamrun.process_started``
(the process's start time, so that a reused pid is not mistaken for the run's process). Every tamrun
command that opens a store (a run of any experiment, ``python -m tamrun.compare``, ``mode=plan`` when
its store exists) marks KILLED the RUNNING runs of every experiment of that store started on the same
host whose process is no longer there, with the tag ``tamrun.killed_reason`` saying why and by which
command. A run of another host is left to that host's next command (or, for a Ray job, to its
launcher: `tamrun.sweeps.lost_jobs`): its process cannot be looked at from here.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Dict, List, Optional

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


def active_experiments(client) -> List[str]:
    """The ids of every active experiment of ``client``'s store, page by page."""
    ids: List[str] = []
    token = None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        ids.extend(experiment.experiment_id for experiment in page)
        token = page.token
        if not token:
            return ids


def close_stale_runs(client, experiment_id: Optional[str], current_run_id: str) -> int:
    """Mark KILLED every RUNNING run of the experiment (None: of every active experiment of the store) from
    this host whose process is gone; returns how many. ``current_run_id``: the run or command that found
    them (named in the reason). Runs without the process tags (older tamrun, other tools) are left alone."""
    host = socket.gethostname()
    experiments = [experiment_id] if experiment_id is not None else active_experiments(client)
    if not experiments:
        return 0
    running = client.search_runs(experiments, filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST}` = '{host}'",
                                 max_results=1000)
    closed = 0
    for stale in running:
        tags = stale.data.tags
        if stale.info.run_id == current_run_id or PID not in tags or STARTED not in tags:
            continue
        if process_alive(int(tags[PID]), float(tags[STARTED])):
            continue
        reason = f"its process (pid {tags[PID]} on {host}) ended without recording the run's end; found by {current_run_id}"
        client.set_tag(stale.info.run_id, REASON, reason)
        client.set_terminated(stale.info.run_id, status="KILLED")
        log.warning("MLflow run %s was left RUNNING by a process that is gone: marked KILLED", stale.info.run_id)
        closed += 1
    return closed


def close_stale_in_store(client, found_by: str) -> None:
    """`close_stale_runs` over every experiment of ``client``'s store, as housekeeping: a store error is a
    warning (the next command tries again), never the command's failure."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        close_stale_runs(client, None, found_by)
    except (MlflowException, SQLAlchemyError, OSError) as exc:
        log.warning("could not look for runs left RUNNING by a lost process: %s", exc)
