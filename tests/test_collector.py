"""The garbage collector paused while a process imports its libraries (tamrun/process/collector.py): the caller's
setting comes back, and a real run makes (almost) no full collection over torch's, pandas' and MLflow's
objects."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tamrun.process.collector import ImportPause, resume_paused_collection

from conftest import csv_overrides

# A child process that counts the collections of each generation over a whole `python -m tamrun` run.
COUNTING_RUN = """
import gc, json, sys
counts = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == "stop" and counts.__setitem__(info["generation"],
                                                                              counts[info["generation"]] + 1))
from tamrun.__main__ import main
try:
    main(sys.argv[1:])
finally:
    sys.stderr.write("COLLECTIONS " + json.dumps(counts) + "\\n")
"""


@pytest.fixture
def restored_collector():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()  # what a test froze goes back to the oldest generation of this (pytest's) process
    (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pause_ends_with_the_callers_setting(restored_collector, enabled):
    (gc.enable if enabled else gc.disable)()
    pause = ImportPause()
    assert not gc.isenabled()
    frozen = gc.get_freeze_count()
    pause.settle()
    assert gc.isenabled() == enabled and gc.get_freeze_count() > frozen  # what was alive is frozen
    gc.disable()
    pause.settle()  # once only: a second call changes nothing
    assert not gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    pause.end()
    assert gc.isenabled() == enabled


def test_a_caller_without_the_collector_gets_it_off_again(restored_collector):
    gc.disable()
    pause = ImportPause()
    resume_paused_collection()  # a sweep's launching process turned it on
    pause.end()
    assert not gc.isenabled()


def test_the_pause_ends_even_when_nothing_settled_it(restored_collector):
    gc.enable()
    pause = ImportPause()
    pause.end()  # e.g. Hydra refused the command line before a job started
    assert gc.isenabled()


def test_a_launcher_whose_jobs_run_elsewhere_ends_the_pause(restored_collector):
    """The process that launches joblib, submitit or Ray jobs never runs one: the sweep callback ends the
    pause itself (a sweep of many jobs would otherwise never collect its results' garbage)."""
    pause = ImportPause()
    resume_paused_collection()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.unfreeze()
    resume_paused_collection()  # the collector runs: nothing to do, nothing frozen
    assert gc.isenabled() and gc.get_freeze_count() == 0
    pause.end()
    assert gc.isenabled()


def test_a_run_makes_few_full_collections(tmp_path: Path, csv_path: Path):
    """Before the pause this run made 8 full collections (7 of them over its imports, 0.8 s on a 2-core
    EPYC); with it, everything loaded is frozen before the data is read and the run's own allocations
    make at most one (3 leaves room for a library that allocates more, far from 8)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-c", COUNTING_RUN, *csv_overrides(csv_path), f"tracking.uri={store}",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stderr.split("COLLECTIONS ")[-1].splitlines()[0])
    assert counts[2] <= 3, counts
