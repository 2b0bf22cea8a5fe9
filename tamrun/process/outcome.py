"""What ended a command, named for what it is: the entry point's one classification of an error.

    a TamrunError (bad input)                                    its line                          exit 2
    a refused write (a read-only folder, a full disk, ...)      a FilesystemError's line          exit 2
    one of Hydra's own errors, before any job started            Hydra's message, then tamrun's     exit 2
                                                                 hint (or the missing plugin)
    anything else: a bug of tamrun's (or of a library under it)  the internal-error line           exit 1

A job's error is named in the job (`named`, from `tamrun.__main__.job_failed`, with the job's folder as
the place of its refused writes); any other reaches the entry point (`outside_job`): Hydra's own (it
refused the command line, or could not create its folders) and the errors of the code around the jobs.
Hydra would print such an error with a traceback and exit 1 (its ``run_and_report``): the entry point
runs it with ``HYDRA_FULL_ERROR`` set (`errors_raised`), so that it raises them instead. "Hydra refused
the command line" is said only of Hydra's own errors (`hydra.errors.HydraException`) before any job
started: Hydra could not parse an override, find an option or fit a value to the schema.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

from tamrun.errors import Abort, TamrunError, internal_error_line
from tamrun.process.filesystem import Place, filesystem_error
from tamrun.redact import redacted, redacted_traceback

REFUSED_HINT = ("tamrun: config error: Hydra refused the command line (message above). Fix: check the field's "
                "spelling and type in docs/configuration.md (`python -m tamrun --cfg job` prints every field), "
                "or pick an option listed by `python -m tamrun --help`\n")
FULL_ERROR = "HYDRA_FULL_ERROR"  # set, Hydra raises a command's error rather than print it and exit 1


def folder_place(multirun: bool, folder: Optional[Path]) -> Place:
    """Hydra's folder of a run (hydra.run.dir) or a sweep (hydra.sweep.dir): the job's log and config."""
    setting = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    return Place(setting, folder, f"the {'sweep' if multirun else 'run'}'s Hydra folder",
                 f"run from a writable folder, or set {setting} to one (the default MLflow store, outputs/mlflow.db, "
                 "is in the working folder too: tracking.uri)")


def job_places(hydra_cfg: Any) -> List[Place]:
    """The places a job writes besides its run's (`tamrun.tracking.mlflow_run.TrackedRun.places`): its
    Hydra folder."""
    from hydra.types import RunMode

    return [folder_place(hydra_cfg.mode == RunMode.MULTIRUN, Path(hydra_cfg.runtime.output_dir))]


def named(error: BaseException, places: List[Place]) -> BaseException:
    """``error`` as it is reported: a `TamrunError` as it is, a refused write as a `FilesystemError` of
    its place (`tamrun.process.filesystem`), anything else (a bug) as it is."""
    if isinstance(error, TamrunError):
        return error
    return filesystem_error(error, places) or error


def hydra_message(error: BaseException) -> str:
    """One of Hydra's errors as Hydra prints it: its message, and OmegaConf's error beneath it if any."""
    from omegaconf.errors import OmegaConfBaseException

    cause = error.__cause__
    return f"{error}\n" + (f"{cause}\n" if isinstance(cause, OmegaConfBaseException) else "")


def refused(error: BaseException, started: bool) -> Optional[str]:
    """What stderr gets when Hydra refused the command line before any job started (an override it cannot
    parse, an option it cannot find, a value the schema refuses, a missing plugin): Hydra's message, then
    the plugin's line or `REFUSED_HINT`; None for any other error."""
    from hydra.errors import HydraException

    from tamrun.config.plugins import missing_plugin

    if started:
        return None
    plugin = missing_plugin(error)
    if plugin is None and not isinstance(error, HydraException):
        return None
    message = hydra_message(error) if isinstance(error, HydraException) else ""
    return message + (plugin.report_line() if plugin is not None else REFUSED_HINT)


def outside_job(error: BaseException, started: bool, multirun: bool, verbose: bool) -> Tuple[str, int]:
    """(what stderr gets, the exit code) for an error that reached the entry point outside a job; its
    traceback is printed first for a bug, or when ``verbose``."""
    if isinstance(error, Abort):
        error = error.error
    lines = refused(error, started)
    if lines is not None:
        return redacted(lines), 2
    reported = named(error, [folder_place(multirun, None)])
    internal = not isinstance(reported, TamrunError)
    if internal or verbose:
        sys.stderr.write(redacted_traceback(error))
    return (internal_error_line(error, None), 1) if internal else (reported.report_line(), 2)


@contextlib.contextmanager
def errors_raised() -> Iterator[bool]:
    """Run Hydra with `FULL_ERROR` set (unless the user set it: then it stays, and the value yielded says
    so: tracebacks are shown), so that a command's error reaches the entry point."""
    own = FULL_ERROR in os.environ
    os.environ.setdefault(FULL_ERROR, "1")
    try:
        yield own
    finally:
        if not own:
            os.environ.pop(FULL_ERROR, None)


def multirun_asked(argv: List[str]) -> bool:
    """Whether the command line asks for a multirun (``-m``, ``--multirun``, ``hydra.mode=MULTIRUN``)."""
    return any(arg in ("-m", "--multirun") or arg.replace(" ", "") == "hydra.mode=MULTIRUN" for arg in argv)


def verbose_asked(argv: List[str], own_full_error: bool) -> bool:
    """Whether the command asks for tracebacks: hydra.verbose=true, TAMRUN_DEBUG=1 or the user's own
    HYDRA_FULL_ERROR."""
    return own_full_error or bool(os.environ.get("TAMRUN_DEBUG")) or "hydra.verbose=true" in argv
