"""Every message about the store names the right cause and setting (issue 44; docs/reliability.md).

- an experiment name MLflow cannot hold, or an experiment deleted in MLflow: ``tracking.experiment``
  named (not tracking.uri);
- ``MLFLOW_EXPERIMENT_NAME`` and ``MLFLOW_EXPERIMENT_ID`` honoured as MLflow honours them (the name, created
  if absent; the id alone, which must exist; both, which must agree), each error naming the variable;
- a tracking URI whose port is not a number (a '/' in the password cuts the host part): a config error
  naming tracking.uri, the password not shown, the fix to percent-encode (not "internal error");
- docs/scale.md's advice for a real server host: a real ``mlflow server`` answers a request for
  ``tracking-host`` with 403 unless ``--allowed-hosts`` names it.
Real sqlite stores and a real server on 127.0.0.1, the run through `tamrun.runner.run`.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from servers import MlflowServer
from tamrun.errors import ConfigError
from tamrun.runner import run

QUICK = ["tracking.log_plots=false", "tracking.log_model=false", "progress=off"]


@pytest.fixture
def quick_run(compose_cfg, csv_path, monkeypatch):
    """quick_run(*overrides) -> the run's result; MLflow's experiment variables unset unless a test sets them."""
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    return lambda *overrides: run(compose_cfg(*csv_overrides(csv_path), *QUICK, *overrides))


def test_an_experiment_name_too_long_names_tracking_experiment(quick_run):
    with pytest.raises(ConfigError, match=r"an experiment name of 10000 characters \(MLflow's store holds at most 256"
                       ) as caught:
        quick_run("tracking.experiment=" + "e" * 10_000)
    assert caught.value.field == "tracking.experiment"


def test_a_deleted_experiment_names_tracking_experiment_and_how_to_restore_it(quick_run, store_uri):
    first = quick_run("tracking.experiment=gone")
    client = MlflowClient(tracking_uri=store_uri)
    experiment = client.get_run(first.run_id).info.experiment_id
    client.delete_experiment(experiment)
    with pytest.raises(ConfigError, match="the experiment is deleted in this store") as caught:
        quick_run("tracking.experiment=gone")
    assert caught.value.field == "tracking.experiment"
    assert f"mlflow experiments restore --experiment-id {experiment}" in caught.value.fix


def test_mlflow_experiment_name_is_honoured(quick_run, store_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "myexp")
    result = quick_run()
    client = MlflowClient(tracking_uri=store_uri)
    assert client.get_experiment(client.get_run(result.run_id).info.experiment_id).name == "myexp"
    explicit = quick_run("tracking.experiment=chosen")  # the setting, when given, wins
    assert client.get_experiment(client.get_run(explicit.run_id).info.experiment_id).name == "chosen"


def test_mlflow_experiment_id_is_honoured_and_checked(quick_run, store_uri, monkeypatch):
    client = MlflowClient(tracking_uri=store_uri)
    first = quick_run("tracking.experiment=by-id")
    wanted = client.get_run(first.run_id).info.experiment_id
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", wanted)
    assert client.get_run(quick_run().run_id).info.experiment_id == wanted
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "another")
    with pytest.raises(ConfigError, match="it names another experiment than MLFLOW_EXPERIMENT_NAME='another'") as caught:
        quick_run()
    assert caught.value.field == "MLFLOW_EXPERIMENT_ID"
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "987654")
    with pytest.raises(ConfigError, match="the store has no experiment of this id") as caught:
        quick_run()
    assert caught.value.field == "MLFLOW_EXPERIMENT_ID"


@pytest.mark.parametrize("uri, shown", [("http://u:s3/cret@127.0.0.1:9", "the port is not a number (the password holds"),
                                        ("http://127.0.0.1:50OO", "the port '50OO' is not a number")])
def test_a_port_that_is_not_a_number_is_a_config_error(quick_run, uri, shown):
    with pytest.raises(ConfigError) as caught:
        quick_run(f"tracking.uri={uri}")
    assert caught.value.field == "tracking.uri" and shown in str(caught.value)
    assert "s3/cret" not in str(caught.value) and "percent-encode" in caught.value.fix


def host_status(port: int, host: str) -> int:
    """The HTTP status the server on 127.0.0.1:``port`` answers to a request whose Host header is ``host``."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.slow
def test_a_server_answers_a_host_name_only_when_allowed(tmp_path):
    """docs/scale.md: a server reached as http://tracking-host:<port> needs --allowed-hosts naming it."""
    statuses = {}
    for allowed in (False, True):
        folder = tmp_path / str(allowed)
        folder.mkdir()
        server = MlflowServer(f"sqlite:///{folder / 'mlflow.db'}", folder / "artifacts", folder / "server.log", 1)
        server.extra = ["--allowed-hosts", f"tracking-host:{server.port},127.0.0.1:{server.port}"] if allowed else []
        try:
            server.start()
            statuses[allowed] = host_status(server.port, f"tracking-host:{server.port}")
        finally:
            server.stop()
    assert statuses == {False: 403, True: 200}
