"""The team's tracking server locked (issue 50; docs/scale.md): MLflow's basic-auth app behind uvicorn's TLS
(a self-signed certificate), started here on 127.0.0.1 (tests/servers.py `locked_server`): an admin whose
password was changed, a user who may EDIT the team experiment and one who may only READ it, a new user
allowed nothing.

- each refused caller of ``python -m tamrun`` (no credentials, a wrong password, the READ user running a
  job, a client that does not trust the certificate): exit 2, one ``tamrun:`` line naming the setting and
  the fix, no traceback, no password shown, no run written;
- a sweep by the EDIT user on the 2-node Ray cluster (tests/local_cluster.py): every job FINISHED, the
  credentials reached the workers, and the password is in no output, param, tag, file of the sweep
  folder nor Ray log;
- ``python -m tamrun.compare`` by the READ user shows that sweep; the READ user reads its summary.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from local_cluster import nodes_alive, ray_cluster
from servers import (ADMIN, ADMIN_PASSWORD, TEAM_EXPERIMENT, USERS, client_env, credentials, locked_server,
                     self_signed_certificate)
from test_team_cluster import FAST, HTTP, environment, ray_sweep, sweep_runs, tamrun

pytestmark = pytest.mark.slow
WRITER, READER = "writer", "reader"
WRONG_PASSWORD = "not-the-writer-s-password"
EVERY_PASSWORD = [*USERS.values(), ADMIN_PASSWORD, WRONG_PASSWORD]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator:
    with locked_server(tmp_path_factory.mktemp("locked")) as running:
        yield running


def caller_env(server, user=None, password=None, certificate="server", **extra: str) -> Dict[str, str]:
    """A clean environment for a caller of ``server`` as ``user`` trusting ``certificate`` (the server's by
    default), HTTP retries off."""
    trusted = server.certificate if certificate == "server" else certificate
    return environment(MLFLOW_TRACKING_URI=server.uri, **credentials(user, password, trusted), **HTTP, **extra)


def team_runs(server) -> list:
    """Every run of the team experiment, as the admin sees them."""
    with client_env(credentials(ADMIN, ADMIN_PASSWORD, server.certificate)):
        client = MlflowClient(tracking_uri=server.uri)
        return client.search_runs([client.get_experiment_by_name(TEAM_EXPERIMENT).experiment_id])


def no_password_in(text: str) -> None:
    for password in EVERY_PASSWORD:
        assert password not in text, f"a password shows in: {text[-2000:]}"


# (case, user, password, the certificate trusted, the start of the last line)
REFUSED = [
    ("no-credentials", None, None, "server",
     "tamrun: config error: MLFLOW_TRACKING_USERNAME='': the tracking server 127.0.0.1:{port} asks for credentials "
     "(HTTP 401) and none are given. Fix: export MLFLOW_TRACKING_USERNAME=<user> and MLFLOW_TRACKING_PASSWORD="),
    ("wrong-password", WRITER, WRONG_PASSWORD, "server",
     "tamrun: config error: MLFLOW_TRACKING_PASSWORD='***': the tracking server 127.0.0.1:{port} refused the "
     "credentials of user 'writer' (HTTP 401: an unknown user or a wrong password). Fix: check "),
    ("read-user-runs-a-job", READER, USERS[READER], "server",
     "tamrun: config error: MLFLOW_TRACKING_USERNAME='reader': the tracking server 127.0.0.1:{port} refused user "
     "'reader' a write in experiment 'team' (HTTP 403: it needs EDIT on the experiment; this user has READ or no "
     "permission there). Fix: ask the server's admin for EDIT on experiment 'team'"),
    ("certificate-not-trusted", WRITER, USERS[WRITER], None,
     "tamrun: config error: tracking.uri='https://127.0.0.1:{port}': the tracking server 127.0.0.1:{port} "
     "presents a certificate this client does not trust (self-signed certificate); MLFLOW_TRACKING_SERVER_CERT_PATH "
     "is unset. Fix: export MLFLOW_TRACKING_SERVER_CERT_PATH="),
    ("another-certificate", WRITER, USERS[WRITER], "other",
     "tamrun: config error: MLFLOW_TRACKING_SERVER_CERT_PATH='{other}': the tracking server 127.0.0.1:{port} "
     "presents a certificate this client does not trust (self-signed certificate): it is not signed by this file's "
     "certificates. Fix: export MLFLOW_TRACKING_SERVER_CERT_PATH="),
]


@pytest.mark.parametrize("case, user, password, certificate, line", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_refused_caller_gets_one_line_and_no_run(server, tmp_path, csv_path, case, user, password, certificate,
                                                   line):
    other = self_signed_certificate(tmp_path) if certificate == "other" else None
    env = caller_env(server, user, password, other if certificate == "other" else certificate)
    before = len(team_runs(server))
    done = tamrun([*csv_overrides(csv_path), *FAST, "tracking=server", f"tracking.experiment={TEAM_EXPERIMENT}"],
                  tmp_path / "job", env)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-4000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(line.format(port=server.port, other=other)), last
    assert [row for row in output.splitlines() if row.startswith("tamrun:")] == [last], output[-4000:]
    assert "Traceback" not in output
    no_password_in(output)
    assert len(team_runs(server)) == before  # nothing written: the run was refused its creation


@pytest.fixture(scope="module")
def writer_sweep(server, tmp_path_factory):
    """Two jobs by the EDIT user as Ray tasks on a 2-node cluster into the team experiment; (the command's
    result, its sweep folder, the cluster's Ray folder's text, the cluster's node count)."""
    top = tmp_path_factory.mktemp("sweep")
    frame = top / "synthetic.csv"
    from conftest import synthetic_frame

    synthetic_frame().to_csv(frame, index=False)
    with ray_cluster() as cluster:
        nodes = nodes_alive(cluster["address"], environment())
        done = tamrun(ray_sweep(cluster["address"], top / "sweep", *csv_overrides(frame), *FAST, "tracking=server",
                                f"tracking.experiment={TEAM_EXPERIMENT}", "model.effects.sx.k=6,8"),
                      top, caller_env(server, WRITER, USERS[WRITER]))
        ray_logs = "\n".join(path.read_bytes().decode("utf-8", "replace") for path in Path(cluster["temp_dir"]).rglob("*")
                             if path.is_file() and not path.is_socket())
    return done, top / "sweep", ray_logs, nodes


def test_a_sweep_by_the_edit_user_on_the_ray_cluster_keeps_the_password_to_itself(server, writer_sweep):
    done, sweep_dir, ray_logs, nodes = writer_sweep
    assert nodes == 2
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    with client_env(credentials(READER, USERS[READER], server.certificate)):  # the READ user sees it all
        _, parent, jobs = sweep_runs(server.uri, sweep_dir)
    assert [r.info.status for r in jobs] == ["FINISHED", "FINISHED"] and parent.info.status == "FINISHED"
    for run in jobs:
        handed = run.data.tags["ray.env"].split(", ")
        assert {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_SERVER_CERT_PATH"} <= set(handed)
        assert "MLFLOW_TRACKING_PASSWORD" in handed or "***" in handed, handed  # its name, as an argument's
        no_password_in(repr(run.data.params) + repr(run.data.tags))
    no_password_in(done.stdout + done.stderr)
    no_password_in(ray_logs)
    no_password_in("\n".join(path.read_text(errors="replace") for path in sweep_dir.rglob("*") if path.is_file()))


def test_the_read_user_compares_the_sweep_and_reads_its_summary(server, writer_sweep, tmp_path):
    _, sweep_dir, _, _ = writer_sweep
    env = caller_env(server, READER, USERS[READER])
    done = subprocess.run([sys.executable, "-m", "tamrun.compare", "--experiment", TEAM_EXPERIMENT, "--sweep", "last"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with client_env(credentials(READER, USERS[READER], server.certificate)):
        _, parent, jobs = sweep_runs(server.uri, sweep_dir)
        summary = MlflowClient(tracking_uri=server.uri).download_artifacts(parent.info.run_id, "sweep/summary.md",
                                                                           str(tmp_path))
    assert all(run.info.run_name in done.stdout for run in jobs), done.stdout
    assert f"the jobs of sweep {parent.data.tags['sweep_id']}" in done.stdout
    assert all(run.info.run_id in Path(summary).read_text() for run in jobs)
    no_password_in(done.stdout + done.stderr)
