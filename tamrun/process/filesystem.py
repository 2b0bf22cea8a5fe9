"""A folder or file the command cannot create or write, named for what it is (`FilesystemError`).

`refusal` finds, in an exception or in what caused it, the operating system's refusal of a write (an
`OSError` whose errno is one of `REFUSED`: a read-only folder or file system, a full disk, a path the
system refuses) or sqlite's (`SQLITE_REFUSALS`: the store's file), with the path it names: the error's
own, else the file the failing code was writing (an open file of the innermost frame that holds one).
`filesystem_error` turns it into a `FilesystemError` naming that path and the setting whose folder holds
it (a `Place`: hydra.run.dir, tracking.uri, tracking.artifact_root, the temporary folder), with the fix;
a path the system finds absent counts only in such a place (elsewhere it was read, not written: a bug).
The entry point names an error this way wherever it came from (Hydra's folders, a run's store or
artifacts); a run's `TrackedRun` does it first, so that its FAILED record says so too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Iterator, Optional, Sequence

from tamrun.errors import FilesystemError, os_reason
from tamrun.config.units import format_size

# The errno values of a refused write, and what each says of the path.
DENIED, FILLED, ABSENT = "cannot be created or written", "cannot be written", "cannot be created"
REFUSED = {errno.EACCES: DENIED, errno.EPERM: DENIED, errno.EROFS: DENIED, errno.EIO: DENIED,
           errno.ENOSPC: FILLED, errno.EDQUOT: FILLED, errno.EFBIG: FILLED,
           errno.ENOENT: ABSENT, errno.ENOTDIR: ABSENT, errno.EISDIR: ABSENT, errno.EEXIST: ABSENT,
           errno.ENAMETOOLONG: ABSENT, errno.ELOOP: ABSENT}
FULL = (errno.ENOSPC, errno.EDQUOT)
# sqlite's messages for a database file it cannot write, and the errno each amounts to.
SQLITE_REFUSALS = {"database or disk is full": errno.ENOSPC, "attempt to write a readonly database": errno.EACCES,
                   "unable to open database file": errno.EACCES, "disk I/O error": errno.EIO}


@dataclass(frozen=True)
class Refusal:
    """A write the system refused: its errno, the reason as the system gave it, the path (None: unknown),
    and whether sqlite refused it (then the store's file is the path)."""

    errno: int
    reason: str
    path: Optional[Path]
    sqlite: bool = False


@dataclass(frozen=True)
class Place:
    """A folder the command writes: the setting that chose it, what it holds (for the message), and the
    fix; ``folder`` None holds any path (the place of last resort); ``file``: the one file it is about
    (a sqlite store's database)."""

    setting: str
    folder: Optional[Path]
    holds: str
    fix: str
    file: Optional[Path] = None


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what caused it (``__cause__``, else ``__context__``), each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def written_file(traceback: Optional[TracebackType]) -> Optional[Path]:
    """The file that a file object opened for writing (open or closed since) names, in the innermost
    frame that holds one: the file a write failed on when its error names none (``shutil.copyfileobj``'s
    destination); else None."""
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            name, mode = getattr(value, "name", None), getattr(value, "mode", None)
            if isinstance(name, str) and isinstance(mode, str) and any(letter in mode for letter in "wax+"):
                return Path(name)
    return None


@contextlib.contextmanager
def writing(path: Optional[Path]) -> Iterator[None]:
    """A block that writes ``path``: an `OSError` raised in it that names no file, and whose frames hold
    no file opened for writing (a file opened from a descriptor), is given ``path`` as its ``filename``,
    so that `refusal` names it."""
    try:
        yield
    except OSError as exc:
        if path is not None and exc.filename is None and written_file(exc.__traceback__) is None:
            exc.filename = str(path)
        raise


def refusal(error: BaseException) -> Optional[Refusal]:
    """The refused write behind ``error`` (itself or a cause), or None when there is none."""
    for link in chain(error):
        if isinstance(link, OSError) and link.errno in REFUSED:
            named = link.filename or link.filename2
            path = Path(os.fsdecode(named)) if isinstance(named, (str, bytes, os.PathLike)) else None
            return Refusal(link.errno, os_reason(link), path or written_file(link.__traceback__))
        text = str(link)
        for message, number in SQLITE_REFUSALS.items():
            if message in text:
                return Refusal(number, f"sqlite: {message}", None, sqlite=True)
    return None


def place_of(found: Refusal, places: Sequence[Place]) -> Optional[Place]:
    """The place of a refused write: the store's for sqlite's refusals, else the place whose folder holds
    its path (the deepest such), else the first without a folder."""
    path = found.path
    if found.sqlite:
        return next((p for p in places if p.file is not None), None)
    if path is not None:
        holding = [p for p in places if p.folder is not None and is_under(path, p.folder)]
        if holding:
            return max(holding, key=lambda p: len(p.folder.parts))
    return next((p for p in places if p.folder is None), None)


def is_under(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both made absolute, not resolved)."""
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))


def free_space(path: Path) -> str:
    """``, a disk of 256.00 KiB with 28.00 KiB free after the failed write`` for the disk that holds
    ``path`` (its nearest existing folder), or "" where that cannot be read."""
    folder = Path(os.path.abspath(path))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    return f", a disk of {format_size(usage.total)} with {format_size(usage.free)} free after the failed write"


def filesystem_error(error: BaseException, places: Sequence[Place], note: str = "") -> Optional[FilesystemError]:
    """``error`` as a `FilesystemError` naming the refused path, the setting of its place and the fix
    (and ``note``, after them); None when no refused write lies behind it."""
    found = refusal(error)
    if found is None:
        return None
    place = place_of(found, places)
    if place is None and REFUSED[found.errno] == ABSENT:  # a missing file elsewhere: read, not written (a bug)
        return None
    path = found.path or (place.file or place.folder if place is not None else None)
    shown = Path(os.path.abspath(path)) if path is not None else "a file tamrun was writing"
    reason = found.reason + (free_space(path) if found.errno in FULL and path is not None else "")
    holds = f"; {place.holds}, {place.setting}" if place is not None and place.setting else ""
    fix = place.fix if place is not None else "make that folder writable"
    if found.errno in FULL:
        fix = f"free space on that disk, or {fix}"
    error_found = FilesystemError(place.setting if place is not None else "", shown,
                                  f"{REFUSED[found.errno]} ({reason}{holds}){note}", fix)
    error_found.run_id = getattr(error, "run_id", None)
    return error_found


def temporary_place() -> Place:
    """The temporary folder (``TMPDIR``) where MLflow and tamrun stage files before they are logged."""
    return Place("TMPDIR", Path(tempfile.gettempdir()), "the temporary folder",
                 "set TMPDIR to a writable folder with room")
