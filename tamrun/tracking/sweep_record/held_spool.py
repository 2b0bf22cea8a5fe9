"""Held folders waiting for their store, and their upload by the next run on that store.

When the store does not answer at a sweep's end, the launching process holds the sweep's end in its held
folder (`tamrun.tracking.sweep_record.held`) and lists that folder in this machine's spool, ``tracking.held_dir`` (a
file per sweep: the store's URI, masked, and the folder). Every run that opens a store first uploads the
folders listed for it (`upload_waiting`), so the next run on that store, a single run or a sweep's, writes
the held jobs and closes the sweep's parent with its summary.

A folder is uploaded once: it is claimed by renaming it (``held.uploading-<host>-<pid>``), records are
removed one by one as they are written, and a claim left by a process of this host that is gone is taken
over; a failed upload gives the folder back.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Optional

import psutil

from tamrun.tracking.sweep_record.held import upload_folder
from tamrun.redact import redacted
from tamrun.tracking.sweep_record.sweep_files import read_json, write_json

log = logging.getLogger(__name__)

CLAIM = ".uploading-"


def spool_dir(held_dir: Optional[str]) -> Path:
    """``tracking.held_dir``, else ``$XDG_STATE_HOME/tamrun/held`` (default ``~/.local/state/tamrun/held``)."""
    if held_dir:
        return Path(held_dir).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "tamrun" / "held"


def claim(folder: Path) -> Optional[Path]:
    """Take ``folder`` for this process (renamed); None when it is not there or another live process has it."""
    mine = folder.with_name(f"{folder.name}{CLAIM}{socket.gethostname()}-{os.getpid()}")
    candidates = [folder, *folder.parent.glob(f"{folder.name}{CLAIM}*")] if folder.parent.is_dir() else []
    for candidate in candidates:
        if candidate != folder and not abandoned(candidate.name.rsplit(CLAIM, 1)[1]):
            continue
        try:
            os.rename(candidate, mine)
            return mine
        except OSError:  # gone meanwhile, or taken by another process first
            continue
    return None


def abandoned(owner: str) -> bool:
    """Whether a claim's owner (``<host>-<pid>``) is a process of this host that is gone."""
    host, _, pid = owner.rpartition("-")
    return host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid))


def give_back(claimed: Path, folder: Path) -> None:
    """Return a claimed folder to its name (its records kept), after a failed upload."""
    try:
        os.rename(claimed, folder)
    except OSError:  # a new folder of that name: move the records into it
        folder.mkdir(parents=True, exist_ok=True)
        for path in claimed.iterdir():
            os.replace(path, folder / path.name)
        claimed.rmdir()


def upload_claimed(client: Any, folder: Path) -> int:
    """Claim ``folder``, upload it (`upload_folder`) and remove it; the number of job records written (0
    when there was nothing to claim). A failure gives the folder back and is raised."""
    claimed = claim(folder)
    if claimed is None:
        return 0
    try:
        written = upload_folder(client, claimed)
    except BaseException:
        give_back(claimed, folder)
        raise
    shutil.rmtree(claimed, ignore_errors=True)
    log.info("wrote what %s held (%d job run(s))", folder, written)
    return written


def list_waiting(spool: Path, folder: Path, uri: str) -> Path:
    """List ``folder`` in the spool as waiting for the store at ``uri``; returns the spool's file."""
    entry = spool / f"{hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]}.json"
    write_json(entry, {"store": redacted(uri), "folder": str(folder.resolve())})
    return entry


def upload_waiting(client: Any, uri: str, spool: Path) -> int:
    """Upload every folder the spool lists for the store at ``uri``; returns how many job records were
    written. A folder that is gone (written by another run, or removed) leaves the spool."""
    written = 0
    for entry in sorted(spool.glob("*.json")) if spool.is_dir() else []:
        listed = read_json(entry)
        folder = Path(listed.get("folder", ""))
        if listed.get("store") == redacted(uri):
            written += upload_claimed(client, folder)
        if not folder.exists() and not list(folder.parent.glob(f"{folder.name}{CLAIM}*")):
            entry.unlink(missing_ok=True)  # nothing left to write (or its folder removed): off the list
    return written
