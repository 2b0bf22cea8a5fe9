"""A team's tracking server: `mlflow server` backed by a real PostgreSQL (Debian's binaries, a throw-away
cluster on 127.0.0.1), artifacts served through it (--serve-artifacts), every job run with
``tracking=server`` (the URI from MLFLOW_TRACKING_URI).

- 8 jobs at once (hydra/launcher=parallel, n_jobs=8) write to the server: 8 FINISHED runs, the parent's
  summary lists them, and the same sweep against a sqlite file gives the same params and metrics;
- the server killed mid-sweep: the jobs that need it end with exit code 2 and one message naming
  tracking.uri; when it is back, every run in the store is FINISHED and complete, or was never created,
  or (a job cut off mid-run) is closed FAILED by the next run's stale-run check.

Skipped, saying why, without the PostgreSQL binaries (apt-get install postgresql) or the driver
(pip install 'tamrun[team]').
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from servers import MlflowServer, postgres_database
from test_determinism import comparable

pytestmark = pytest.mark.slow
JOBS = 8
SWEEP = ["model.effects.sx.k=" + ",".join(str(k) for k in range(6, 6 + JOBS)), "tracking.log_plots=false",
         "tracking.log_model=false", "progress=off"]


@pytest.fixture(scope="module")
def postgres():
    """The module's PostgreSQL database (`servers.postgres_database`): its URI."""
    with postgres_database() as uri:
        yield uri


@pytest.fixture(scope="module")
def server(postgres, tmp_path_factory):
    folder = tmp_path_factory.mktemp("server")
    running = MlflowServer(postgres, folder / "artifacts", folder / "server.log").start()
    try:
        yield running
    finally:
        running.stop()


def tamrun_sweep(cwd: Path, uri_env: Dict[str, str], overrides: List[str], timeout: float = 600):
    """``python -m tamrun -m`` in ``cwd`` with ``uri_env`` added to a clean environment; (process, wall s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_"))}
    env.update(uri_env)
    cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tamrun", "-m", *overrides, f"hydra.sweep.dir={cwd}/sweep"],
                          cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    return done, time.monotonic() - started


def job_runs(client: MlflowClient, experiment: str):
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=200) if found else []
    return [r for r in runs if r.data.tags.get("sweep_role") != "parent"], \
        [r for r in runs if r.data.tags.get("sweep_role") == "parent"]


def records(runs) -> Dict[str, tuple]:
    """Per swept k: the run's params and its comparable metrics (timings left out)."""
    return {r.data.params["model.effects.sx.k"]: (r.info.status, r.data.params, comparable(r.data.metrics))
            for r in runs}


def durations(runs) -> str:
    seconds = sorted((r.info.end_time - r.info.start_time) / 1000 for r in runs)
    return f"per run {seconds[0]:.1f}-{seconds[-1]:.1f} s (median {seconds[len(seconds) // 2]:.1f} s)"


def test_eight_jobs_at_once_on_postgresql_match_the_sqlite_store(server, tmp_path, csv_path):
    overrides = [*csv_overrides(csv_path), *SWEEP, "hydra/launcher=parallel", f"hydra.launcher.n_jobs={JOBS}",
                 "tracking.experiment=pg8"]
    pg, pg_wall = tamrun_sweep(tmp_path / "pg", {"MLFLOW_TRACKING_URI": server.uri}, [*overrides, "tracking=server"])
    assert pg.returncode == 0, pg.stdout[-3000:] + pg.stderr[-5000:]
    db = tmp_path / "sqlite" / "mlflow.db"
    lite, lite_wall = tamrun_sweep(tmp_path / "sqlite", {}, [*overrides, f"tracking.uri=sqlite:///{db}"])
    assert lite.returncode == 0, lite.stdout[-3000:] + lite.stderr[-5000:]
    for done in (pg, lite):
        assert "Traceback" not in done.stdout + done.stderr and "ERROR" not in done.stderr

    client, local = MlflowClient(tracking_uri=server.uri), MlflowClient(tracking_uri=f"sqlite:///{db}")
    (pg_jobs, (pg_parent,)), (lite_jobs, _) = job_runs(client, "pg8"), job_runs(local, "pg8")
    assert len(pg_jobs) == JOBS and {r.info.status for r in pg_jobs} == {"FINISHED"}
    assert pg_parent.info.status == "FINISHED" and pg_parent.data.metrics["sweep_jobs"] == JOBS
    summary = Path(client.download_artifacts(pg_parent.info.run_id, "sweep/summary.md", str(tmp_path))).read_text()
    assert all(r.info.run_id in summary for r in pg_jobs)
    assert records(pg_jobs) == records(lite_jobs)  # same params, same metric values, to the last bit
    # artifacts went through the server (mlflow-artifacts:), not to a shared disk
    assert pg_jobs[0].info.artifact_uri.startswith("mlflow-artifacts:")
    log_text = Path(client.download_artifacts(pg_jobs[0].info.run_id, "logs/run.log", str(tmp_path / "a"))).read_text()
    assert "ends FINISHED" in log_text
    print(f"\n{JOBS} jobs at once: PostgreSQL server {pg_wall:.1f} s wall, {durations(pg_jobs)}; "
          f"sqlite file {lite_wall:.1f} s wall, {durations(lite_jobs)}")


def test_a_password_in_the_uri_is_masked_everywhere(server, tmp_path, csv_path):
    """The URI with a password (here in an http URI the server ignores) reaches no param, tag or artifact."""
    secret_uri = server.uri.replace("http://", "http://alice:hunter2@")
    done, _ = tamrun_sweep(tmp_path, {"MLFLOW_TRACKING_URI": secret_uri},
                           [*csv_overrides(csv_path), *SWEEP[1:], "model.effects.sx.k=6", "tracking=server",
                            "tracking.experiment=masked"])
    assert done.returncode == 0, done.stderr[-5000:]
    assert "hunter2" not in done.stdout + done.stderr
    assert "hunter2" not in (tmp_path / "sweep" / "tamrun_sweep.json").read_text()
    client = MlflowClient(tracking_uri=server.uri)
    jobs, parents = job_runs(client, "masked")
    for run in jobs + parents:
        assert "hunter2" not in repr(run.data.params) + repr(run.data.tags)
        for name in ("config/resolved.yaml", "config/overrides.txt", "logs/run.log"):
            if any(a.path == name for a in client.list_artifacts(run.info.run_id, str(Path(name).parent))):
                text = Path(client.download_artifacts(run.info.run_id, name, str(tmp_path / run.info.run_id))).read_text()
                assert "hunter2" not in text, name


def wait_finished(uri: str, experiment: str, count: int, timeout: float) -> None:
    """Wait until ``count`` job runs of ``experiment`` are FINISHED on the server at ``uri``."""
    client, deadline = MlflowClient(tracking_uri=uri), time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sum(r.info.status == "FINISHED" for r in job_runs(client, experiment)[0]) >= count:
                return
        except Exception:  # the experiment may not exist yet
            pass
        time.sleep(0.5)
    raise AssertionError(f"no {count} FINISHED run(s) in {timeout} s")


def test_a_server_killed_mid_sweep_fails_the_jobs_cleanly(postgres, tmp_path, csv_path):
    """Four jobs one after the other; the server is SIGKILLed once the first run is FINISHED. The sweep
    exits 2 with a message naming tracking.uri; on the server's return a new sweep writes what the first
    one held: every job has a run, FINISHED and complete or FAILED, none stays RUNNING."""
    down = MlflowServer(postgres, tmp_path / "artifacts", tmp_path / "server.log").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_"))}
    env.update(MLFLOW_TRACKING_URI=down.uri, MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_TIMEOUT="10",
               XDG_STATE_HOME=str(tmp_path / "state"))  # the spool of held sweeps (tracking.held_dir)
    sweep = subprocess.Popen([sys.executable, "-m", "tamrun", "-m", *csv_overrides(csv_path), *SWEEP[1:],
                              "model.effects.sx.k=6,7,8,9", "tracking=server", "tracking.experiment=down",
                              f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = kill_server_when(down, sweep, lambda: wait_finished(down.uri, "down", 1, 300))
    assert sweep.returncode == 2, output[-5000:]
    assert f"tracking.uri='{down.uri}'" in output and "tracking.connect_timeout_s" in output, output[-5000:]

    back = MlflowServer(postgres, tmp_path / "artifacts", tmp_path / "server.log")
    back.port, back.uri = down.port, down.uri
    back.start()
    try:
        done, _ = tamrun_sweep(tmp_path / "again", {"MLFLOW_TRACKING_URI": back.uri,
                                                    "XDG_STATE_HOME": str(tmp_path / "state")},
                               [*csv_overrides(csv_path), *SWEEP[1:], "model.effects.sx.k=10", "tracking=server",
                                "tracking.experiment=down"])
        assert done.returncode == 0, done.stderr[-5000:]
        jobs, parents = job_runs(MlflowClient(tracking_uri=back.uri), "down")
    finally:
        back.stop()
    assert "RUNNING" not in {r.info.status for r in jobs + parents}, [(r.info.run_name, r.info.status) for r in jobs]
    first = json.loads((tmp_path / "sweep" / "tamrun_sweep.json").read_text())["sweep_id"]
    assert sorted(r.data.tags["sweep_job"] for r in jobs if r.data.tags["sweep_id"] == first) == ["0", "1", "2", "3"]
    for run in jobs:
        if run.info.status == "FINISHED":  # complete: its config, metrics and log all written
            assert run.data.params["model.effects.sx.k"] and "rmse_test" in run.data.metrics
    # a run the kill cut off before its params were written has none: str() keeps the list sortable
    print("\nafter the server's return:",
          sorted((str(r.data.params.get("model.effects.sx.k")), r.info.status) for r in jobs))


def test_a_server_killed_during_a_run_ends_the_job_with_one_message(postgres, tmp_path, csv_path):
    """The server is SIGKILLed as soon as the job's run exists (during its fit): exit 2, one message
    naming tracking.uri and the run, no traceback; back up, the next run on this host closes it KILLED."""
    down = MlflowServer(postgres, tmp_path / "artifacts", tmp_path / "server.log").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_"))}
    env.update(MLFLOW_TRACKING_URI=down.uri, MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
    job = subprocess.Popen([sys.executable, "-m", "tamrun", *csv_overrides(csv_path), *SWEEP[1:], "model.effects.sx.k=6",
                            "tracking=server", "tracking.experiment=mid"], cwd=tmp_path, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = MlflowClient(tracking_uri=down.uri)
    output = kill_server_when(down, job, lambda: _poll(lambda: _quiet(lambda: job_runs(client, "mid")[0]), 300))
    assert job.returncode == 2, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    assert f"tamrun: config error: tracking.uri='{down.uri}': the store stopped answering during run" in output

    back = MlflowServer(postgres, tmp_path / "artifacts", tmp_path / "server.log")
    back.port, back.uri = down.port, down.uri
    back.start()
    try:
        env["MLFLOW_TRACKING_URI"] = back.uri
        again = subprocess.run([sys.executable, "-m", "tamrun", *csv_overrides(csv_path), *SWEEP[1:],
                                "tracking=server", "tracking.experiment=mid"], cwd=tmp_path, env=env, text=True,
                               capture_output=True, timeout=300)
        assert again.returncode == 0, again.stderr[-5000:]
        statuses = sorted(r.info.status for r in job_runs(MlflowClient(tracking_uri=back.uri), "mid")[0])
    finally:
        back.stop()
    assert statuses == ["FINISHED", "KILLED"], statuses


def kill_server_when(server: MlflowServer, process: subprocess.Popen, ready) -> str:
    """Call ``ready()`` (it waits), SIGKILL ``server``, and return ``process``'s output once it ends
    (the process and the server are stopped whatever happens)."""
    try:
        ready()
        server.stop(signal.SIGKILL)
        return process.communicate(timeout=300)[0]
    finally:
        process.kill()
        server.stop()


def _poll(probe, timeout: float) -> None:
    """Wait until ``probe()`` is truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not probe():
        time.sleep(0.1)


def _quiet(probe):
    """``probe()``, or None where it raises (the experiment not created yet)."""
    try:
        return probe()
    except Exception:
        return None
