"""`python -m tamrun` as a user runs it: exit codes, one readable message, no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from tamrun.machine.threads import (BUSY_AT_START, LOAD_WINDOW_S, WAIT_REASON, WAIT_SPINS, CpuClock, applied_wait_policy,
                            others_busy, wait_policy)

from conftest import csv_overrides


def tamrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    return subprocess.run([sys.executable, "-m", "tamrun", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


BAD_INPUTS = [
    # (overrides, what the message must contain, whether the MLflow run had started)
    (["model.effects.temp.m=-2"], ["model.effects.temp.m=-2", "Fix:"], False),
    (["model.effects.temp.kind=wavelet"], ["model.effects.temp.kind='wavelet'", "unknown effect kind"], False),
    (["model.effects.temp.column=nope"], ["model.effects.temp.column='nope'", "no such column"], True),
    (["split.test_start=2030-01-01", "split.test_end=2030-12-31"], ["split.test_start", "no rows"], True),
    (["model=nope"], ["Could not find 'model/nope'", "fourier"], False),
    (["model.effects.temp.mm=3"], ["model.effects.temp.mm", "not in struct"], False),
    (["dtype=float16"], ["dtype", "float64"], False),
    (["memory.limit=lots"], ["memory.limit='lots'", "2GiB"], False),
    (["data=csv"], ["data.path", "Fix:"], False),
]


@pytest.mark.parametrize("overrides,expected,started", BAD_INPUTS, ids=[" ".join(b[0]) for b in BAD_INPUTS])
def test_bad_input_exits_2_with_one_readable_message(tmp_path, overrides, expected, started):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun(f"tracking.uri={store}", *overrides, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    for text in expected:
        assert text in output, output
    assert "Traceback" not in output
    if started:
        runs = MlflowClient(tracking_uri=store).search_runs(["1"])
        assert [r.info.status for r in runs] == ["FAILED"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: hw=cuda is valid here")
def test_explicit_cuda_without_cuda_is_a_clear_error(tmp_path):
    done = tamrun(f"tracking.uri=sqlite:///{tmp_path / 'm.db'}", "hw=cuda", cwd=tmp_path)
    assert done.returncode == 2
    assert "hw='cuda': no cuda device is available" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_runs_from_any_directory_with_the_default_store(tmp_path, csv_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = tamrun(*csv_overrides(csv_path), cwd=elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    store = elsewhere / "outputs" / "mlflow.db"
    assert store.is_file()
    runs = MlflowClient(tracking_uri=f"sqlite:///{store}").search_runs(["1"])
    assert [r.info.status for r in runs] == ["FINISHED"]


def test_an_impossible_limit_stops_before_fitting_with_the_minimal_limit(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun(f"tracking.uri={store}", "memory.limit=1KiB", cwd=tmp_path)
    assert done.returncode == 2
    assert "memory.limit='1.00 KiB'" in done.stderr and "raise memory.limit to at least" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    (logged,) = MlflowClient(tracking_uri=store).search_runs(["1"])
    assert logged.info.status == "FAILED"
    assert not [key for key in logged.data.metrics if key.endswith("solve_seconds")]  # nothing was fitted


def test_a_limit_that_leaves_cg_a_few_rows_refuses_and_the_limit_it_names_plans_min_chunk_rows(tmp_path):
    """forest on the national table under a memory.limit where CG could hold one group of a few hundred
    rows only: such a plan would rebuild the design thousands of times per product (a capped run went on
    for more than 10 minutes). It exits 2 naming memory.min_chunk_rows and the limit that holds 1,024
    rows; at that limit the plan keeps 1,024 rows per chunk. (mode=plan: nothing is fitted.)"""
    done = tamrun("mode=plan", "model=forest", "hw=cpu", "memory.limit=4MiB", cwd=tmp_path)  # the CPU's budget
    assert done.returncode == 2, done.stdout + done.stderr
    assert "(one group, 1024 rows, " in done.stderr and "or lower memory.min_chunk_rows (a slower fit)" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    named = float(re.search(r"raise memory.limit to at least ([0-9.]+) MiB", done.stderr).group(1))
    planned = tamrun("mode=plan", "model=forest", "hw=cpu", f"memory.limit={named + 0.01:.2f}MiB", cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "route: cg" in planned.stdout and "fit chunks: 1 groups x 1024 rows" in planned.stdout


def test_plan_mode_prints_the_plan_without_fitting_or_recording(tmp_path):
    store = tmp_path / "mlflow.db"
    done = tamrun(f"tracking.uri=sqlite:///{store}", "mode=plan", "model=spline", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "route: direct" in done.stdout and "smallest memory.limit this run fits in" in done.stdout
    assert "predicted working peak" in done.stdout
    assert not store.exists()


# A child that records OpenMP's variables at the moment torch is first imported, then runs ``main(argv)``.
POLICY_AT_TORCH_IMPORT = """
import os, sys
seen = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.update({k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")})
        return None
sys.meta_path.insert(0, Watch())
from tamrun.__main__ import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("at torch import", seen.get("GOMP_SPINCOUNT"), seen.get("OMP_WAIT_POLICY"))
"""


@pytest.mark.parametrize("given,expected", [
    ({"OMP_WAIT_POLICY": "PASSIVE"}, ("None", "PASSIVE")),  # the environment's policy is kept whole
    ({"OMP_WAIT_POLICY": "ACTIVE"}, ("None", "ACTIVE")),
    ({"GOMP_SPINCOUNT": "300000"}, ("300000", "None")),  # OpenMP's own default, asked for by name
], ids=["passive", "active", "spincount"])
def test_the_environments_wait_policy_is_kept(tmp_path, given, expected):
    """An environment that chooses OpenMP's wait policy keeps it: the variables as they are when torch
    is first imported, in a real run of the entry point (mode=plan imports torch)."""
    done = policy_at_torch_import(tmp_path, given)
    assert done.stdout.strip().splitlines()[-1] == "at torch import " + " ".join(expected), done.stdout[-2000:]


def policy_at_torch_import(tmp_path: Path, given: dict) -> subprocess.CompletedProcess:
    """`POLICY_AT_TORCH_IMPORT` run with ``given`` on top of this environment (without its own policy)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HYDRA_") and k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", WAIT_REASON)}
    done = subprocess.run([sys.executable, "-c", POLICY_AT_TORCH_IMPORT, "mode=plan", "tracking=none"],
                          cwd=tmp_path, env={**env, **given}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_busy_cores_at_start_choose_the_short_spin_before_torch_loads(tmp_path):
    """Two processes that keep the cores busy from before the command starts: the entry point reads the
    load from its start to torch's import (here at least a core, far above BUSY_AT_START) and sets
    GOMP_SPINCOUNT=WAIT_SPINS before torch loads."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        done = policy_at_torch_import(tmp_path, {})
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert done.stdout.strip().splitlines()[-1] == f"at torch import {WAIT_SPINS} None", done.stdout[-2000:]


@pytest.mark.parametrize("others,jobs_at_once,spins,reason", [
    (None, False, None, "OpenMP's default spin: no load measured at start"),
    (0.1, False, None, "OpenMP's default spin: cores idle at start (0.1 busy with other processes)"),
    (0.44, False, None, "OpenMP's default spin: cores idle at start (0.4 busy with other processes)"),
    (0.5, False, WAIT_SPINS, f"GOMP_SPINCOUNT={WAIT_SPINS}: 0.5 cores busy with other processes at start"),
    (1.9, False, WAIT_SPINS, f"GOMP_SPINCOUNT={WAIT_SPINS}: 1.9 cores busy with other processes at start"),
    (0.0, True, WAIT_SPINS, f"GOMP_SPINCOUNT={WAIT_SPINS}: the sweep's jobs share the cores"),
])
def test_the_wait_policy_for_a_given_load(others, jobs_at_once, spins, reason):
    """`wait_policy`: the short spin when other processes keep BUSY_AT_START of a core busy at start, or
    for a job whose sweep runs jobs at once; OpenMP's default spin on idle cores."""
    assert BUSY_AT_START == 0.5  # the table straddles it
    variables, said = wait_policy({}, others, jobs_at_once)
    assert variables == ({} if spins is None else {"GOMP_SPINCOUNT": str(spins)}) and said == reason


@pytest.mark.parametrize("given,policy", [
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "the environment's: OMP_WAIT_POLICY=PASSIVE"),
    ({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "20"},
     "the environment's: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=20")])
def test_an_environments_policy_wins_whatever_the_load(given, policy):
    assert wait_policy(given, 1.9, True) == ({}, policy)
    assert applied_wait_policy(given) == policy
    assert applied_wait_policy({}) == "OpenMP's default (GOMP_SPINCOUNT=300000)"


def test_the_load_at_start_is_other_processes_cpu_time_over_the_window():
    """`others_busy`: (machine busy - own) / wall, in cores; a window shorter than LOAD_WINDOW_S tells
    nothing."""
    start = CpuClock(wall=10.0, machine_busy=100.0, own=5.0)
    assert others_busy(start, CpuClock(wall=11.0, machine_busy=102.5, own=5.9)) == pytest.approx(1.6)
    assert others_busy(start, CpuClock(wall=12.0, machine_busy=101.0, own=6.2)) == 0.0  # never below 0
    assert others_busy(start, CpuClock(wall=10.0 + LOAD_WINDOW_S / 2, machine_busy=101.0, own=5.0)) is None
    now = CpuClock.read()
    assert now is not None and now.machine_busy > 0 and now.own > 0  # Linux's clocks, read
