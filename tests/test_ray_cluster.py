"""hydra/launcher=ray_cluster end to end: a real local Ray cluster (a head node and a worker node,
separate `ray start` processes on 127.0.0.1) runs a 4-job sweep that records into a real `mlflow
server` (artifacts served by the server) whose backend is a sqlite file or a real PostgreSQL database
(tests/servers.py; that case skips without PostgreSQL's binaries or driver). Slow (a minute or more on
2 cores); skipped without ray (pip install 'tamrun[ray]')."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import psutil
import pytest
from mlflow.tracking import MlflowClient

from local_cluster import ray_cluster, wait_until
from servers import mlflow_server, postgres_database
from test_cli import tamrun
from tamrun.tracking.sweep_record.sweep_files import SWEEP_FILE
from test_sweeps import sweep_args, sweep_runs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray: pip install 'tamrun[ray]'"),
]


def ray_args(csv_path: Path, uri: str, sweep_dir: Path, address: str) -> list:
    """The sweep's arguments on the cluster at ``address``: one CPU per job, and no hw.threads, so
    that the job's threads follow ray.remote.num_cpus."""
    args = [a for a in sweep_args(csv_path, uri, sweep_dir) if a != "hw.threads=1"]
    return ["-m", "hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address={address}",
            "hydra.launcher.ray.remote.num_cpus=1", *args, "tracking.log_plots=false", "progress=off"]


@contextlib.contextmanager
def database(backend: str):
    """The server's backend store: None (a sqlite file of the server's) or a PostgreSQL database's URI."""
    if backend == "sqlite":
        yield None
    else:
        with postgres_database() as uri:
            yield uri


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_sweep_on_a_local_ray_cluster_records_every_job_in_the_server(tmp_path, csv_path, monkeypatch, backend):
    """4 jobs, 1 CPU each, on 2 nodes of 1 CPU: 4 FINISHED runs under one parent in the server (over
    ``backend``), each run in a Ray task with 1 thread, its model loadable from the server and predicting
    on raw rows."""
    started = time.monotonic()
    with database(backend) as db, mlflow_server(tmp_path / "server", db) as uri, ray_cluster() as cluster:
        sweep_dir = tmp_path / "sweep"
        done = tamrun(*ray_args(csv_path, uri, sweep_dir, cluster["address"]), "model.effects.sx.k=6,8,10,12",
                      cwd=tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "Ray cluster launcher: 4 job(s)" in output
        client, parent, children = sweep_runs(uri, sweep_dir)
        assert [r.info.status for r in children] == ["FINISHED"] * 4 and parent.info.status == "FINISHED"
        assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
        assert [r.info.run_name for r in children] == ["k=6", "k=8", "k=10", "k=12"]
        summary = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/summary.csv", str(tmp_path)))
        assert summary["status"].tolist() == ["FINISHED"] * 4
        assert summary["run_id"].tolist() == [r.info.run_id for r in children]
        for run in children:  # each job a Ray task holding the one CPU it asked for, on as many threads
            tags = run.data.tags
            assert json.loads(tags["ray.resources"]) == {"CPU": 1.0}, tags
            assert tags["threads"] == "1" and "RayClusterLauncher ray.remote.num_cpus=1" in tags["threads_reason"], tags
        # the head is busy with one job: Ray spills the next to the worker node
        assert len({r.data.tags["ray.node_id"] for r in children}) == 2

        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what models:/ URIs resolve against
        rows = pd.read_csv(csv_path).tail(48)  # raw rows, as the user has them (dates as text)
        for run in children:
            (model,) = client.search_logged_models([run.info.experiment_id],
                                                   filter_string=f"source_run_id = '{run.info.run_id}'")
            predicted = mlflow.pyfunc.load_model(f"models:/{model.model_id}").predict(rows)
            assert len(predicted) == len(rows) and predicted["predicted"].notna().all()
    print(f"ray sweep test ({backend}): {time.monotonic() - started:.0f} s")


# A CG fit with a tolerance far below float64's reach (tests/test_faults.py): the job with it runs for
# seconds, long enough to be killed mid-run; the others stop at 1e-8.
ENDLESS = ["solver=cg", "solver.preconditioner=jacobi", "solver.max_iter=100000000"]


def running_run_of_job(uri: str, sweep_dir: Path, job: int):
    """The RUNNING run of sweep job ``job``, once the sweep file and the run exist; else None."""
    try:
        info = json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return None
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [info["experiment_id"]], filter_string=f"tags.sweep_id = '{info['sweep_id']}' and tags.sweep_job = '{job}'")
    return next((r for r in runs if r.info.status == "RUNNING"), None)


def kill_ray_worker(pid: int, cluster: dict) -> None:
    """SIGKILL to ``pid``, after checking that it is a Ray worker of this test's cluster (a descendant
    of its `ray start` processes), never anything else."""
    ours = {p.pid for root in cluster["pids"] for p in psutil.Process(root).children(recursive=True)}
    assert pid in ours, f"pid {pid} is not a process of this test's Ray cluster"
    os.kill(pid, signal.SIGKILL)


def test_a_ray_worker_killed_mid_job_ends_its_run_killed_and_the_others_finish(tmp_path, csv_path):
    """Job 1 of 4 has its Ray worker SIGKILLed mid-run: its run ends KILLED with the launcher's reason
    (tamrun.lost_reason), jobs 0, 2 and 3 finish, the parent's summary names job 1 and the command exits 2."""
    started = time.monotonic()
    with mlflow_server(tmp_path / "server") as uri, ray_cluster() as cluster:
        sweep_dir = tmp_path / "sweep"
        command = [sys.executable, "-m", "tamrun", *ray_args(csv_path, uri, sweep_dir, cluster["address"]),
                   *ENDLESS, "solver.tol=1e-8,1e-300,1e-8,1e-8", "tracking.log_model=false"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
        sweep = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        try:
            wait_until(lambda: running_run_of_job(uri, sweep_dir, 1) is not None, "job 1's run RUNNING", 240)
            victim = running_run_of_job(uri, sweep_dir, 1)
            kill_ray_worker(int(victim.data.tags["tamrun.pid"]), cluster)
            output, _ = sweep.communicate(timeout=300)
        finally:
            if sweep.poll() is None:
                sweep.kill()
        assert sweep.returncode == 2, output
        # KILLED by the launcher (error_kind lost) or, first, by another job's stale-run check
        assert re.search(r"1 of 4 sweep job\(s\) did not finish \(job 1: KILLED( \(lost\))?\)", output), output
        client, parent, children = sweep_runs(uri, sweep_dir)
        assert [r.info.status for r in children] == ["FINISHED", "KILLED", "FINISHED", "FINISHED"]
        assert children[1].info.run_id == victim.info.run_id
        # the launcher's reason has a tag of its own: another job starting on this host may close the run
        # first by its stale-run check (a race its killed_reason once lost in a fresh clone's run)
        assert "its Ray task was lost" in children[1].data.tags["tamrun.lost_reason"]
        assert children[1].data.tags["tamrun.killed_reason"].startswith(("its Ray task was lost", "its process (pid"))
        assert parent.info.status == "FAILED" and parent.data.tags["sweep_failed_jobs"] == "1 of 4 (job(s) 1)"
        summary = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/summary.csv", str(tmp_path)))
        assert summary["status"].tolist() == ["FINISHED", "KILLED", "FINISHED", "FINISHED"]
    print(f"ray worker-killed test: {time.monotonic() - started:.0f} s")
