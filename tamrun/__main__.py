"""``python -m tamrun [overrides]``: a thin Hydra entry point around `tamrun.runner.run`.

Exit codes: 0 success; 2 bad input (config, data, device, memory limit, store, a folder or file that
cannot be created or written: one readable message, no traceback unless ``hydra.verbose=true`` or
TAMRUN_DEBUG=1); 130 / 143 interrupted by SIGINT / SIGTERM (the MLflow run is marked KILLED); 1 an
internal error (a bug: the line ``tamrun: internal error: <type>: <message> (a bug of tamrun's; traceback
in <the job's log>)``, the run FAILED). A multirun's jobs run whatever another did; it exits 1 when a job
ended on an internal error, else 2 when one did not finish, and its last line says which and why. Every
error is named once, by `tamrun.process.outcome`: in the job that raised it (`job_failed`), or here when it came
from Hydra or from around the jobs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from tamrun.process.collector import ImportPause
from tamrun.process.outcome import errors_raised, multirun_asked, outside_job, verbose_asked
from tamrun.process.run_folder import RUN_TAG, new_run_tag
from tamrun.machine.threads import CpuClock, apply_wait_policy

if TYPE_CHECKING:
    from tamrun.sweeps.sweep_failures import JobFailure


def run_job(cfg, failed: List[JobFailure], imports: Optional[ImportPause] = None,
            started: Optional[CpuClock] = None) -> Any:
    """One job of ``python -m tamrun`` (one run, or one job of a multirun): its objective for the
    sweeper (a list with ``more_objectives``: `tamrun.sweeps.sweep.objective_names`). Bad input exits 2 with one message, an internal error exits 1 (`job_failed`); in a multirun
    the job fails alone (appended to ``failed``, NaN to the sweeper) and the sweep goes on. ``imports``:
    the entry point's pause of the garbage collector, settled once the run has loaded its libraries;
    ``started``: the command's first reading of the CPU clocks, from which the load at start is read to
    choose how torch's threads wait, before torch loads (`tamrun.machine.threads.apply_wait_policy`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from tamrun.errors import ConfigError
    from tamrun.sweeps.sweep import failed_objective, objective_names, sweep_run_name, sweep_tags

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if multirun:  # the parent's summary lists every job that started, whatever becomes of it
        from tamrun.tracking.sweep_record.sweep_files import mark_started

        mark_started(hydra_cfg.sweep.dir, hydra_cfg.job.num, overrides)
    tags = sweep_tags(hydra_cfg.sweep.dir, hydra_cfg.job.num, overrides) if multirun else {}
    name = sweep_run_name(hydra_cfg.sweep.dir, hydra_cfg.job.num, overrides, cfg) if multirun else None
    label = parallel_job_label(hydra_cfg, name)
    if label is not None:  # the jobs' lines interleave on one console: each says whose it is
        from tamrun.process.joblog import label_console_lines

        label_console_lines(label)
    apply_wait_policy(started, jobs_at_once=label is not None)  # before torch loads (tamrun/machine/threads.py)
    from tamrun.runner import run

    try:
        result = run(cfg, overrides=overrides, tags=tags, run_name=name,
                     libraries_loaded=imports.settle if imports is not None else None,
                     folder=run_folder(hydra_cfg.runtime.output_dir))
        if cfg.mode.name == "plan":
            sys.stdout.write(result.plan.describe() + "\n" + (result.tco.describe() + "\n" if result.tco else ""))
            return None
        names = objective_names(cfg)
        for field, objective in zip(("objective", *["more_objectives"] * (len(names) - 1)), names):
            if objective not in result.metrics:
                raise ConfigError(field, objective, "this run logged no such metric",
                                  f"use one of: {', '.join(sorted(result.metrics))}")
    except Exception as exc:  # bad input (a TamrunError) or a bug; a signal (KeyboardInterrupt) goes on up
        failed.append(job_failed(exc, cfg, hydra_cfg, tags, name))
        return failed_objective(cfg)
    values = [result.metrics[objective] for objective in names]
    return values[0] if len(values) == 1 else values


def run_folder(output_dir: str) -> str:
    """The run folder as the user can reach it: relative to the working directory when under it."""
    path = Path(output_dir)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def parallel_job_label(hydra_cfg: Any, name: Optional[str]) -> Optional[str]:
    """``[#<job> <run name>]`` for a job of a multirun whose launcher runs jobs at once
    (`tamrun.process.joblog.job_label`); None otherwise."""
    from hydra.types import RunMode

    from tamrun.process.joblog import job_label, runs_jobs_at_once

    if hydra_cfg.mode != RunMode.MULTIRUN or name is None:
        return None
    launcher = hydra_cfg.get("launcher") or {}
    return job_label(hydra_cfg.job.num, name) if runs_jobs_at_once(str(launcher.get("_target_", ""))) else None


def job_failed(exc: Exception, cfg: Any, hydra_cfg: Any, tags: Dict[str, str], name: Optional[str]) -> JobFailure:
    """Report the error that ended a job, from inside its ``except`` block. Bad input (a `TamrunError`):
    its one line (the traceback too under ``hydra.verbose=true`` or TAMRUN_DEBUG=1). Anything else is a
    bug: its traceback in the job's log (`tamrun.process.joblog`) and one line naming it and that log (a single
    run also prints the traceback). A single run then exits, 2 or 1; a multirun's job records a FAILED
    run if the error ended none, and the sweep goes on."""
    from hydra.types import RunMode

    from tamrun.errors import TamrunError, error_kind, internal_error_line
    from tamrun.process.joblog import log_internal_error
    from tamrun.process.outcome import job_places, named
    from tamrun.redact import redacted_traceback
    from tamrun.sweeps.sweep import hold_open_run, record_failed_job
    from tamrun.sweeps.sweep_failures import job_failure

    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    verbose = hydra_cfg.verbose or os.environ.get("TAMRUN_DEBUG")
    error = named(exc, job_places(hydra_cfg))
    internal = not isinstance(error, TamrunError)
    if internal:
        log_path = log_internal_error(exc, Path(hydra_cfg.runtime.output_dir) / f"{hydra_cfg.job.name}.log")
        line = internal_error_line(exc, log_path)
    else:
        line = error.report_line()
    if verbose or (internal and not multirun):
        sys.stderr.write(redacted_traceback(exc))
    launcher = str((hydra_cfg.get("launcher") or {}).get("_target_", "")) if multirun else ""
    # a parallel job's line says which job it is; Ray's launcher prints it as "sweep job #<n>: <line>" itself
    label = None if launcher.rsplit(".", 1)[-1].startswith("Ray") else parallel_job_label(hydra_cfg, name)
    sys.stderr.write(f"{label} {line}" if label else line)
    if not multirun:
        sys.exit(1 if internal else 2)
    if getattr(error, "run_id", None) is None:  # refused before its run started: a FAILED run of its own
        record_failed_job(cfg, tags, error, name, sweep_dir=hydra_cfg.sweep.dir)
    elif getattr(error, "run_open", False):  # the store went away during the run: its end held until it is back
        hold_open_run(hydra_cfg.sweep.dir, tags, error, name)
    return job_failure(hydra_cfg.job.num, "FAILED", error_kind(error), type(error).__name__)


def main(argv: Optional[List[str]] = None) -> None:
    """Run with ``argv`` (default: the command line's arguments)."""
    clock = CpuClock.read()  # the load from here to torch's import chooses how its threads wait
    imports = ImportPause()  # until the job's libraries are loaded (tamrun/process/collector.py)
    # pyarrow's default pool (mimalloc), which pandas reads through, reserves 1 GiB of address space at
    # its first use (an import below may be it): under ulimit -v it would take the run's room (docs/memory.md)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # MLflow draws a download bar when it checks the logged model's input example (a local copy)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ[RUN_TAG] = new_run_tag()  # this command's Hydra folders (tamrun/process/run_folder.py)
    import hydra
    from omegaconf import DictConfig

    from tamrun.config.load import config_dir
    from tamrun.config.store import register_configs
    from tamrun.errors import Abort
    from tamrun.process.hydra_loader import install
    from tamrun.redact import redacted_output
    from tamrun.tracking.signals import exit_code

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    register_configs()
    install()  # every composition checked before Hydra builds anything from it (a config is data)
    started: List[bool] = []
    failed: List[JobFailure] = []

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def app(cfg: DictConfig) -> Any:
        started.append(True)
        return run_job(cfg, failed, imports, clock)

    try:
        with redacted_output(), errors_raised() as own_full_error:  # Hydra raises what it would print
            app()
        if failed:  # jobs run in this process, no parent run to count them (SweepCallback counts the others)
            from tamrun.sweeps.sweep_failures import failure_exit_code, failure_line

            sys.stderr.write(failure_line(failed, len(started)))
            raise SystemExit(failure_exit_code(failed))
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM/SIGHUP as tamrun.tracking.signals.Terminated
        sys.stderr.write(f"tamrun: interrupted ({exc or 'SIGINT'}); the MLflow run, if started, is marked KILLED\n")
        raise SystemExit(exit_code(exc)) from None
    except (Exception, Abort) as exc:  # Hydra's own, or around the jobs: named here (tamrun/process/outcome.py)
        lines, code = outside_job(exc, bool(started), multirun_asked(sys.argv[1:]),
                                  verbose_asked(sys.argv[1:], own_full_error))
        sys.stderr.write(lines)
        raise SystemExit(code) from None
    finally:
        # Everything alive now lives until the process ends: without this, the interpreter's last
        # collections walk torch's, pandas' and mlflow's millions of objects (1.2 s of a 10 s run).
        imports.end()


if __name__ == "__main__":
    main()
