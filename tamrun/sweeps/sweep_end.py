"""A sweep's end in the launching process: every job accounted for, or held until the store answers.

`end_sweep` writes the jobs its held folder holds (the store was away when they ended: `tamrun.tracking.sweep_record.held`)
and closes the parent with the summary of every job that started (`tamrun.tracking.sweep_record.sweep_summary`). When
the store does not answer, it holds the sweep's end beside the jobs' records and lists the folder in this
machine's spool (`tamrun.tracking.sweep_record.held_spool`): the next run on that store writes them all. The sweep's
last line then names the folder (`held_line`), and the command exits non-zero.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import pandas as pd

from tamrun.errors import TamrunError
from tamrun.tracking.sweep_record.held import hold_sweep_end, held_runs
from tamrun.tracking.sweep_record.held_spool import list_waiting, upload_claimed
from tamrun.redact import redacted
from tamrun.sweeps.sweep_failures import JobFailure, job_failure
from tamrun.tracking.sweep_record.sweep_files import held_folder, started_jobs, sweep_home
from tamrun.tracking.sweep_record.sweep_summary import close_sweep

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldEnd:
    """A sweep's end the store did not take: why, where it is held, and the jobs held with it."""

    reason: str
    folder: Path
    failures: List[JobFailure]
    started: int


def store_errors() -> tuple:
    """The errors of a store that does not answer or refuses (MLflow's, SQLAlchemy's, the system's, tamrun's)."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    return TamrunError, MlflowException, SQLAlchemyError, OSError


def end_sweep(info: Dict[str, Any], spool: Path, aborted: bool = False) -> "pd.DataFrame | HeldEnd":
    """The sweep's summary table once its held jobs are written and its parent closed; a `HeldEnd` when
    the store did not answer (the end held, its folder listed in ``spool``)."""
    from tamrun.tracking.store.store import check_answers, open_client

    home = sweep_home(info["sweep_dir"], info["sweep_id"])
    folder = held_folder(home)
    try:
        check_answers(info["tracking_uri"], info.get("connect_timeout_s", 5.0))
        client = open_client(info["tracking_uri"], info["busy_timeout_s"], info["lock_timeout_s"])
        upload_claimed(client, folder)
        return close_sweep(info, aborted, client, started_jobs(home))
    except store_errors() as exc:
        reason = redacted(str(getattr(exc, "message", None) or exc).strip().splitlines()[0][:300])
        hold_sweep_end(folder, info, aborted)
        entry = list_waiting(spool, folder, info["tracking_uri"])
        log.warning("sweep %s: the store did not answer at the sweep's end (%s): held in %s (listed in %s)",
                    info["sweep_id"], reason, folder, entry)
        failures = [job_failure(record.job, record.created_status, record.tags.get("error_kind", ""),
                                record.tags.get("error_type", "")) for _, record in held_runs(folder)]
        return HeldEnd(reason, folder, sorted(failures, key=lambda f: f.job), len(started_jobs(home)))


def held_line(end: HeldEnd, store: str, parent_run_id: Optional[str]) -> str:
    """The last line of a sweep whose end is held: ``tamrun: the store <uri> did not answer at the sweep's
    end (<why>): 2 of 4 sweep job(s) held too (job 1: ...; job 2: ...); they and the summary of parent run
    <id> are held in <folder>, and the next run on that store writes them``."""
    jobs = ""
    if end.failures:
        reasons = "; ".join(f"job {failure.job}: {failure.reason}" for failure in end.failures)
        jobs = f"{len(end.failures)} of {end.started} sweep job(s) held too ({reasons}); they and "
    return (f"tamrun: the store {redacted(store)} did not answer at the sweep's end ({end.reason}): {jobs}the summary of "
            f"parent run {parent_run_id} {'are' if jobs else 'is'} held in {end.folder}, and the next run on that "
            "store writes them\n")
