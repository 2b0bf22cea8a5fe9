"""A sweep's files in its folder (``hydra.sweep.dir``), kept apart from any other sweep started there.

A sweep is named by its id (drawn when it starts), never by its folder alone: two sweeps may share a folder
(a fixed ``hydra.sweep.dir``), even started in the same second. The launching process puts the id in the
environment (`SWEEP_ENV`), which its jobs inherit (forked, spawned or submitted processes; Ray's workers
get it from `tamrun.sweeps.ray_launch`), and each sweep keeps its files in a folder of its own::

    <sweep dir>/tamrun_sweep.json                the last sweep started in the folder (people and tools)
    <sweep dir>/tamrun_sweep-<id>/sweep.json     this sweep's file: parent run, store, swept keys
    <sweep dir>/tamrun_sweep-<id>/jobs/<n>.json  job n started (its overrides, host and pid)
    <sweep dir>/tamrun_sweep-<id>/held/          what the store could not take (`tamrun.tracking.sweep_record.held`)
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Dict, List, Optional

from tamrun.redact import redacted

SWEEP_FILE = "tamrun_sweep.json"
SWEEP_ENV = "TAMRUN_SWEEP_ID"  # the launching command's sweep, inherited by its jobs


def sweep_home(sweep_dir: str, sweep_id: str) -> Path:
    """The folder of sweep ``sweep_id``'s own files in ``sweep_dir``."""
    return Path(sweep_dir) / f"tamrun_sweep-{sweep_id}"


def held_folder(home: Path) -> Path:
    """Where a sweep's jobs leave what the store could not take (`tamrun.tracking.sweep_record.held`)."""
    return home / "held"


def write_json(path: Path, data: Dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, redacted (`tamrun.redact`: a job's overrides may hold a password),
    written whole or not at all (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(redacted(json.dumps(data, indent=2)))
    os.replace(partial, path)


def read_json(path: Path) -> Dict[str, Any]:
    """The JSON object at ``path``, or {} when there is none (or it cannot be read)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_sweep_file(sweep_dir: str, info: Dict[str, Any]) -> None:
    """The sweep's file, in its own folder and as the folder's last sweep (`SWEEP_FILE`)."""
    write_json(sweep_home(sweep_dir, info["sweep_id"]) / "sweep.json", info)
    write_json(Path(sweep_dir) / SWEEP_FILE, info)


def read_sweep_file(sweep_dir: str) -> Dict[str, Any]:
    """The file of this process's sweep (`SWEEP_ENV`) in ``sweep_dir``, else the folder's last sweep's, else
    {} (no sweep callback ran)."""
    sweep_id = os.environ.get(SWEEP_ENV, "")
    own = read_json(sweep_home(sweep_dir, sweep_id) / "sweep.json") if sweep_id else {}
    return own or read_json(Path(sweep_dir) / SWEEP_FILE)


def mark_started(sweep_dir: str, job: int, overrides: List[str]) -> None:
    """Note that job ``job`` of this process's sweep started (the parent's summary then lists it whatever
    becomes of it); nothing without a sweep file."""
    info = read_sweep_file(sweep_dir)
    if info.get("sweep_id"):
        write_json(sweep_home(sweep_dir, info["sweep_id"]) / "jobs" / f"{job}.json",
                   {"job": job, "overrides": overrides, "host": socket.gethostname(), "pid": os.getpid()})


def started_jobs(home: Optional[Path]) -> Dict[int, List[str]]:
    """The jobs of the sweep whose folder is ``home`` that started: job number -> its overrides."""
    jobs = {}
    for path in sorted((home / "jobs").glob("*.json")) if home is not None else []:
        data = read_json(path)
        if "job" in data:
            jobs[int(data["job"])] = list(data.get("overrides", []))
    return jobs
