"""The team's tracking server locked (issue 50; docs/scale.md): MLflow's basic-auth app behind uvicorn's TLS
(a self-signed certificate), started here on 127.0.0.1 (tests/servers.py `locked_server`): an admin whose
password was changed, a user who may EDIT the team experiment and one who may only READ it, a new user
allowed nothing.

- each refused caller of ``python -m tamrun`` (no credentials, a wrong password, the READ user running a
  job, a client that does not trust the certificate): exit 2, one ``tamrun:`` line naming the setting and
  the fix, no traceback, no password shown, no run written;
- a sweep by the EDIT user on the 2-node Ray cluster (tests/local_cluster.py): every job FINISHED, the
  parent naming the best one (``best_run``, ``best_job``, its metrics), every run the EDIT user's, the
  credentials reached the workers, and the password is in no output, param, tag, file of the sweep
  folder nor Ray log;
- ``python -m tamrun.compare`` by the READ user shows that sweep; the READ user reads its summary;
- ``--register`` (issue 58): by the READ user refused before the server is asked, onto another user's
  registered model refused naming the model, the user and the EDIT it needs; nothing registered by either;
- a run's user (issue 61) is the tracking account it was made by, not the OS user; on a local store the OS user;
- a host name the server's ``--allowed-hosts`` does not list, a certificate for other names, an expired or
  not yet valid certificate (a TLS endpoint of tests/servers.py presenting it): each named by its cause.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides, log_recorded_model
from local_cluster import nodes_alive, ray_cluster
from servers import (ADMIN, ADMIN_PASSWORD, TEAM_EXPERIMENT, TOKEN_AUTH, USERS, client_env, credentials,
                     dated_certificate, locked_server, self_signed_certificate, tls_listener)
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
                                f"tracking.experiment={TEAM_EXPERIMENT}", "model.effects.sx.k=6,8",
                                "split.validation_start=2020-11-01"),
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
    # issue 61: the parent names the best job on the objective, rmse_validation, and carries its figures;
    # every run's user is the writer's account, on the Ray workers too
    best = min(jobs, key=lambda run: run.data.metrics["rmse_validation"])
    assert parent.data.tags["best_run"] == best.info.run_id and parent.data.tags["best_job"] == best.info.run_name
    assert {name: parent.data.metrics[f"best_{name}"] for name in ("rmse_validation", "rmse_test")} == \
        {name: best.data.metrics[name] for name in ("rmse_validation", "rmse_test")}
    assert {run.info.user_id for run in [parent, *jobs]} == {WRITER}
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


OS_LOGIN = "os-login"  # the OS user of the callers below (getpass reads LOGNAME first)


def test_a_run_s_user_is_the_tracking_account_it_was_made_by(server, tmp_path, csv_path):
    """Issue 61: every run's user was the OS user (``root``), so two users' runs on one server looked the
    same. Made with the writer's credentials, its ``mlflow.user`` tag and user id are the writer's."""
    done = tamrun([*csv_overrides(csv_path), *FAST, "tracking=server", f"tracking.experiment={TEAM_EXPERIMENT}",
                   "tracking.run_name=the-writer-s-run"], tmp_path / "job",
                  caller_env(server, WRITER, USERS[WRITER], LOGNAME=OS_LOGIN))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = [r for r in team_runs(server) if r.info.run_name == "the-writer-s-run"]
    assert run.data.tags["mlflow.user"] == run.info.user_id == WRITER


def test_a_run_made_with_a_token_is_the_user_the_server_reports(tmp_path_factory, tmp_path, csv_path):
    """With MLFLOW_TRACKING_TOKEN (no user name), the run's user is the one the server says the token is
    (``GET /api/2.0/mlflow/users/current``): a locked server that also signs in by token (tests/token_auth.py)."""
    from token_auth import TOKENS

    (token, user), = TOKENS.items()
    with locked_server(tmp_path_factory.mktemp("token"), authorization=TOKEN_AUTH) as server:
        env = environment(MLFLOW_TRACKING_URI=server.uri, MLFLOW_TRACKING_TOKEN=token, LOGNAME=OS_LOGIN, **HTTP,
                          MLFLOW_TRACKING_SERVER_CERT_PATH=str(server.certificate))
        done = tamrun([*csv_overrides(csv_path), *FAST, "tracking=server", f"tracking.experiment={TEAM_EXPERIMENT}"],
                      tmp_path / "job", env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (run,) = team_runs(server)
    assert run.data.tags["mlflow.user"] == run.info.user_id == user


def test_without_a_tracking_account_a_run_s_user_is_the_os_user(tmp_path, csv_path):
    """A local store has no account: the OS user stays, even with MLFLOW_TRACKING_USERNAME exported (the
    variable names a server's account; a sqlite store takes no credentials)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun([*csv_overrides(csv_path), *FAST, f"tracking.uri={store}"], tmp_path / "job",
                  environment(MLFLOW_TRACKING_USERNAME=WRITER, LOGNAME=OS_LOGIN))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.tags["mlflow.user"] == run.info.user_id == OS_LOGIN


REGISTRY = "registry"  # an experiment of the registry's cases: the team experiment's runs log no model
SECOND, SECOND_PASSWORD = "second", "second-secret-pw-5"  # a second user who may EDIT it


@pytest.fixture(scope="module")
def registry_run(server, tmp_path_factory) -> str:
    """As the admin: the experiment `REGISTRY` (the writer and `SECOND` may EDIT it, the reader READ it);
    as the writer: a FINISHED run there with a LoggedModel, its one file recorded (`log_recorded_model`). Its id."""
    folder = tmp_path_factory.mktemp("registry_model")
    from mlflow.server import get_app_client

    with client_env(credentials(ADMIN, ADMIN_PASSWORD, server.certificate)):
        auth = get_app_client("basic-auth", tracking_uri=server.uri)
        auth.create_user(SECOND, SECOND_PASSWORD)
        experiment = MlflowClient(tracking_uri=server.uri).create_experiment(REGISTRY)
        for user, permission in ((WRITER, "EDIT"), (SECOND, "EDIT"), (READER, "READ")):
            auth.grant_user_permission(user, "experiment", experiment, permission)
    with client_env(credentials(WRITER, USERS[WRITER], server.certificate)):
        client = MlflowClient(tracking_uri=server.uri)
        run = client.create_run(experiment, run_name="best").info.run_id
        client.log_metric(run, "rmse_validation", 1.0)
        log_recorded_model(client, experiment, run, folder)
        client.set_terminated(run)
    return run


def register_as(server, user: str, password: str, name: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tamrun.compare", "--experiment", REGISTRY, "--best", "--register",
                           name], cwd=cwd, env=caller_env(server, user, password), capture_output=True, text=True,
                          timeout=300)


def registered(server) -> Dict[str, int]:
    """Every registered model of the server and its count of versions, as the admin sees them."""
    with client_env(credentials(ADMIN, ADMIN_PASSWORD, server.certificate)):
        client = MlflowClient(tracking_uri=server.uri)
        return {model.name: len(client.search_model_versions(f"name = '{model.name}'"))
                for model in client.search_registered_models()}


def one_refusal(done: subprocess.CompletedProcess) -> str:
    """The one ``tamrun:`` line of a command that exited 2 without a traceback or a password shown."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-4000:]
    lines = [row for row in output.splitlines() if row.startswith("tamrun:")]
    assert len(lines) == 1 and "Traceback" not in output, output[-4000:]
    no_password_in(output)
    assert SECOND_PASSWORD not in output
    return lines[0]


def test_registering_needs_edit_and_a_refusal_names_the_user_the_model_and_the_permission(server, registry_run,
                                                                                         tmp_path):
    """Issue 58: the READ user's --register succeeded; onto another user's model it was a 403 and a 47-line
    traceback. docs/scale.md, "What READ users may do in the model registry"."""
    from mlflow.server import get_app_client

    port = server.port
    assert register_as(server, WRITER, USERS[WRITER], "team-model", tmp_path).returncode == 0
    assert one_refusal(register_as(server, READER, USERS[READER], "readers-model", tmp_path)) == (
        f"tamrun: config error: MLFLOW_TRACKING_USERNAME='reader': on the tracking server 127.0.0.1:{port} user "
        f"'reader' has READ on experiment '{REGISTRY}'; registering its run 'best' as a version of 'readers-model' "
        f"needs EDIT there (nothing was registered). Fix: ask the server's admin for EDIT on experiment "
        f"'{REGISTRY}', or have a user who may EDIT it register the model")
    assert one_refusal(register_as(server, SECOND, SECOND_PASSWORD, "team-model", tmp_path)) == (
        f"tamrun: config error: MLFLOW_TRACKING_USERNAME='second': on the tracking server 127.0.0.1:{port} user "
        "'second' has NO_PERMISSIONS on registered model 'team-model'; adding a version to it (another user made it) "
        "needs EDIT there (nothing was registered). Fix: ask the server's admin (or a user with MANAGE on registered "
        "model 'team-model') for EDIT on registered model 'team-model', or register under a name of your own "
        "(--register <another name>)")
    own = register_as(server, SECOND, SECOND_PASSWORD, "seconds-model", tmp_path)
    assert own.returncode == 0 and "registered: seconds-model version 1" in own.stdout, own.stderr[-3000:]
    assert registered(server) == {"team-model": 1, "seconds-model": 1}
    with client_env(credentials(ADMIN, ADMIN_PASSWORD, server.certificate)):  # READ on the model: he loads it
        get_app_client("basic-auth", tracking_uri=server.uri).grant_user_permission(READER, "registered_model",
                                                                                   "team-model", "READ")
    with client_env(credentials(READER, USERS[READER], server.certificate)):
        assert MlflowClient(tracking_uri=server.uri).get_model_version_by_alias("team-model", "champion").run_id == \
            registry_run


# (case, the URI's host, the client's trust: the server's certificate or none (MLFLOW_TRACKING_INSECURE_TLS),
# the start of the one line)
WRONG_NAMES = [
    ("host-not-allowed", "127.1", None,
     "tamrun: config error: tracking.uri='https://127.1:{port}': the tracking server 127.1:{port} refused the Host "
     "header '127.1:{port}' (HTTP 403 'Invalid Host header': the server answers only the host names its "
     "--allowed-hosts lists, its guard against DNS rebinding). Fix: the server's admin adds 127.1:{port} to the "
     "server's --allowed-hosts, or reach it by a name listed there"),
    ("certificate-for-other-names", "127.1", "server",
     "tamrun: config error: tracking.uri='https://127.1:{port}': the tracking server 127.1:{port} presents a "
     "certificate for localhost, 127.0.0.1, not for '127.1', the name the URI gives (TLS: Hostname mismatch, "
     "certificate is not valid for '127.1'.). Fix: reach the server by a name its certificate holds "
     "(https://localhost:{port}), or have the server's admin issue a certificate that names 127.1"),
]


@pytest.mark.parametrize("case, host, trust, line", WRONG_NAMES, ids=[c[0] for c in WRONG_NAMES])
def test_a_name_the_server_does_not_answer_to_is_named_as_such(server, tmp_path, csv_path, case, host, trust, line):
    """Issue 58: a host missing from --allowed-hosts was "writer needs EDIT"; a certificate for other names
    was "not signed by this file's certificates". 127.1 is 127.0.0.1 (inet_aton) by a name neither the
    server's --allowed-hosts nor its certificate lists."""
    certificate = server.certificate if trust == "server" else None
    env = environment(MLFLOW_TRACKING_URI=f"https://{host}:{server.port}", **HTTP,
                      **credentials(WRITER, USERS[WRITER], certificate),
                      **({} if certificate else {"MLFLOW_TRACKING_INSECURE_TLS": "true"}))
    before = len(team_runs(server))
    done = tamrun([*csv_overrides(csv_path), *FAST, "tracking=server", f"tracking.experiment={TEAM_EXPERIMENT}"],
                  tmp_path / "job", env)
    assert one_refusal(done).startswith(line.format(port=server.port))
    assert "needs EDIT" not in done.stderr and len(team_runs(server)) == before


@pytest.mark.parametrize("days, said", [((-3, -1), "that expired on"), ((1, 3), "valid only from")],
                         ids=["expired", "not-yet-valid"])
def test_a_certificate_out_of_its_dates_is_named_with_its_date(tmp_path, days, said):
    """Issue 58: an expired certificate was "not signed by this file's certificates" (the file holds it)."""
    from cryptography import x509

    certificate = dated_certificate(tmp_path, days)
    read = x509.load_pem_x509_certificate(certificate.read_bytes())
    date = (read.not_valid_after_utc if days[1] < 0 else read.not_valid_before_utc).strftime("%Y-%m-%d %H:%M UTC")
    with tls_listener(certificate) as port:
        done = subprocess.run([sys.executable, "-m", "tamrun.compare", "--store", f"https://127.0.0.1:{port}"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=environment(**HTTP, **credentials(None, None, certificate)))
    assert one_refusal(done).startswith(f"tamrun: config error: tracking.uri='https://127.0.0.1:{port}': the tracking "
                                        f"server 127.0.0.1:{port} presents a certificate {said} {date} (TLS: "
                                        f"certificate {'has expired' if days[1] < 0 else 'is not yet valid'})")
