"""An internal error (a bug: any exception that is not a TamrunError) in a run or a sweep's job, as a
user meets it: named as one (exit code 1, one line naming the job's log, the traceback in that log), the
run FAILED with the error as tags, the sweep's other jobs run, and never taken for a command line that
Hydra refused (issue 33: a parallel sweep whose jobs raised was reported as the user's typo).

tamrun has no input known to raise an internal error, and no test hook: the child is ``python -c``
with one function of `tamrun.runner` replaced by one that raises a RuntimeError on purpose for the job
with ``seed=1``, then the command line's own entry (`tamrun.__main__.main`). A parallel sweep's workers
are forked from that process (``hw.fork_workers``, the default), so they run the replaced function too.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import List

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.process.outcome import REFUSED_HINT
from tamrun.errors import (ConfigError, DataError, DeviceError, FilesystemError, MemoryBudgetError, NumericalError,
                           TamrunError, error_kind, internal_error_line)
from tamrun.sweeps.sweep_failures import failure_exit_code, failure_line, job_failure

from test_cli import tamrun
from test_sweeps import sweep_args, sweep_runs

FAULT = "injected fault (raised on purpose by the test)"
# argv: the stage to break (a function of tamrun.runner: typed_config, before the run starts; prepare,
# inside it), then the command line.
INJECT = f"""
import sys
import tamrun.runner as runner

stage = sys.argv.pop(1)
real = getattr(runner, stage)


def failing(config, *args, **kwargs):
    if config.seed == 1:
        raise RuntimeError("{FAULT}\\nits second line")
    return real(config, *args, **kwargs)


setattr(runner, stage, failing)
from tamrun.__main__ import main

main(sys.argv[1:])
"""
QUICK = ["tracking.log_plots=false", "tracking.log_model=false"]


def tamrun_with_fault(stage: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m tamrun <args>`` whose jobs with seed=1 raise a RuntimeError in ``stage``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    return subprocess.run([sys.executable, "-c", INJECT, stage, *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def internal_line(stderr: str, label: str = "") -> str:
    """The one ``tamrun: internal error`` line of ``stderr`` (failing when there is not exactly one), after
    ``label``: a job of a sweep that runs jobs at once starts its lines with ``[#<job> <run name>]``
    (`tamrun.process.joblog.job_label`)."""
    start = f"{label} tamrun: internal error:" if label else "tamrun: internal error:"
    lines = [line[len(label):].lstrip() for line in stderr.splitlines() if line.startswith(start)]
    assert len(lines) == 1, stderr
    return lines[0]


def logged_traceback(line: str) -> str:
    """The job's log that an internal-error line names; it holds the traceback."""
    assert line.startswith(f"tamrun: internal error: RuntimeError: {FAULT} (a bug of tamrun's; traceback in "), line
    path = Path(line.rsplit("traceback in ", 1)[1].rstrip(")"))
    assert path.name == "tamrun.log" and path.is_file(), line
    return path.read_text()


def test_a_run_with_an_internal_error_exits_1_naming_it_and_its_log(tmp_path, csv_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun_with_fault("prepare", *sweep_args(csv_path, store, tmp_path / "sweep"), "seed=1", *QUICK,
                             cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Hydra refused" not in done.stderr and "config error" not in done.stderr
    line = internal_line(done.stderr)
    assert done.stderr.splitlines()[-1] == line
    assert "Traceback (most recent call last)" in done.stderr  # a single run shows the traceback too
    log = logged_traceback(line)
    assert "Traceback (most recent call last)" in log and "its second line" in log
    assert line.rsplit("traceback in ", 1)[1].startswith(str(tmp_path / "outputs"))  # the run's Hydra folder
    client = MlflowClient(tracking_uri=store)
    (logged,) = client.search_runs(["1"])
    assert logged.info.status == "FAILED"
    tags = logged.data.tags
    assert (tags["error_type"], tags["error_kind"]) == ("RuntimeError", "internal") and FAULT in tags["error"]
    run_log = Path(client.download_artifacts(logged.info.run_id, "logs/run.log", str(tmp_path))).read_text()
    assert "Traceback" in run_log and FAULT in run_log


@pytest.mark.parametrize("stage", ["prepare", "typed_config"], ids=["in-its-run", "before-its-run"])
def test_a_parallel_sweep_names_a_job_internal_error_and_the_other_job_finishes(tmp_path, csv_path, stage):
    """Issue 33: 2 jobs in joblib's worker processes, job 1 raising. Before, the sweep aborted with
    Hydra's exit 1 and tamrun called the command line refused."""
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    done = tamrun_with_fault(stage, "-m", "hydra/launcher=parallel", *sweep_args(csv_path, store, sweep_dir),
                             "seed=0,1", *QUICK, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Hydra refused" not in output and "config error" not in output
    assert "workers forked from this process" in output  # the fault reached job 1 in a worker process
    client, parent, children = sweep_runs(store, sweep_dir)
    assert done.stderr.splitlines()[-1] == ("tamrun: 1 of 2 sweep job(s) did not finish (job 1: internal error "
                                            f"RuntimeError); summary in run {parent.info.run_id}"), output
    line = internal_line(done.stderr, "[#1 seed=1]")  # a parallel job's line says which job it is
    assert line.rsplit("traceback in ", 1)[1] == f"{sweep_dir / '1' / 'tamrun.log'})"
    assert "Traceback (most recent call last)" in logged_traceback(line)
    assert "Traceback" not in done.stderr  # a sweep's console: one line per failed job
    assert [r.info.status for r in children] == ["FINISHED", "FAILED"]
    tags = children[1].data.tags
    assert (tags["error_type"], tags["error_kind"]) == ("RuntimeError", "internal") and FAULT in tags["error"]
    assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["sweep_job"] == "1"
    run_log = client.download_artifacts(children[1].info.run_id, "logs/run.log", str(tmp_path / "job1"))
    assert "Traceback (most recent call last)" in Path(run_log).read_text()  # its own run's, or the one recorded for it
    summary = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/summary.csv", str(tmp_path)))
    assert summary["status"].tolist() == ["FINISHED", "FAILED"]
    assert summary["error_type"].fillna("").tolist() == ["", "RuntimeError"]
    assert summary["error_kind"].fillna("").tolist() == ["", "internal"]
    assert parent.info.status == "FAILED" and parent.data.tags["sweep_failed_jobs"] == "1 of 2 (job(s) 1)"


def test_a_sweep_with_a_bug_and_bad_input_runs_every_job_and_exits_1(tmp_path, csv_path):
    """The basic launcher (jobs in the launching process): job 1 raises, job 2 has a bad seed (a
    ConfigError before its run starts), jobs 0 and 3 finish; the last line names both failures."""
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    done = tamrun_with_fault("prepare", "-m", *sweep_args(csv_path, store, sweep_dir), "seed=0,1,-1,2", *QUICK,
                             cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Hydra refused" not in output and "Traceback" not in done.stderr
    client, parent, children = sweep_runs(store, sweep_dir)
    assert done.stderr.splitlines()[-1] == ("tamrun: 2 of 4 sweep job(s) did not finish (job 1: internal error "
                                            "RuntimeError; job 2: config error ConfigError); summary in run "
                                            f"{parent.info.run_id}"), output
    assert internal_line(done.stderr).endswith(f"traceback in {sweep_dir / '1' / 'tamrun.log'})")
    assert "tamrun: config error: seed=-1" in done.stderr
    assert [r.info.status for r in children] == ["FINISHED", "FAILED", "FAILED", "FINISHED"]
    assert [r.data.tags.get("error_kind") for r in children] == [None, "internal", "config", None]


def test_a_sweep_without_tracking_still_says_which_job_failed_and_why(tmp_path, csv_path):
    sweep_dir = tmp_path / "sweep"
    done = tamrun_with_fault("prepare", "-m", *sweep_args(csv_path, "unused", sweep_dir), "tracking.enabled=false",
                             "seed=0,1", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == ("tamrun: 1 of 2 sweep job(s) did not finish (job 1: internal error "
                                            "RuntimeError)"), done.stderr
    assert "Traceback (most recent call last)" in logged_traceback(internal_line(done.stderr))
    assert not (tmp_path / "outputs" / "mlflow.db").exists() and not (tmp_path / "unused").exists()


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=parallel"]], ids=["basic", "parallel"])
def test_an_option_hydra_cannot_find_is_still_refused_as_the_command_line(tmp_path, launcher):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun("-m", *launcher, f"tracking.uri={store}", "model=fourier,nosuch", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Could not find 'model/nosuch'" in done.stderr
    assert done.stderr.endswith(REFUSED_HINT) and "internal error" not in done.stderr


@pytest.mark.parametrize("error", [ConfigError, DataError, DeviceError, MemoryBudgetError, NumericalError, FilesystemError,
                                   TamrunError])
def test_a_tamrun_error_crosses_processes_whole(error):
    """Pickled as joblib's and Ray's workers send a job's exception back: same class, message, fields,
    run id and report line."""
    original = error("model.effects.toy.m", -2, "must be at least 1", "set model.effects.toy.m=8")
    original.run_id = "0123abcd"
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is error and str(copy) == str(original) and copy.args == original.args
    assert (copy.field, copy.value, copy.problem, copy.fix, copy.run_id) == ("model.effects.toy.m", -2,
                                                                             "must be at least 1",
                                                                             "set model.effects.toy.m=8", "0123abcd")
    assert copy.report_line() == original.report_line()
    assert pickle.loads(pickle.dumps(error("f", "v", "p", "x"))).run_id is None


def tamrun_exceptions() -> dict:
    """Every exception class the package defines: dotted name -> class (each module imported)."""
    import importlib
    import inspect
    import pkgutil

    import tamrun

    found = {}
    for module in pkgutil.walk_packages(tamrun.__path__, "tamrun."):
        for name, value in vars(importlib.import_module(module.name)).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.name:
                found[f"{module.name}.{name}"] = value
    return found


def test_every_tamrun_exception_pickles_to_the_same_error():
    """Every exception class of the package, found by walking its modules (a new one must be added here with
    its arguments), pickles and unpickles to the same class, message and attributes: a sweep job's error
    crosses joblib's, submitit's and Ray's process boundaries whole (before, `Terminated` unpickled as
    ``Terminated("received SIGTERM")`` and failed in its own __init__)."""
    import signal

    from tamrun.errors import Abort
    from tamrun.machine.tracker import BudgetExceeded
    from tamrun.machine.placement import PlacementError
    from tamrun.tracking.model_files import ModelFileError
    from tamrun.tracking.model_state import ModelStateError
    from tamrun.tracking.signals import Terminated

    fields = ("model.effects.toy.m", -2, "must be at least 1", "set model.effects.toy.m=8")
    samples = {error: error(*fields) for error in (ConfigError, DataError, DeviceError, MemoryBudgetError,
                                                  NumericalError, FilesystemError, TamrunError)}
    samples.update({Terminated: Terminated(signal.SIGTERM), BudgetExceeded: BudgetExceeded("2 GiB over the budget"),
                    PlacementError: PlacementError("mixed devices"), Abort: Abort(ConfigError(*fields)),
                    ModelStateError: ModelStateError("not a model state tamrun wrote"),
                    ModelFileError: ModelFileError(*fields)})
    assert set(tamrun_exceptions().values()) == set(samples), "an exception class without a sample here"
    for kind, original in samples.items():
        original.run_open = True  # an attribute a job sets on its error (tamrun.tracking.mlflow_run)
        copy = pickle.loads(pickle.dumps(original))
        assert type(copy) is kind and str(copy) == str(original) and repr(copy.args) == repr(original.args), kind
        assert copy.run_open is True, kind
    assert pickle.loads(pickle.dumps(samples[Terminated])).signum == signal.SIGTERM
    assert str(pickle.loads(pickle.dumps(samples[Abort])).error) == str(samples[Abort].error)


def test_error_kinds_reasons_and_exit_codes():
    assert error_kind(DataError("y", 1, "p", "f")) == "data" and error_kind(RuntimeError()) == "internal"
    assert error_kind(KeyboardInterrupt()) == "interrupted"
    assert internal_error_line(RuntimeError(), "/x/tamrun.log") == (
        "tamrun: internal error: RuntimeError (a bug of tamrun's; traceback in /x/tamrun.log)\n")
    assert internal_error_line(RuntimeError("x"), None) == (  # outside a job, before any log: printed above it
        "tamrun: internal error: RuntimeError: x (a bug of tamrun's; traceback above)\n")
    assert error_kind(FilesystemError("hydra.run.dir", "/x", "p", "f")) == "filesystem"
    failures: List = [job_failure(0, "KILLED", "", ""), job_failure(3, "FAILED", "data", "DataError")]
    assert failure_exit_code(failures) == 2
    assert failure_line(failures, 4) == ("tamrun: 2 of 4 sweep job(s) did not finish (job 0: KILLED; job 3: data "
                                         "error DataError)\n")
    failures.append(job_failure(5, "FAILED", "internal", "OutOfMemoryError"))
    assert failure_exit_code(failures) == 1 and failures[-1].reason == "internal error OutOfMemoryError"
    assert job_failure(1, "KILLED", "lost", "").reason == "KILLED (lost)"
    assert job_failure(1, "FAILED", "lost", "RuntimeError").reason == "FAILED (lost, RuntimeError)"


def test_an_error_outside_any_job_is_named_once_by_the_entry_point(capsys):
    """What reaches the entry point from Hydra or the code around the jobs: a bug prints its traceback and
    exits 1, a refused write exits 2 naming Hydra's folder, Hydra's own refusal keeps its hint, and an
    `Abort` is reported as the error it carries."""
    from hydra.errors import OverrideParseException

    from tamrun.errors import Abort
    from tamrun.process.outcome import outside_job

    try:
        raise RuntimeError("a bug around the jobs")
    except RuntimeError as bug:
        lines, code = outside_job(bug, started=True, multirun=False, verbose=False)
    assert (lines, code) == ("tamrun: internal error: RuntimeError: a bug around the jobs (a bug of tamrun's; "
                             "traceback above)\n", 1)
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    lines, code = outside_job(Abort(PermissionError(13, "Permission denied", "out")), started=False, multirun=True,
                              verbose=False)
    assert code == 2 and lines.startswith(f"tamrun: filesystem error: {Path.cwd() / 'out'}: cannot be created or "
                                          "written ([Errno 13] Permission denied; the sweep's Hydra folder, "
                                          "hydra.sweep.dir)")
    lines, code = outside_job(OverrideParseException("x=", "mismatched input"), started=False, multirun=False, verbose=False)
    assert (lines, code) == ("mismatched input\n" + REFUSED_HINT, 2)
    lines, code = outside_job(OverrideParseException("x=", "after a job"), started=True, multirun=False, verbose=False)
    assert code == 1 and "internal error: OverrideParseException" in lines  # Hydra's, but not a refusal then
    assert not capsys.readouterr().out
