"""A logged model uploads in a handful of requests (issue 61): one real ``python -m tamrun`` job logs its model
to the locked MLflow server (tests/servers.py `locked_server`: basic auth behind TLS, artifacts served by the
server), and the server's own access log (uvicorn's, in its ``server.log``) counts the requests.

- the model's files arrive in one PUT each, at most `MAX_MODEL_UPLOADS` of them (before issue 58 a model was
  190 files: 189 of them the bundled source of tamrun, one request each); every file the run recorded in the
  LoggedModel's manifest (`tamrun.tracking.model_files.MANIFEST_TAG`) arrived, byte for byte (its sha256);
  tamrun travels as one wheel, no Python source file;
- every request naming the model (creation, tags, uploads, its end) is counted, at most `MAX_MODEL_REQUESTS`;
- a call on a server store that lasts is not said to be unanswered (the job said "the store has not answered
  yet" while every upload answered 200): `tamrun.tracking.store.store_wait.SERVER_CALL_RUNNING`.

docs/benchmarks.md ("Uploading a logged model") has the figures measured with the same server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, List

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from servers import ADMIN, ADMIN_PASSWORD, TEAM_EXPERIMENT, USERS, client_env, credentials, locked_server
from tamrun.tracking.model_files import MANIFEST_TAG, sha256_of
from tamrun.tracking.store.store_wait import SERVER_CALL_RUNNING, StoreWatch
from test_team_cluster import HTTP, environment, tamrun

pytestmark = pytest.mark.slow
WRITER = "writer"
MAX_MODEL_UPLOADS = 15  # the model's 9 files (state, JSON, MLmodel, requirements, examples, one wheel) + a margin
MAX_MODEL_REQUESTS = 25  # those uploads and the LoggedModel's creation, output, tags, reads and end
# A job that logs its model and nothing else it need not: no plots, no progress bar, one thread
WITH_MODEL = ["tracking.log_plots=false", "tracking.log_model=true", "progress=off", "hw.threads=1"]
ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator:
    with locked_server(tmp_path_factory.mktemp("locked")) as running:
        yield running


def requests_since(log: Path, start: int) -> List[re.Match]:
    """The requests the server's access log (uvicorn's lines in ``log``) holds past byte ``start``."""
    text = log.read_bytes()[start:].decode("utf-8", "replace")
    return [found for found in map(ACCESS_LINE.search, text.splitlines()) if found]


@pytest.fixture(scope="module")
def logged(server, tmp_path_factory):
    """One job by the EDIT user that logs its model on the locked server: (the job's result, its LoggedModel,
    the requests the server logged during the job)."""
    from conftest import synthetic_frame

    top = tmp_path_factory.mktemp("upload")
    frame = top / "synthetic.csv"
    synthetic_frame().to_csv(frame, index=False)
    start = server.log.stat().st_size
    env = environment(MLFLOW_TRACKING_URI=server.uri, **credentials(WRITER, USERS[WRITER], server.certificate), **HTTP)
    done = tamrun([*csv_overrides(frame), *WITH_MODEL, "tracking=server", f"tracking.experiment={TEAM_EXPERIMENT}"],
                  top / "job", env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with client_env(credentials(ADMIN, ADMIN_PASSWORD, server.certificate)):
        client = MlflowClient(tracking_uri=server.uri)
        (model,) = client.search_logged_models([client.get_experiment_by_name(TEAM_EXPERIMENT).experiment_id])
    return done, model, requests_since(server.log, start)


def test_the_model_arrives_in_one_request_per_file_every_file_as_recorded(server, logged):
    _, model, requests = logged
    assert requests, "the server's log holds no access line: uvicorn's access log is off?"
    prefix = f"/models/{model.model_id}/artifacts/"
    uploads = [r["path"].split(prefix, 1)[1] for r in requests if r["method"] == "PUT" and prefix in r["path"]]
    assert all(r["status"] == "200" for r in requests if model.model_id in r["path"])
    recorded = json.loads(model.tags[MANIFEST_TAG])
    assert sorted(uploads) == sorted(recorded)  # each file once, nothing else
    assert len(uploads) <= MAX_MODEL_UPLOADS, uploads
    assert [name for name in uploads if name.endswith(".whl")] == [f"tamrun-{model.tags['tamrun_version']}-py3-none-any.whl"]
    assert not [name for name in uploads if name.endswith(".py")], uploads
    (held,) = Path(server.artifacts).glob(f"*/models/{model.model_id}/artifacts")
    assert {name: sha256_of(held / name) for name in uploads} == recorded


def test_logging_the_model_takes_a_handful_of_requests(logged):
    _, model, requests = logged
    about_it = [r for r in requests if model.model_id in r["path"]]
    created = [r for r in requests if r["method"] == "POST" and r["path"] == "/api/2.0/mlflow/logged-models"]
    assert len(created) == 1
    assert len(about_it) + len(created) <= MAX_MODEL_REQUESTS, [r["path"] for r in about_it]


def test_a_call_on_a_server_that_lasts_is_not_said_unanswered(logged):
    done, _, _ = logged
    assert "has not answered" not in done.stdout + done.stderr
    assert StoreWatch("https://127.0.0.1:1", None, (60.0, 300.0)).holder() == SERVER_CALL_RUNNING
