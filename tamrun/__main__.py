"""``python -m tamrun [overrides]``: a thin Hydra entry point around `tamrun.runner.run`.

Exit codes: 0 success; 2 bad input (config, data, device, memory limit, store: one readable message,
no traceback unless ``hydra.verbose=true`` or TAMRUN_DEBUG=1); 130 / 143 interrupted by SIGINT /
SIGTERM (the MLflow run is marked KILLED); 1 an internal error (with its traceback).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import List, Optional

from tamrun.collector import ImportPause

REFUSED_HINT = ("tamrun: config error: Hydra refused the command line (message above). Fix: check the field's "
                "spelling and type in docs/configuration.md (`python -m tamrun --cfg job` prints every field), "
                "or pick an option listed by `python -m tamrun --help`\n")


def run_job(cfg, failed: List[int], imports: Optional[ImportPause] = None) -> Optional[float]:
    """One job of ``python -m tamrun`` (one run, or one job of a multirun): its objective for the
    sweeper. Bad input exits 2 with one message; in a multirun the job fails alone (appended to
    ``failed``, NaN to the sweeper) and the sweep goes on. ``imports``: the entry point's pause of the
    garbage collector, settled once the run has loaded its libraries."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from tamrun.errors import ConfigError, TamrunError
    from tamrun.runner import run
    from tamrun.tracking.sweep import objective_name, record_refused_job, sweep_run_name, sweep_tags

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    tags = sweep_tags(hydra_cfg.sweep.dir, hydra_cfg.job.num, overrides) if multirun else {}
    name = sweep_run_name(hydra_cfg.sweep.dir, hydra_cfg.job.num, overrides, cfg) if multirun else None
    try:
        result = run(cfg, overrides=overrides, tags=tags, run_name=name,
                     libraries_loaded=imports.settle if imports is not None else None)
        if cfg.mode.name == "plan":
            sys.stdout.write(result.plan.describe() + "\n")
            return None
        objective = objective_name(cfg)
        if objective not in result.metrics:
            raise ConfigError("objective", objective, "this run logged no such metric",
                              f"use one of: {', '.join(sorted(result.metrics))}")
    except TamrunError as exc:
        if hydra_cfg.verbose or os.environ.get("TAMRUN_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(exc.report_line())
        if not multirun:
            sys.exit(2)
        failed.append(hydra_cfg.job.num)  # the sweep goes on: every job runs whatever another did
        if exc.run_id is None:
            record_refused_job(cfg, tags, exc, name)
        return float("nan")
    return result.metrics[objective]


def main(argv: Optional[List[str]] = None) -> None:
    """Run with ``argv`` (default: the command line's arguments)."""
    imports = ImportPause()  # until the job's libraries are loaded (tamrun/collector.py)
    # pyarrow's default pool (mimalloc), which pandas reads through, reserves 1 GiB of address space at
    # its first use (an import below may be it): under ulimit -v it would take the run's room (docs/memory.md)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # MLflow draws a download bar when it checks the logged model's input example (a local copy)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import hydra
    from omegaconf import DictConfig

    from tamrun.config.load import config_dir
    from tamrun.config.plugins import missing_plugin
    from tamrun.config.store import register_configs
    from tamrun.tracking.signals import exit_code

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    register_configs()
    started: List[bool] = []
    failed: List[int] = []

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def app(cfg: DictConfig) -> Optional[float]:
        started.append(True)
        return run_job(cfg, failed, imports)

    try:
        app()
        if failed:  # jobs run in this process (basic launcher); others are counted by the sweep callback
            sys.stderr.write(f"tamrun: sweep job(s) {', '.join(map(str, failed))} failed on bad input\n")
            raise SystemExit(2)
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM/SIGHUP as tamrun.tracking.signals.Terminated
        sys.stderr.write(f"tamrun: interrupted ({exc or 'SIGINT'}); the MLflow run, if started, is marked KILLED\n")
        raise SystemExit(exit_code(exc)) from None
    except SystemExit as exc:
        # Hydra exits 1 on a bad override, an unknown config option or a missing plugin, before the job
        # starts: that is bad input too.
        if exc.code == 1 and not started:
            # Hydra exits inside its handler of the error it reported: that error is the exit's context.
            plugin = missing_plugin(exc.__context__)
            sys.stderr.write(plugin.report_line() if plugin else REFUSED_HINT)
            raise SystemExit(2) from None
        raise
    finally:
        # Everything alive now lives until the process ends: without this, the interpreter's last
        # collections walk torch's, pandas' and mlflow's millions of objects (1.2 s of a 10 s run).
        imports.end()


if __name__ == "__main__":
    main()
