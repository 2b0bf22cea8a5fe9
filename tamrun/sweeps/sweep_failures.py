"""Why a sweep's jobs did not finish, the sweep's last line, and its exit code.

A job's reason comes from its run (the summary table's ``status``, ``error_kind`` and ``error_type``), or,
for a sweep without tracking, from the jobs that ran in the launching process: ``internal error
RuntimeError`` (a bug: exit code 1), ``config error ConfigError`` (bad input: exit code 2), or the run's
status when no error ended it (``KILLED``: a signal, a lost worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence

from tamrun.errors import INTERNAL, INTERRUPTED, LOST

# Error kinds that name an exception the job raised (a TamrunError's kinds, INTERNAL); other runs that did
# not finish are named by their status.
NAMED_BY_STATUS = ("", INTERRUPTED, LOST)

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class JobFailure:
    """One job that did not finish: its number, the reason shown, whether a bug of tamrun's ended it."""

    job: int
    reason: str
    internal: bool = False


def job_failure(job: int, status: str, kind: str, error_type: str) -> JobFailure:
    """The failure of job ``job``, from its run's status and its ``error_kind`` and ``error_type`` tags."""
    if kind in NAMED_BY_STATUS:
        detail = ", ".join(part for part in (kind, error_type) if part)
        return JobFailure(job, f"{status} ({detail})" if detail else status)
    return JobFailure(job, f"{kind} error {error_type}", internal=kind == INTERNAL)


def table_failures(table: "pd.DataFrame") -> List[JobFailure]:
    """The jobs of a sweep's summary table (`tamrun.tracking.sweep_record.sweep_summary.summary_table`) that did not finish."""
    failed = table[table["status"] != "FINISHED"]
    return [job_failure(int(row.job), str(row.status), str(row.error_kind or ""), str(row.error_type or ""))
            for row in failed.itertuples()]


def failure_line(failures: Sequence[JobFailure], total: int, parent_run_id: Optional[str] = None) -> str:
    """The sweep's last line: ``tamrun: 2 of 3 sweep job(s) did not finish (job 0: internal error
    RuntimeError; job 2: config error ConfigError); summary in run <id>``."""
    reasons = "; ".join(f"job {failure.job}: {failure.reason}" for failure in failures)
    where = f"; summary in run {parent_run_id}" if parent_run_id else ""
    return f"tamrun: {len(failures)} of {total} sweep job(s) did not finish ({reasons}){where}\n"


def failure_exit_code(failures: Sequence[JobFailure]) -> int:
    """1 when a bug of tamrun's ended a job (an internal error), else 2 (bad input, a lost or killed job)."""
    return 1 if any(failure.internal for failure in failures) else 2
