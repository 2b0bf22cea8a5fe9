"""The trust boundary's first rule: no secret leaves the process (issue 44; docs/reliability.md, "Security").

`tamrun.redact.redacted` decides what is secret; every text that leaves goes through it. Checked here:
the function on every URI and assignment form (a password with '/', ':' or '?', a query parameter, an
environment line, a secret environment variable's value anywhere), and whole commands against a real
PostgreSQL database on 127.0.0.1 with the password in the tracking URI (both forms the issue names): the
terminal, Hydra's own files (``.hydra/*.yaml``, ``multirun.yaml``: redacted and 0600), the job's log
``tamrun.log``, and the run's params, tags and text artifacts in the store hold no secret.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from servers import postgres_database
from tamrun.redact import MASK, RedactFilter, redacted, secret_name
from tamrun.cluster.env import split_secrets

ENV_SECRET = "envS3cretValue42"  # a cloud credential in the environment: never written anywhere


def tamrun(args: List[str], cwd: Path, env: Dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m tamrun args`` in ``cwd``, the environment clean of Hydra's, tamrun's and MLflow's variables
    and ``env`` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_"))}
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "tamrun", *args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, **env}, timeout=timeout)


@pytest.mark.parametrize("text, secret", [
    ("postgresql://user:s3/cret@db.example:5432/mlflow", "s3/cret"),
    ("postgresql://user:s3:cr/et?x@db.example/mlflow", "s3:cr/et?x"),
    ("http://u:s3/cret@127.0.0.1:9", "s3/cret"),
    ("mysql+pymysql://user@db/mlflow?password=s3cret&charset=utf8", "s3cret"),
    ("postgresql://db/mlflow?sslmode=require&PASSWORD=s3cret", "s3cret"),
    ("https://bucket.s3.amazonaws.com/x?X-Amz-Credential=AKIA1&X-Amz-Signature=f00dfeed", "f00dfeed"),
    ("https://acct.blob.core.windows.net/c?sv=2020&sig=abc%2Bdef", "abc%2Bdef"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI\x00HOME=/root", "wJalrXUtnFEMI"),
    ("tracking:\n  password: hunter2\n", "hunter2"),
    ('{"MLFLOW_TRACKING_TOKEN": "tok-123456"}', "tok-123456"),
    ("--db-password=hunter2 rest", "hunter2"),
    (f"the file said {ENV_SECRET} twice: {ENV_SECRET}", ENV_SECRET),
    ("root:$6$saltsalt$Zm9vYmFyYmF6cXV4:19000:0:99999:7:::", "Zm9vYmFyYmF6cXV4"),
    ("mysql://user:p@ss:w/rd@db.example/mlflow", "p@ss:w/rd"),
])
def test_every_form_of_a_secret_is_redacted(text, secret, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", ENV_SECRET)
    clean = redacted(text)
    assert secret not in clean and MASK in clean
    assert redacted(clean) == clean  # idempotent: a text redacted twice reads the same


@pytest.mark.parametrize("text", ["sqlite:///outputs/mlflow.db", "http://127.0.0.1:5000/#/experiments/1/runs/ab",
                                  "postgresql://alice@db.example:5432/mlflow", "model.effects.x.k=10",
                                  "tamrun: data error: y=nan: the target has NaNs. Fix: drop them",
                                  "file:///tmp/a?sort=key&mode=ro"])
def test_what_is_not_secret_stays_as_it_is(text):
    assert redacted(text) == text


def test_secret_names_and_the_variables_handed_to_ray():
    """Ray's runtime environment (logged on every node) gets no secret: those go apart, as a task argument."""
    for name in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AZURE_STORAGE_CONNECTION_STRING", "GOOGLE_API_KEY", "password", "X-Amz-Signature"):
        assert secret_name(name), name
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "HOME", "monkey", "keys"):
        assert not secret_name(name), name
    public, secret = split_secrets({"MLFLOW_TRACKING_URI": "http://h:5000", "MLFLOW_TRACKING_PASSWORD": "pw",
                                    "MY_URI": "postgresql://u:pw@h/db", "TAMRUN_RUN_TAG": "-1-ab"})
    assert public == {"MLFLOW_TRACKING_URI": "http://h:5000", "TAMRUN_RUN_TAG": "-1-ab"}
    assert set(secret) == {"MLFLOW_TRACKING_PASSWORD", "MY_URI"}


def test_a_log_record_is_redacted_with_its_arguments_and_its_traceback():
    import logging

    try:
        raise ValueError("cannot reach postgresql://u:s3/cret@h/db")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "store %s", ("http://u:pw@h:1",),
                                   sys.exc_info())
    assert RedactFilter().filter(record)
    assert record.getMessage() == f"store http://u:{MASK}@h:1" and "s3/cret" not in record.exc_text


@pytest.mark.parametrize("option", ["--cfg=job", "--cfg=hydra", "--info=config"])
def test_what_hydra_prints_itself_is_redacted(tmp_path, option):
    """Hydra prints the composed config itself (--cfg, --info): the entry point's output is redacted too."""
    done = tamrun(["tracking.uri=postgresql://alice:s3/cret@db.example/mlflow", option], tmp_path, {})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "s3/cret" not in done.stdout + done.stderr and f"postgresql://alice:{MASK}@db.example/mlflow" in done.stdout


@pytest.fixture(scope="module")
def postgres():
    with postgres_database() as uri:
        yield uri


def secret_uris(uri: str) -> Dict[str, str]:
    """The database's URI with a password in each form the issue names (trust auth ignores it)."""
    return {"slash": uri.replace("postgres@", "postgres:s3/cret@"), "query": f"{uri}?password=s3/cret"}


def files_under(folder: Path) -> List[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and not path.name.endswith(".db")]


@pytest.mark.slow
@pytest.mark.parametrize("form, multirun", [("slash", False), ("query", True)])
def test_no_secret_leaves_a_real_run(postgres, form, multirun, tmp_path, csv_path):
    """A run (and a one-job sweep) on PostgreSQL with the password in the command line and a credential in
    the environment: FINISHED, and neither secret is on the terminal, in any file under the run's folder
    (Hydra's files 0600) nor in the store's params, tags and text artifacts."""
    uri = secret_uris(postgres)[form]
    args = [*(["-m"] if multirun else []), *csv_overrides(csv_path), f"tracking.uri='{uri}'", "tracking.experiment=sec",
            f"tracking.run_name='to {uri}'", "tracking.log_plots=false", "progress=off"]
    done = tamrun(args, tmp_path / "cwd", {"AWS_SECRET_ACCESS_KEY": ENV_SECRET})
    assert done.returncode == 0, done.stderr[-4000:]
    for secret in ("s3/cret", ENV_SECRET):
        assert secret not in done.stdout + done.stderr
    hydra_files = [p for p in files_under(tmp_path / "cwd") if p.parent.name == ".hydra" or p.name == "multirun.yaml"]
    assert {p.name for p in hydra_files} >= {"config.yaml", "hydra.yaml", "overrides.yaml"}
    assert ("multirun.yaml" in {p.name for p in hydra_files}) == multirun
    for path in files_under(tmp_path / "cwd"):
        assert "s3/cret" not in path.read_text(errors="replace"), path
    for path in hydra_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert f"postgres:{MASK}@" in path.read_text() or f"password={MASK}" in path.read_text()
    client = MlflowClient(tracking_uri=postgres)
    runs = client.search_runs([client.get_experiment_by_name("sec").experiment_id])
    assert runs and {run.info.status for run in runs} == {"FINISHED"}
    for run in runs:
        assert "s3/cret" not in repr(run.data.params) + repr(run.data.tags) + run.info.run_name
        for name in ("config/resolved.yaml", "config/overrides.txt", "logs/run.log"):
            listed = [a.path for a in client.list_artifacts(run.info.run_id, str(Path(name).parent))]
            if name in listed:
                text = Path(client.download_artifacts(run.info.run_id, name, str(tmp_path / run.info.run_id))).read_text()
                assert "s3/cret" not in text and MASK in text, name
