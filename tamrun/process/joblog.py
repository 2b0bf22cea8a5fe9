"""An internal error's traceback in the job's log file, not on the console.

Hydra's job logging writes every record of a job to ``<hydra.runtime.output_dir>/<hydra.job.name>.log``
(``outputs/<date>/<time>-<pid>-<hex>/tamrun.log`` for a run, ``<sweep dir>/<job>/tamrun.log`` for a sweep's job, in
whichever process or node ran it). `log_internal_error` hands the error's record, traceback included, to
the file handlers of the root logger only: the console keeps the one line that names the error and this
file (`tamrun.errors.internal_error_line`). With no file handler (``hydra/job_logging=disabled``, a
configuration of one's own) the traceback is appended to the default path itself.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List

from tamrun.redact import redacted, redacted_traceback

log = logging.getLogger(__name__)


def file_handlers() -> List[logging.FileHandler]:
    """The root logger's handlers that write to a file (Hydra's job log among them)."""
    return [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]


def log_internal_error(error: BaseException, default_path: Path) -> Path:
    """Write ``error`` with its traceback to the job's log file; returns that file's path (the first file
    handler's, else ``default_path``, created if need be)."""
    exc_info = (type(error), error, error.__traceback__)
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "internal error (a bug of tamrun's): %s",
                            (type(error).__name__,), exc_info)
    handlers = file_handlers()
    for handler in handlers:
        if record.levelno >= handler.level:
            handler.handle(record)
    if handlers:
        return Path(handlers[0].baseFilename)
    default_path.parent.mkdir(parents=True, exist_ok=True)
    with default_path.open("a", encoding="utf-8") as file:
        file.write(f"internal error (a bug of tamrun's): {type(error).__name__}\n")
        file.write(redacted_traceback(error))
    return default_path


# The launchers whose jobs run at the same time (their lines interleave on one console).
PARALLEL_LAUNCHERS = ("JoblibLauncher", "RayLauncher", "RayClusterLauncher", "SlurmLauncher", "LocalLauncher")


def runs_jobs_at_once(launcher_target: str) -> bool:
    """Whether the launcher of ``_target_`` ``launcher_target`` runs a sweep's jobs at the same time."""
    name = launcher_target.rsplit(".", 1)[-1]
    return name in PARALLEL_LAUNCHERS or name.startswith("Ray")


def job_label(job_num: int, run_name: str) -> str:
    """How a parallel sweep's job names itself at the start of each console line: ``[#3 fourier]`` (its
    number and its run's name, i.e. its swept values; redacted: a label is added after the handlers' filter)."""
    return redacted(f"[#{job_num} {run_name}]")


class LabelledFormatter(logging.Formatter):
    """A handler's own format, every line of it after ``label``."""

    def __init__(self, label: str, inner: logging.Formatter) -> None:
        super().__init__()
        self.label, self.inner = label, inner

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(f"{self.label} {line}" for line in self.inner.format(record).split("\n"))


def label_console_lines(label: str) -> None:
    """Start every line the root logger's console handlers write with ``label`` (a parallel sweep's job:
    `job_label`); the job's log file, its own already, is left as it is. Idempotent."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            inner = handler.formatter or logging.Formatter()
            if isinstance(inner, LabelledFormatter):
                inner = inner.inner
            handler.setFormatter(LabelledFormatter(label, inner))
