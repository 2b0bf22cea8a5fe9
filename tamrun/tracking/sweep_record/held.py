"""What a sweep's job could not write to its store, held in a local file until the store takes it.

A job that cannot reach its store (the tracking server down as the job starts, gone during its run, or
gone when the launcher records the job's lost Ray task) holds what it would have written as a `HeldRun`,
a JSON file in its sweep's ``held`` folder (`tamrun.tracking.sweep_record.sweep_files`): the job's run to create, or its
run left RUNNING to end, with its status, error and sweep tags. `upload_folder` writes a folder's records
to a store (`apply`: the job's open run ended, else a run created for it; a job that recorded its own end
meanwhile is left as it is), then, when the folder holds the sweep's own end (``sweep.json``: the store
did not answer at the sweep's end either), closes the sweep's parent with its summary. Every run written
from a record has the tag ``tamrun.held`` (why it was held, and when).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tamrun.errors import error_kind
from tamrun.redact import redacted
from tamrun.tracking.sweep_record.sweep_files import (held_folder, read_json, read_sweep_file, started_jobs, sweep_home,
                                         write_json)
from tamrun.tracking.sweep_record.sweep_summary import SWEEP_ID_TAG, SWEEP_JOB_TAG, close_sweep

log = logging.getLogger(__name__)

HELD_TAG = "tamrun.held"  # on a run written from a held record: why it was held, and when
SWEEP_END = "sweep.json"  # in a held folder: the sweep's parent, to close once its jobs are written


@dataclass
class HeldRun:
    """A job's run as it would have been written: ``status`` ends the job's RUNNING run (``run_id``, or any
    of the job's runs), ``created_status`` a run created when the job has none."""

    job: int
    sweep_id: str
    experiment_id: str
    run_name: str
    tags: Dict[str, str]
    reason: str
    status: str = "FAILED"
    created_status: str = "FAILED"
    run_id: Optional[str] = None
    time_ms: int = field(default_factory=lambda: int(time.time() * 1000))


def error_tags(error: BaseException, kind: Optional[str] = None) -> Dict[str, str]:
    """The tags a run ended by ``error`` has (``error_type``, ``error``, ``error_kind``)."""
    return {"error_type": type(error).__name__, "error": redacted(str(error))[:5000],
            "error_kind": kind or error_kind(error)}


def hold_job(sweep_dir: str, job: int, run_name: str, tags: Dict[str, str], reason: BaseException,
             **fields: Any) -> Optional[Path]:
    """Hold job ``job``'s run (`HeldRun` ``fields``: status, run_id...) in its sweep's held folder; the path
    of the record, or None without a sweep to hold it for (no sweep file, or tracking off)."""
    info = read_sweep_file(sweep_dir)
    if not info.get("sweep_id") or not info.get("experiment_id"):
        log.warning("job %d could not be recorded, and there is no sweep to hold it for (%s)", job, reason)
        return None
    text = redacted(str(reason)).strip().splitlines()
    why = f"{text[0][:300] if text else type(reason).__name__} ({time.strftime('%Y-%m-%d %H:%M:%S %z')})"
    record = HeldRun(job, info["sweep_id"], info["experiment_id"], run_name, {k: redacted(str(v)) for k, v in tags.items()},
                     why, **fields)
    path = held_folder(sweep_home(sweep_dir, info["sweep_id"])) / f"job-{job}-{os.getpid()}-{record.time_ms}.json"
    write_json(path, dataclasses.asdict(record))
    log.warning("job %d: the store could not record it (%s): held in %s, written when the store answers", job,
                why, path)
    return path


def held_runs(folder: Path) -> List[Tuple[Path, HeldRun]]:
    """The records of a held folder, oldest first."""
    records = [(path, HeldRun(**read_json(path))) for path in folder.glob("job-*.json")]
    return sorted(records, key=lambda item: item[1].time_ms)


def apply(client: Any, record: HeldRun) -> str:
    """Write ``record`` to the store: end the job's open run, or create one; returns the run's id."""
    tags = {**record.tags, HELD_TAG: record.reason}
    if record.run_id:
        runs = [client.get_run(record.run_id)]
    else:
        query = f"tags.{SWEEP_ID_TAG} = '{record.sweep_id}' and tags.{SWEEP_JOB_TAG} = '{record.job}'"
        runs = client.search_runs([record.experiment_id], filter_string=query, max_results=100)
    for run in runs:
        if run.info.status == "RUNNING" or run.info.run_id == record.run_id:
            for key, value in tags.items():
                client.set_tag(run.info.run_id, key, value)
            client.set_terminated(run.info.run_id, status=record.status, end_time=record.time_ms)
    if runs:
        return runs[0].info.run_id
    created = client.create_run(record.experiment_id, start_time=record.time_ms, tags=tags,
                                run_name=record.run_name)
    client.set_terminated(created.info.run_id, status=record.created_status, end_time=record.time_ms)
    return created.info.run_id


def upload_folder(client: Any, folder: Path) -> int:
    """Write every record of ``folder`` (a sweep's held folder, claimed: `tamrun.tracking.sweep_record.held_spool`), each
    removed once written, then close the sweep's parent when the folder holds its end; returns how many
    job records were written."""
    written = 0
    for path, record in held_runs(folder):
        run_id = apply(client, record)
        path.unlink()
        written += 1
        log.info("job %d of sweep %s: run %s written from %s", record.job, record.sweep_id, run_id, path)
    end = read_json(folder / SWEEP_END)
    if end:
        close_sweep(end["info"], end.get("aborted", False), client, started_jobs(folder.parent))
        (folder / SWEEP_END).unlink()
    return written


def hold_sweep_end(folder: Path, info: Dict[str, Any], aborted: bool) -> None:
    """Hold the sweep's end (its parent's summary and status) in its held folder."""
    write_json(folder / SWEEP_END, {"info": {**info, "tracking_uri": redacted(info.get("tracking_uri", ""))},
                                    "aborted": aborted})
