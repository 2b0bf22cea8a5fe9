"""python -m tamrun.bench.boosting and its LightGBM child: what the peer's features may see, the commands, the
measured processes and the table. No LightGBM run here (its environment is not tamrun's) and no timing is
asserted: only bounds a process sets itself (the CPU seconds it burns, the bytes it touches)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from tamrun.bench.boost_child import (CALENDAR, DAY_MEAN, LAGS, ROWS_PER_DAY, TEMPERATURES, exogenous_frame,
                                      previous_day_mean, scores)
from tamrun.bench.boosting import LIGHTGBM, SETUP, TAMRUN_COMMANDS, table, tamrun_commands, tamrun_record
from tamrun.bench.commands import measured_run
from tamrun.bench.report import MIB
from tamrun.data.load import embedded_path

from conftest import csv_overrides


@pytest.fixture(scope="module")
def national():
    """The embedded table's first ten days (48 half-hours each)."""
    return pd.read_csv(embedded_path(), nrows=10 * ROWS_PER_DAY)


def test_the_features_of_a_day_do_not_change_when_its_load_does(national):
    """A day-ahead forecast reads nothing of its own day: shifting the load of day D leaves every feature of
    D's rows as it was, while the previous day's mean of D + 1 moves by the shift (the check can fail)."""
    before = exogenous_frame(national)
    day = pd.to_datetime(national["date"]).dt.normalize()
    target_day = day.unique()[5]
    shifted = national.assign(Load=national["Load"].where(day != target_day, national["Load"] + 5000.0))
    after = exogenous_frame(shifted)
    features = [*CALENDAR, *TEMPERATURES, DAY_MEAN]
    rows = (before["ds"].dt.normalize() == target_day).to_numpy()
    pd.testing.assert_frame_equal(before.loc[rows, features], after.loc[rows, features])
    following = (before["ds"].dt.normalize() == target_day + pd.Timedelta(days=1)).to_numpy()
    assert (after.loc[following, DAY_MEAN] - before.loc[following, DAY_MEAN]).to_numpy() == pytest.approx(5000.0)
    # mlforecast's lags (not run here) count rows; the table has ROWS_PER_DAY a day, so none is under a day
    assert min(LAGS) >= ROWS_PER_DAY and set(LAGS) == {ROWS_PER_DAY, 7 * ROWS_PER_DAY}


def test_the_previous_days_mean_is_the_calendar_day_before_against_pandas(national):
    dates = pd.to_datetime(national["date"])
    got = previous_day_mean(dates, national["Load"])
    daily = national.groupby(dates.dt.date)["Load"].mean()
    expected = [daily.get(d - pd.Timedelta(days=1).to_pytimedelta(), float("nan")) for d in dates.dt.date]
    assert got.to_numpy() == pytest.approx(expected, nan_ok=True)
    assert got.iloc[:ROWS_PER_DAY].isna().all() and got.iloc[ROWS_PER_DAY:].notna().all()
    shuffled = national.sample(frac=1.0, random_state=0)
    again = exogenous_frame(shuffled)  # any row order: sorted by date first
    pd.testing.assert_frame_equal(again, exogenous_frame(national))


def test_the_scores_are_rmse_and_mape_in_percent():
    assert scores([100.0, 200.0], [110.0, 180.0]) == pytest.approx({"rmse": (250.0) ** 0.5, "mape": 10.0})


def test_the_tamrun_commands_are_a_setting():
    assert [label for label, _ in tamrun_commands(None)] == [f"tamrun {c}" for c in TAMRUN_COMMANDS]
    assert tamrun_commands(["+experiment=day_ahead_static hw.threads=1", "model=spline 'data.path=a b.csv'"]) == [
        ("tamrun +experiment=day_ahead_static hw.threads=1", ["+experiment=day_ahead_static", "hw.threads=1"]),
        ("tamrun model=spline data.path=a b.csv", ["model=spline", "data.path=a b.csv"])]
    with pytest.raises(ValueError, match="at least one override"):
        tamrun_commands(["  "])


def test_a_measured_process_counts_its_childrens_cpu_and_memory(tmp_path):
    """The command's grandchild burns 0.3 CPU s and touches 64 MiB more than this process's own high-water
    mark (the floor every child inherits): both are in the figures of the command."""
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grandchild = textwrap.dedent(f"""
        import time
        block = bytearray({floor} + 64 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        while time.process_time() < 0.3:
            pass
    """)
    command = [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"]
    done = measured_run(command, timeout=120)
    assert done.returncode == 0 and not done.timed_out
    assert done.cpu_seconds >= 0.3 and done.peak_bytes >= floor + 64 * MIB and done.floor_bytes >= floor
    slow = measured_run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert slow.timed_out and slow.returncode != 0


def test_the_table_has_one_row_per_condition_and_run():
    ok = {"status": "ok", "rmse": 1000.0, "mape": 1.5, "peak_bytes": 512 * MIB}
    records = [
        {**ok, "run": "tamrun model=spline_lags", "condition": "idle", "fit_seconds": 2.0, "cpu_seconds": 6.0,
         "wall_seconds": 8.0},
        {**ok, "run": "tamrun model=spline_lags", "condition": "idle", "fit_seconds": 4.0, "cpu_seconds": 8.0,
         "wall_seconds": 10.0},
        {**ok, "run": LIGHTGBM, "condition": "idle", "rmse": 1398.12, "mape": 2.0139, "fit_seconds": 11.5,
         "cpu_seconds": 20.0, "wall_seconds": 25.0, "peak_bytes": 300 * MIB},
        {"run": LIGHTGBM, "condition": "loaded", "status": "timeout", "cpu_seconds": 3600.0}]
    lines = table(records, busy=2)
    assert lines[0] == ("| condition | run | ok | RMSE 2024 MW | MAPE 2024 % | fit s | process CPU s | wall s | "
                        "peak RSS MiB |")
    assert lines[2] == ("| idle | tamrun model=spline_lags | 2/2 | 1,000.0 | 1.500 | 3.00 (2.00–4.00) | 7.0 (6.0–8.0) "
                        "| 9.0 (8.0–10.0) | 512 (512–512) |")
    assert lines[3] == f"| idle | {LIGHTGBM} | 1/1 | 1,398.1 | 2.014 | 11.50 | 20.0 | 25.0 | 300 |"
    assert lines[4] == f"| beside 2 busy | {LIGHTGBM} | 0/1 | – | – | – | – | – | – |"
    assert len(lines) == 5 and {line.count("|") for line in lines} == {10}
    floored = table([{**records[2], "peak_floor_bytes": 400 * MIB}], busy=2)
    assert floored[2].endswith("| 25.0 | ≤ 300 |")  # the bench's own high-water mark, not the run's


@pytest.mark.parametrize("python, why", [("missing", "no such file"), ("tamrun's", "No module named")])
def test_a_missing_peer_environment_names_the_setup_command(tmp_path, python, why):
    """No traceback: one line naming what is missing and the command that sets the environment up."""
    path = str(tmp_path / "nothing" / "python") if python == "missing" else sys.executable
    if python != "missing" and subprocess.run([path, "-c", "import mlforecast, lightgbm"]).returncode == 0:
        pytest.skip("this environment has mlforecast and lightgbm")
    done = subprocess.run([sys.executable, "-m", "tamrun.bench.boosting", "--mlforecast-python", path,
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert why in done.stderr and SETUP in done.stderr and "--sides tamrun" in done.stderr
    assert not list(tmp_path.glob("boosting-*"))


def test_a_tamrun_command_is_measured_and_scored_from_its_own_store(tmp_path, csv_path):
    """The bench's tamrun side on the synthetic CSV: the figures read with sqlite3 are MLflow's, the process's
    CPU and peak are counted, a failing command is an error record with its message."""
    from tamrun.bench.commands import latest_metrics

    record = tamrun_record(csv_overrides(csv_path), tmp_path / "run", timeout=300)
    assert record["status"] == "ok" and record["fit_metric"] == "fit_seconds"
    logged = latest_metrics(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
    assert (record["rmse"], record["mape"], record["fit_seconds"]) == (
        logged["rmse_test"], logged["mape_test"], logged["fit_seconds"])
    # the peak: at least the floor this (test) process hands on, whose own size depends on the tests before
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert record["cpu_seconds"] > 0 and record["peak_bytes"] >= record["peak_floor_bytes"] > 0
    assert record["peak_floor_bytes"] <= floor
    assert table([{**record, "run": "tamrun csv", "condition": "idle"}], busy=2)[2].startswith("| idle | tamrun csv | 1/1 |")
    failed = tamrun_record([*csv_overrides(csv_path), "model.effects.sx.k=-1"], tmp_path / "bad", timeout=300)
    assert failed["status"] == "error" and failed["error_kind"] == "exit 2" and "model.effects.sx.k" in failed["error"]


def test_the_bench_s_messages_pass_the_one_redaction(tmp_path):
    """What the bench writes goes through `tamrun.redact.redacted`: a password in a path it names is masked."""
    done = subprocess.run([sys.executable, "-m", "tamrun.bench.boosting", "--mlforecast-python",
                           "https://user:hunter2secret@127.0.0.1/python", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "hunter2secret" not in done.stderr and "user:***@127.0.0.1" in done.stderr, done.stderr
