"""User-facing errors: each names the field (or column), the offending value and the fix.

Every subclass of `TamrunError` ends a command-line run with exit code 2 and one readable
message, without a traceback; anything else is an internal error (a bug of tamrun's, or of a library
under it): exit code 1, one line naming it (`internal_error_line`) and its traceback in the job's log.
A `FilesystemError` (a folder or file that cannot be created or written, a full disk) is bad input too:
the entry point names it (`tamrun.process.filesystem`), whatever raised it.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from tamrun.redact import redacted

INTERNAL = "internal"  # the kind (`error_kind`) of an exception that is not a TamrunError
INTERRUPTED = "interrupted"  # the kind of a KeyboardInterrupt (SIGINT, or SIGTERM/SIGHUP as Terminated)
LOST = "lost"  # a sweep job whose process was lost (its worker or node died: tamrun.sweeps.lost_jobs)

LONGEST_VALUE = 160  # characters of a value's repr a message shows (a 5000-character path is cut)


def shown(value: Any, text: Optional[str] = None) -> str:
    """``repr(value)`` (or ``text``), redacted (`tamrun.redact`), its middle cut when it is longer than
    `LONGEST_VALUE` (the length is said)."""
    text = redacted(repr(value) if text is None else text)
    if len(text) <= LONGEST_VALUE:
        return text
    return f"{text[:100]}...{text[-40:]} ({len(text)} characters)"


def os_reason(exc: OSError) -> str:
    """An OS error's reason without the path it names (the message names the path once, as the value):
    "[Errno 36] File name too long"."""
    return f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)


class TamrunError(Exception):
    """An error caused by the user's input (config, data, hardware or memory limit).

    Attributes:
        field: dotted config path or data column the error is about (e.g. ``model.effects.toy.m``).
        value: the offending value.
        fix: what to change.
    """

    kind = "error"
    run_id: Optional[str] = None  # the MLflow run the error ended (FAILED), set by the runner; None before one

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        self.field = field
        self.value = redacted(value) if isinstance(value, str) else value
        self.problem = redacted(problem)
        self.fix = redacted(fix)
        super().__init__(f"{field}={shown(value)}: {self.problem}. Fix: {self.fix}")

    def __reduce__(self) -> Tuple[Any, ...]:
        """Pickled with its four arguments and its attributes (``run_id``): a sweep job's error crosses
        processes (joblib, Ray, submitit), and Exception's own pickling would call ``cls(message)``."""
        return type(self), (self.field, self.value, self.problem, self.fix), dict(self.__dict__)

    def report_line(self) -> str:
        """The line a command-line run ends with: ``tamrun: <kind> error: <field>=<value>: ... Fix: ...``."""
        return f"tamrun: {self.kind} error: {self}\n"


class ConfigError(TamrunError):
    """A config value is out of range, of the wrong kind, or inconsistent with another."""

    kind = "config"


class DataError(TamrunError):
    """The data does not fit the config: a missing column, NaNs, an empty split or group."""

    kind = "data"


class DeviceError(TamrunError):
    """The requested hardware is absent or lacks a needed capability."""

    kind = "device"


class MemoryBudgetError(TamrunError):
    """Even the smallest chunk does not fit in the memory budget, or retries were spent."""

    kind = "memory"


class FilesystemError(TamrunError):
    """A folder or file the command writes that cannot be created or written: a read-only folder or file
    system, a full disk, a path the system refuses. ``field`` is the setting that chose the place
    (hydra.run.dir, tracking.uri, tracking.artifact_root, ...), ``value`` its path; the message starts with
    the path: ``tamrun: filesystem error: <path>: <problem>. Fix: <fix>``."""

    kind = "filesystem"

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        super().__init__(field, value, problem, fix)
        self.args = (f"{shown(value, str(value))}: {problem}. Fix: {fix}",)


class Abort(BaseException):
    """Carries ``error`` past code that would turn an exception into a warning (Hydra's callbacks) to the
    entry point, which reports it as it reports any other."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class NumericalError(TamrunError):
    """The fit or its evaluation produced numbers that are not finite (a near-singular system, a
    value beyond the dtype's range)."""

    kind = "numerical"


def note_run(error: BaseException, run_id: Optional[str]) -> None:
    """Note on ``error`` (as ``error.run_id``) the MLflow run it ended FAILED: a sweep job records a
    FAILED run of its own only for an error that ended none. An exception that takes no attribute is
    left as it is."""
    try:
        error.run_id = run_id  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass


def error_kind(error: BaseException) -> str:
    """What ended a run, as its ``error_kind`` tag and a sweep's summary say: a `TamrunError`'s kind
    (config, data, device, memory, numerical: bad input), `INTERRUPTED` for a signal, else `INTERNAL`."""
    if isinstance(error, TamrunError):
        return error.kind
    return INTERRUPTED if isinstance(error, KeyboardInterrupt) else INTERNAL


def internal_error_line(error: BaseException, log_path: Any) -> str:
    """The line an internal error is reported with: ``tamrun: internal error: <type>: <first line of its
    message> (a bug of tamrun's; traceback in <log_path>)`` (``traceback above`` without a log)."""
    lines = redacted(str(error)).strip().splitlines()
    named = f"{type(error).__name__}: {lines[0][:LONGEST_VALUE]}" if lines else type(error).__name__
    where = f"traceback in {log_path}" if log_path is not None else "traceback above"
    return f"tamrun: internal error: {named} (a bug of tamrun's; {where})\n"
