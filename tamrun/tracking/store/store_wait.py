"""Waiting on a store out loud.

A call on the store (opening it, creating the run, logging, ending it) that has not returned within 2 s
(`FIRST_NOTICE_S`, then the next look of the watch) while another process holds the store's lock says
so, and again every `NOTICE_EVERY_S`: which process holds it and how long tamrun waits
(``tracking.busy_timeout_s`` for sqlite's own lock, ``tracking.lock_timeout_s`` for ``<db>.lock``).
Before, a run waited in silence (58 s once, for a lock held that long).

`StoreWatch` watches from one thread of its own: the calls only mark their start and end. The holders
of a sqlite file's locks are read from ``/proc/locks`` (Linux), which opens no file: a process that
opened and closed its store's file beside sqlite would drop sqlite's own POSIX locks. Where
``/proc/locks`` cannot be read, a call that lasts is taken for a wait on a lock "another process may
hold"; on other stores, a call still running (`SERVER_CALL_RUNNING`: a server's call may be many requests).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from tamrun.redact import redacted

log = logging.getLogger(__name__)

FIRST_NOTICE_S = 1.5  # a call waiting this long says so (within 2 s: the watch looks every POLL_S) ...
NOTICE_EVERY_S = 10.0  # ... and again this often
POLL_S = 0.5  # how often the watch looks at a call that lasts (and at the locks)
IDLE_S = 30.0  # the watch's thread ends after this long without a call (the next call starts it again)
# The first of the bytes a sqlite database file is locked on (its unix VFS: PENDING, then RESERVED and the
# 510 shared ones).
SQLITE_PENDING_BYTE = 0x40000000
PROC_LOCKS = Path("/proc/locks")
# What a call on a server store that lasts says: the watch sees the call, not its requests (an upload makes
# one per file, each answered in turn).
SERVER_CALL_RUNNING = "the call has not returned yet (it may make several requests, e.g. one per file uploaded)"


def lock_holders(path: Path) -> Optional[List[Tuple[int, str]]]:
    """(pid, access) of the other processes' locks on ``path`` (sqlite's lock bytes of a database, or the
    whole of a lock file), writers first; None when ``/proc/locks`` cannot be read."""
    try:
        stat = path.stat()
        lines = PROC_LOCKS.read_text().splitlines()
    except OSError:
        return None if not PROC_LOCKS.exists() else []
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    found = []
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a waiter, listed under the lock it waits for
            continue
        if len(parts) < 8 or parts[5] != inode or parts[4] == str(os.getpid()):
            continue
        end = (1 << 63) if parts[7] == "EOF" else int(parts[7])
        if end >= SQLITE_PENDING_BYTE or parts[1] == "FLOCK" or path.suffix == ".lock":
            found.append((int(parts[4]), parts[3]))
    return sorted(set(found), key=lambda holder: (holder[1] != "WRITE", holder[0]))


def process_name(pid: int) -> str:
    """``<pid> (<command>)``, or the pid alone where the command cannot be read."""
    try:
        return f"{pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})"
    except OSError:
        return str(pid)


def holders_text(holders: List[Tuple[int, str]]) -> str:
    """``process 4242 (python)``, or ``processes ...`` (up to three), for `lock_holders`' list."""
    return f"process{'es' if len(holders) > 1 else ''} " + ", ".join(process_name(pid) for pid, _ in holders[:3])


class StoreWatch:
    """Says when a call on the store at ``uri`` waits on another process (module doc); ``limits`` are
    (busy_timeout_s, lock_timeout_s)."""

    def __init__(self, uri: str, db: Optional[Path], limits: Tuple[float, float]) -> None:
        self.uri, self.db, self.limits = uri, db, limits
        self._cond = threading.Condition()
        self._since: Optional[float] = None
        self._what = ""
        self._depth = 0
        self._serial = 0
        self._thread: Optional[threading.Thread] = None

    @contextlib.contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Watch the call ``what`` (the outermost one, when calls nest)."""
        with self._cond:
            self._depth += 1
            if self._depth == 1:
                self._since, self._what, self._serial = time.monotonic(), what, self._serial + 1
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="tamrun-store-watch", daemon=True)
                    self._thread.start()
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._since = None

    def holder(self) -> Optional[str]:
        """Who holds the store, and how long tamrun waits for it; None when nobody else does."""
        if self.db is None:
            return SERVER_CALL_RUNNING  # not "not answered": a call may make many requests, each answered
        busy_s, lock_s = self.limits
        for path, limit in ((self.db, f"tracking.busy_timeout_s={busy_s:g}"),
                            (Path(f"{self.db}.lock"), f"tracking.lock_timeout_s={lock_s:g}")):
            holders = lock_holders(path)
            if holders is None:
                return f"another process may hold its lock; tamrun gives up after {limit} s"
            if holders:
                return f"{holders_text(holders)} {'holds' if len(holders) == 1 else 'hold'} {path.name}'s lock; " \
                       f"tamrun gives up after {limit} s"
        return None

    def _watch(self) -> None:
        serial, notices = 0, 0
        while True:
            with self._cond:
                if self._since is None and not self._cond.wait_for(lambda: self._since is not None, IDLE_S):
                    self._thread = None  # under the lock: the next call starts a new thread
                    return
                if self._serial != serial:
                    serial, notices = self._serial, 0
                since, what = self._since, self._what
            waited = time.monotonic() - since
            if waited >= FIRST_NOTICE_S + notices * NOTICE_EVERY_S:
                holder = self.holder()  # outside the lock: the call's end never waits for /proc or the log
                if holder is not None:
                    log.info("waiting on the store %s for %.0f s (%s): %s", redacted(self.uri), waited, what, holder)
                    notices = int((waited - FIRST_NOTICE_S) // NOTICE_EVERY_S) + 1
            with self._cond:
                self._cond.wait(POLL_S)
