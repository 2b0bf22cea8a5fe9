"""A team's tracking server and Ray cluster when things go wrong (issue 39's table), each case with real
servers started here on 127.0.0.1: a throw-away PostgreSQL, `mlflow server` on it (artifacts served), a
2-node local Ray cluster (tests/servers.py, tests/local_cluster.py), one of each for the module.

- a job's request that no node can hold (CPUs, GPUs, memory): exit 2 before any job starts, naming the
  request and what the nodes have; no parent run;
- `tracking=server` on the Ray launcher: the shell's tracking variables (the URI, credentials) reach the
  workers (their names in each run's `ray.env`, no password anywhere); a runtime environment that would
  send the jobs elsewhere is refused up front;
- a job's error crosses Ray whole: every tamrun exception through a real Ray task, and a sweep whose jobs
  fail in Hydra's own code on the workers (a FAILED run each, the error named, exit 2);
- the tracking server killed by process group mid-sweep: every job accounted for, whether the server is
  back before the sweep's end (the held jobs written by the sweep itself) or only after it (the end held
  too, the last line naming where, the next run on that store writing it all); exit 2 either way;
- two sweeps at once in one folder: their own parents, summaries and exit codes;
- `ray start --node-ip-address=127.0.0.1`: the node's address is the host's interface's (docs/scale.md).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import RAY_TEST_ENV, csv_overrides
from local_cluster import ray_cluster, wait_until
from job_gate import FOLDER_ENV, GATE, RUN, open_gate
from servers import MlflowServer, postgres_database
from tamrun.tracking.sweep_record.sweep_files import SWEEP_FILE

pytestmark = pytest.mark.slow
FAST = ["tracking.log_plots=false", "tracking.log_model=false", "progress=off", "hw.threads=1"]
# MLflow's HTTP client retries a refused request for minutes by default: once, here
HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a throw-away PostgreSQL (tracking only), restartable on its port and database."""
    folder = tmp_path_factory.mktemp("server")
    with postgres_database() as database:
        running = MlflowServer(database, folder / "artifacts", folder / "server.log").start()
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster() as started:
        yield started


def environment(**extra: str) -> Dict[str, str]:
    """This process's environment without Hydra's, tamrun's and MLflow's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_", "RAY_"))}
    env.update(RAY_TEST_ENV)  # tests/conftest.py: no token of Ray's in the home folder
    return {**env, **extra}


def tamrun(args: List[str], cwd: Path, env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "tamrun", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def ray_sweep(address: str, sweep_dir: Path, *args: str) -> List[str]:
    return ["-m", "hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address={address}",
            "hydra.launcher.ray.remote.num_cpus=1", f"hydra.sweep.dir={sweep_dir}", *args]


def sweep_runs(uri: str, sweep_dir: Path, info: Dict = None):
    """(sweep file, parent run, job runs by job number) of the sweep recorded in ``sweep_dir``."""
    info = info or json.loads((sweep_dir / SWEEP_FILE).read_text())
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([info["experiment_id"]], filter_string=f"tags.sweep_id = '{info['sweep_id']}'")
    parent = next(r for r in runs if r.info.run_id == info["parent_run_id"])
    jobs = sorted((r for r in runs if r.info.run_id != info["parent_run_id"]), key=lambda r: int(r.data.tags["sweep_job"]))
    return info, parent, jobs


def experiment_runs(uri: str, experiment: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


# --- impossible resources -------------------------------------------------------------------------------

IMPOSSIBLE = [
    ("hydra.launcher.ray.remote.num_cpus=4", "hydra.launcher.ray.remote.num_cpus=4", "{'CPU': 4.0}",
     "CPU 1, 1 (2 in all)", "ask for at most 1 CPU per job, or start a node with 4 CPU (ray start --num-cpus=4)"),
    ("hydra.launcher.ray.remote.num_gpus=1", "hydra.launcher.ray.remote.num_gpus=1", "{'CPU': 1.0, 'GPU': 1.0}",
     "GPU 0, 0 (0 in all)", "ask for at most 0 GPU per job, or start a node with 1 GPU (ray start --num-gpus=1)"),
    ("+hydra.launcher.ray.remote.memory=1000000000000000", "hydra.launcher.ray.remote.memory=1000000000000000",
     "'memory': 1000000000000000.0}", "memory ", "(ray start --memory=1000000000000000)"),
]


@pytest.mark.parametrize("asked, field, request_text, nodes_text, fix", IMPOSSIBLE, ids=["cpus", "gpus", "memory"])
def test_a_request_no_node_can_hold_is_refused_before_any_job(server, cluster, tmp_path, csv_path, asked, field,
                                                              request_text, nodes_text, fix):
    """The page's num_cpus=4 on nodes of 1 CPU hung silently (Ray's autoscaler repeating "No available node
    types can fulfill resource request" every 35 s): now exit 2 at once, no parent run, no job folder."""
    experiment = f"impossible-{tmp_path.name}"
    done = tamrun(ray_sweep(cluster["address"], tmp_path / "sweep", *csv_overrides(csv_path), *FAST, asked,
                            "tracking=server", f"tracking.experiment={experiment}", "model.effects.sx.k=6,8"),
                  tmp_path, environment(MLFLOW_TRACKING_URI=server.uri))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tamrun: config error: {field}: no node of the Ray cluster at {cluster['address']} "
                           f"can hold a job's request "), last
    assert request_text in last and "(Ray would wait for one forever): its 2 node(s): " in last, last
    assert nodes_text in last and fix in last, last
    assert "Traceback" not in done.stderr and "Hydra refused" not in done.stderr
    assert experiment_runs(server.uri, experiment) == []  # refused before the parent run
    assert not (tmp_path / "sweep" / "0").exists()


# --- the environment travels ----------------------------------------------------------------------------

def test_the_shell_s_tracking_variables_reach_the_ray_workers(server, cluster, tmp_path, csv_path):
    """tracking=server with MLFLOW_TRACKING_URI (and credentials) exported, as docs/scale.md says: every job
    records into the server under the sweep's parent; the workers got the variables (their names in the
    run's ray.env tag), and the password is nowhere in the store or the output."""
    env = environment(MLFLOW_TRACKING_URI=server.uri, MLFLOW_TRACKING_USERNAME="alice",
                      MLFLOW_TRACKING_PASSWORD="hunter2")
    sweep_dir = tmp_path / "sweep"
    done = tamrun(ray_sweep(cluster["address"], sweep_dir, *csv_overrides(csv_path), *FAST, "tracking=server",
                            "tracking.experiment=travels", "model.effects.sx.k=6,8"), tmp_path, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "hunter2" not in done.stdout + done.stderr
    info, parent, jobs = sweep_runs(server.uri, sweep_dir)
    assert [r.info.status for r in jobs] == ["FINISHED", "FINISHED"] and parent.info.status == "FINISHED"
    for run in jobs:
        handed = run.data.tags["ray.env"].split(", ")
        # the password travels as the task's argument (tamrun/cluster/env.py split_secrets), its name listed with
        # the others; the tag's redaction masks it (a secret variable's name followed by more text)
        assert {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "TAMRUN_RUN_TAG", "TAMRUN_SWEEP_ID"} <= set(handed)
        assert len(handed) == 6 and ("MLFLOW_TRACKING_PASSWORD" in handed or "***" in handed), handed
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert "hunter2" not in repr(run.data.params) + repr(run.data.tags)


def test_a_runtime_environment_that_would_send_the_jobs_elsewhere_is_refused_up_front(server, cluster, tmp_path,
                                                                                     csv_path):
    done = tamrun(ray_sweep(cluster["address"], tmp_path / "sweep", *csv_overrides(csv_path), *FAST, "tracking=server",
                            "tracking.experiment=elsewhere", "model.effects.sx.k=6,8",
                            "+hydra.launcher.ray.remote.runtime_env={env_vars: {MLFLOW_TRACKING_URI: 'http://127.0.0.1:9'}}"),
                  tmp_path, environment(MLFLOW_TRACKING_URI=server.uri))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "tamrun: config error: hydra.launcher.ray.remote.runtime_env.env_vars.MLFLOW_TRACKING_URI='http://127.0.0.1:9': "
        f"the launching shell has MLFLOW_TRACKING_URI='{server.uri}', with which the sweep's parent run is recorded: "
        "the jobs would record elsewhere (tamrun hands every job the shell's tracking variables). Fix: remove "
        "MLFLOW_TRACKING_URI from hydra.launcher.ray.remote.runtime_env, or export MLFLOW_TRACKING_URI with that value "
        "before launching")
    assert experiment_runs(server.uri, "elsewhere") == []


# --- a job's error crosses Ray whole --------------------------------------------------------------------

EVERY_ERROR = """
import sys, ray
from tamrun.errors import ConfigError, DataError, DeviceError, FilesystemError, MemoryBudgetError, NumericalError
from tamrun.machine.tracker import BudgetExceeded
from tamrun.machine.placement import PlacementError

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
errors = [kind("model.effects.toy.m", -2, "must be at least 1", "set model.effects.toy.m=8")
          for kind in (ConfigError, DataError, DeviceError, FilesystemError, MemoryBudgetError, NumericalError)]
errors += [BudgetExceeded("chunk of 2 GiB exceeds the budget"), PlacementError("mixed devices")]
errors[0].run_id = "0123abcd"

@ray.remote(num_cpus=1)
def raise_it(error):
    raise error

for error in errors:
    try:
        ray.get(raise_it.remote(error))
    except ray.exceptions.RayTaskError as crossed:
        cause = crossed.cause
        assert type(cause) is type(error) and str(cause) == str(error), (type(cause), str(cause), str(error))
        assert getattr(cause, "run_id", None) == getattr(error, "run_id", None)
        print("crossed", type(error).__name__)
"""


def test_every_tamrun_error_crosses_a_ray_task_whole(cluster, tmp_path):
    """Each tamrun exception a job can raise, raised in a Ray task on the cluster, comes back to the driver
    as itself (type, message, the run it ended); `Terminated`, a KeyboardInterrupt, Ray takes for a
    cancellation: it pickles whole too (tests/test_internal_errors.py)."""
    done = subprocess.run([sys.executable, "-c", EVERY_ERROR, cluster["address"]], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert done.stdout.count("crossed ") == 8, done.stdout


def test_a_job_that_fails_on_its_worker_before_tamrun_runs_is_named_and_recorded(server, cluster, tmp_path, csv_path):
    """The jobs' Hydra folders cannot be created on the workers (a subfolder of a file): Hydra's own
    run_job raises there, before any tamrun code; the error crosses Ray, each job gets a FAILED run with
    it (a filesystem error naming hydra.sweep.dir) and the sweep exits 2 naming both jobs."""
    sweep_dir = tmp_path / "sweep"
    done = tamrun(ray_sweep(cluster["address"], sweep_dir, *csv_overrides(csv_path), *FAST, "tracking=server",
                            "tracking.experiment=crossing", "model.effects.sx.k=6,8",
                            f"hydra.sweep.subdir={SWEEP_FILE}/${{hydra.job.num}}"),
                  tmp_path, environment(MLFLOW_TRACKING_URI=server.uri))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-5000:]
    assert done.stderr.strip().splitlines()[-1].startswith(
        "tamrun: 2 of 2 sweep job(s) did not finish (job 0: filesystem error FilesystemError; job 1: filesystem error "
        "FilesystemError); summary in run "), done.stderr[-3000:]
    assert f"tamrun: filesystem error: {sweep_dir / SWEEP_FILE / '0'}: cannot be created" in done.stdout + done.stderr
    _, parent, jobs = sweep_runs(server.uri, sweep_dir)
    assert [r.info.status for r in jobs] == ["FAILED", "FAILED"] and parent.info.status == "FAILED"
    assert {r.data.tags["error_kind"] for r in jobs} == {"filesystem"}
    assert "hydra.sweep.dir" in jobs[0].data.tags["error"]


# --- the server killed mid-sweep ------------------------------------------------------------------------

def start_sweep(tmp_path: Path, csv_path: Path, server: MlflowServer, experiment: str, jobs: int) -> subprocess.Popen:
    """``jobs`` jobs one after the other (the basic launcher) into the server, runs held in tmp_path/held,
    each job starting when the test opens its gate (tests/job_gate.py)."""
    env = environment(MLFLOW_TRACKING_URI=server.uri, PYTHONPATH=str(Path(__file__).parent),
                      **{FOLDER_ENV: str(tmp_path / "gate")}, **HTTP)
    ks = ",".join(str(6 + 2 * i) for i in range(jobs))
    return subprocess.Popen([sys.executable, "-c", RUN, "-m", *csv_overrides(csv_path), *FAST, "tracking=server",
                             f"tracking.experiment={experiment}", f"tracking.held_dir={tmp_path / 'held'}",
                             f"model.effects.sx.k={ks}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                             f"+hydra.callbacks.gate._target_={GATE}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(uri: str, sweep_dir: Path, job: int) -> bool:
    """Whether job ``job`` of the sweep in ``sweep_dir`` has a FINISHED run."""
    try:
        info = json.loads((sweep_dir / SWEEP_FILE).read_text())
        runs = MlflowClient(tracking_uri=uri).search_runs(
            [info["experiment_id"]], filter_string=f"tags.sweep_id = '{info['sweep_id']}' and tags.sweep_job = '{job}'")
    except Exception:  # the sweep file or the run not there yet
        return False
    return any(r.info.status == "FINISHED" for r in runs)


def held_records(sweep_dir: Path) -> List[Path]:
    return sorted(sweep_dir.glob("tamrun_sweep-*/held/job-*.json"))


def sweep_with_server_killed(server: MlflowServer, tmp_path: Path, csv_path: Path, experiment: str, total: int,
                             back_at: Optional[int]) -> Tuple[str, Dict]:
    """A sweep of ``total`` jobs one after the other; the server's whole process group SIGKILLed once job 0 is
    FINISHED, then started again (its port and database) once job ``back_at`` is held (None: after the
    sweep). The sweep's exit code must be 2; returns (its stderr, its sweep file)."""
    sweep = start_sweep(tmp_path, csv_path, server, experiment, total)
    try:
        open_gate(tmp_path / "gate", 0)
        wait_until(lambda: finished(server.uri, tmp_path / "sweep", 0) or sweep.poll() is not None, "job 0 FINISHED",
                   240)
        server.stop(signal.SIGKILL)
        for job in range(1, total):
            open_gate(tmp_path / "gate", job)
            if job == back_at:
                wait_until(lambda: held_records(tmp_path / "sweep") or sweep.poll() is not None, "a job held", 240)
                server.start()
        out, err = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
        if server.process is None:
            server.start()
    assert sweep.returncode == 2, out[-3000:] + err[-5000:]
    return err, json.loads((tmp_path / "sweep" / SWEEP_FILE).read_text())


def assert_every_job_accounted_for(uri: str, sweep_dir: Path, info: Dict, total: int, held: List[int]) -> None:
    """Every job of the sweep has a run: the ``held`` ones FAILED, written from their held record with the
    store's refusal as their error, the others FINISHED; the parent FAILED naming exactly the held ones."""
    _, parent, jobs = sweep_runs(uri, sweep_dir, info)
    assert [int(r.data.tags["sweep_job"]) for r in jobs] == list(range(total))
    assert [r.info.status for r in jobs] == ["FAILED" if i in held else "FINISHED" for i in range(total)]
    assert [i for i, run in enumerate(jobs) if "tamrun.held" in run.data.tags] == held
    for i in held:
        error = jobs[i].data.tags["error"]
        assert error.startswith(f"tracking.uri='{uri}': the tracking server ") and "does not answer" in error, error
        assert jobs[i].data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert parent.info.status == "FAILED"
    assert parent.data.tags["sweep_failed_jobs"] == f"{len(held)} of {total} (job(s) {', '.join(map(str, held))})"
    summary = MlflowClient(tracking_uri=uri).download_artifacts(parent.info.run_id, "sweep/summary.csv", str(sweep_dir))
    assert pd.read_csv(summary)["job"].tolist() == list(range(total))


def test_a_server_killed_until_the_sweep_ends_leaves_every_job_held_then_written(server, tmp_path, csv_path):
    """The server's process group SIGKILLed once job 0 is FINISHED, back only after the sweep: jobs 1 and 2
    and the sweep's end are held in the sweep's folder (before: no run at all, exit 0, "0 of 2 failed");
    the sweep exits 2 naming them and the folder; the next run on the server writes them all."""
    err, info = sweep_with_server_killed(server, tmp_path, csv_path, "held-end", 3, back_at=None)
    folder = tmp_path / "sweep" / f"tamrun_sweep-{info['sweep_id']}" / "held"
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"tamrun: the store {re.escape(server.uri)} did not answer at the sweep's end \(.+\): 2 of 3 sweep job\(s\) "
        r"held too \(job 1: config error ConfigError; job 2: config error ConfigError\); "
        rf"they and the summary of parent run {info['parent_run_id']} are held in {re.escape(str(folder))}, and the "
        r"next run on that store writes them", last), last
    assert len(held_records(tmp_path / "sweep")) == 2 and (folder / "sweep.json").exists()
    assert len(list((tmp_path / "held").glob("*.json"))) == 1  # listed for the next run on that store

    following = tamrun([*csv_overrides(csv_path), *FAST, "tracking=server", "tracking.experiment=held-end",
                        f"tracking.held_dir={tmp_path / 'held'}"], tmp_path / "next",
                       environment(MLFLOW_TRACKING_URI=server.uri))
    assert following.returncode == 0, following.stderr[-5000:]
    assert_every_job_accounted_for(server.uri, tmp_path / "sweep", info, 3, held=[1, 2])
    assert not folder.exists() and not list((tmp_path / "held").glob("*.json"))
    assert "RUNNING" not in {r.info.status for r in experiment_runs(server.uri, "held-end")}


def test_a_server_killed_mid_sweep_and_restarted_leaves_every_job_accounted_for(server, tmp_path, csv_path):
    """The issue's case: the server's process group SIGKILLed once job 0 is FINISHED, job 1 refused, the
    server restarted, jobs 2 and 3 run. Before: the refused job left no run, the sweep exited 0 and its
    parent said "0 of 3 failed". Now job 1 is held, the sweep writes it once the store answers again, its
    parent and last line name it, and it exits 2."""
    err, info = sweep_with_server_killed(server, tmp_path, csv_path, "restarted", 4, back_at=1)
    assert err.strip().splitlines()[-1] == (f"tamrun: 1 of 4 sweep job(s) did not finish (job 1: config error "
                                            f"ConfigError); summary in run {info['parent_run_id']}")
    assert_every_job_accounted_for(server.uri, tmp_path / "sweep", info, 4, held=[1])
    assert not held_records(tmp_path / "sweep")


# --- two sweeps at once in one folder -------------------------------------------------------------------

def test_two_sweeps_at_once_in_one_folder_keep_their_own_parents(server, tmp_path, csv_path):
    """The same folder (a fixed hydra.sweep.dir, as the page's), started together: each sweep's jobs under
    its own parent, its own summary, its own exit code (one has a bad job: 2; the other 0)."""
    sweep_dir = tmp_path / "sweep"
    env = environment(MLFLOW_TRACKING_URI=server.uri)
    common = [sys.executable, "-m", "tamrun", "-m", *csv_overrides(csv_path), *FAST, "tracking=server",
              "tracking.experiment=twice", f"hydra.sweep.dir={sweep_dir}"]
    commands = {"bad": [*common, "model.intercept_ap=-9,100"], "good": [*common, "model.effects.sx.k=6,8"]}
    started = {name: subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for name, command in commands.items()}
    done = {name: (proc, *proc.communicate(timeout=300)) for name, proc in started.items()}
    ids = {}
    for name, (proc, out, err) in done.items():
        assert proc.returncode == (2 if name == "bad" else 0), out[-3000:] + err[-5000:]
        (ids[name],) = set(re.findall(r"sweep (\w{12}): jobs are recorded under parent run (\w+)", out + err))
    assert ids["bad"] != ids["good"]
    for name, (sweep_id, parent_id) in ids.items():
        info = json.loads((sweep_dir / f"tamrun_sweep-{sweep_id}" / "sweep.json").read_text())
        assert info["parent_run_id"] == parent_id
        _, parent, jobs = sweep_runs(server.uri, sweep_dir, info)
        assert len(jobs) == 2 and {r.data.tags["mlflow.parentRunId"] for r in jobs} == {parent_id}
        swept = "model.intercept_ap" if name == "bad" else "model.effects.sx.k"
        assert all(swept in r.data.tags["sweep_overrides"] for r in jobs)
        assert parent.info.status == ("FAILED" if name == "bad" else "FINISHED")
        assert parent.data.tags["sweep_failed_jobs"] == ("1 of 2 (job(s) 1)" if name == "bad" else "0 of 2")
    _, _, bad_err = done["bad"]
    assert bad_err.strip().splitlines()[-1].endswith(f"summary in run {ids['bad'][1]}")


# --- where Ray says a node is ---------------------------------------------------------------------------

def route_address() -> str:
    """The address of the interface this machine reaches other hosts by (what Ray takes for a node's),
    127.0.0.1 without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 80))  # UDP: no packet is sent
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def test_ray_replaces_a_loopback_node_address_by_the_host_s_own(cluster, tmp_path):
    """tests/local_cluster.py starts both nodes with --node-ip-address=127.0.0.1: Ray records them at the
    host's interface address instead, as docs/scale.md now says (joining by 127.0.0.1 still works)."""
    code = ("import sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR');"
            "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))")
    done = subprocess.run([sys.executable, "-c", code, cluster["address"]], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == repr([route_address()] * 2)
    log = (Path(cluster["temp_dir"]) / "head.log").read_text()
    assert f"Local node IP: {route_address()}" in log, log[-2000:]
