"""Secrets stay out of the store (issue 58; docs/reliability.md, "Secrets kept out of the store").

Three doors the first round left open, each tried with real commands (``python -m tamrun`` in a
subprocess, a real sqlite MLflow store, real files) and its variations: a password in ``data.path``'s URI
(a path's normalisation collapsed ``s3://`` to ``s3:/`` and the URI mask missed it), a credential file
given as data (its first line quoted as "columns"), and a secret environment variable interpolated into a
name MLflow keeps (the experiment's). Each test reads back everything a run writes: the terminal, the
store's experiments, run names, params and tags, the run's artifacts (``logs/run.log``,
``config/resolved.yaml``, ``config/overrides.txt``), Hydra's ``.hydra/*.yaml`` and every other file under
the command's folder, the sqlite file's bytes included, and finds the secret nowhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import synthetic_frame
from test_data_files import refused
from test_secrets import tamrun
from tamrun.config.load import typed_config
from tamrun.config.secret_sources import check_secret_sources
from tamrun.data.file_kind import quotable
from tamrun.errors import ConfigError, DataError
from tamrun.redact import MASK, looks_like_credential, redacted

PASSWORD = "s3cretPW9x"  # a data URI's password
ENV_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCY"  # AWS_SECRET_ACCESS_KEY's value
SHORT_SECRET = "pw4Xq"  # shorter than tamrun.redact.SHORTEST_SECRET: never masked by its value
PGPASS = "db.internal:5432:prod:admin:Tr0ub4dorXYZ\nother.internal:5432:*:bob:hunter2pw\n"
# The brief's command: a small two-group CSV, a spline on x.
MODEL = ["data=csv", "data.group=g", "model=custom", "+model.effects.x={kind: spline, column: x, k: 10}",
         "split.train_end=2020-01-20", "split.test_start=2020-01-21", "split.test_end=null",
         "tracking.log_plots=false", "tracking.log_model=false", "progress=off"]


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "small.csv"
    path.parent.mkdir()
    synthetic_frame(days=30, groups=2).to_csv(path, index=False)
    return path


def files_under(folder: Path) -> List[Path]:
    return [path for path in folder.rglob("*") if path.is_file()] if folder.exists() else []


def assert_nowhere(secrets: List[str], done, cwd: Path) -> None:
    """None of ``secrets`` on the terminal, in the store (experiments, run names, params, tags), in the runs'
    text artifacts, in Hydra's files nor in any file under ``cwd`` (the store's bytes included)."""
    for secret in secrets:
        assert secret not in done.stdout + done.stderr
        for path in files_under(cwd):
            assert secret.encode() not in path.read_bytes(), path
    store = cwd / "outputs" / "mlflow.db"
    if not store.exists():
        return
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiments = client.search_experiments()
    for run in client.search_runs([e.experiment_id for e in experiments]):
        written = repr(run.data.params) + repr(run.data.tags) + run.info.run_name + repr([e.name for e in experiments])
        texts = [Path(client.download_artifacts(run.info.run_id, name, str(cwd.parent / run.info.run_id))).read_text()
                 for name in ("logs/run.log", "config/resolved.yaml", "config/overrides.txt")
                 if name in {a.path for a in client.list_artifacts(run.info.run_id, str(Path(name).parent))}]
        for secret in secrets:
            assert secret not in written and not any(secret in text for text in texts)


def runs_of(cwd: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


# ---- a URI's password, before and after a path's normalisation ------------------------------------------

@pytest.mark.parametrize("text, secret", [
    ("s3://AKIAIOSFODNN7EXAMPLE:s3cretpw@bucket/x.csv", "s3cretpw"),
    ("s3:/AKIAIOSFODNN7EXAMPLE:s3cretpw@bucket/x.csv", "s3cretpw"),  # what str(Path("s3://...")) gives
    ("/work/s3:/u:s3cretpw@bucket/x.csv", "s3cretpw"),  # the same, made absolute
    ("ftp://bob:hunter22@ftp.example/x.csv", "hunter22"),
    ("gs://u:gcs-pw-1@bucket/x", "gcs-pw-1"), ("hdfs://u:hd-pw-22@nn:8020/x", "hd-pw-22"),
    ("abfss://u:az-pw-3@c@acct.dfs.core.windows.net/x", "az-pw-3@c"),
    ("http://bob:p%40ss%2Fw0rd@host/x.csv", "p%40ss%2Fw0rd"),  # percent-encoded
    ("https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r.git", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("https://glpat-xXzY12abCD34efGH56ij@gitlab.com/x", "glpat-xXzY12abCD34efGH56ij"),  # a token as the user
    ("https://0123456789abcdef0123456789abcdef@host/x", "0123456789abcdef0123456789abcdef"),
    ("data.path=http\\://bob\\:hunter22@host/x.csv", "hunter22"),  # as Hydra escapes an override's value
    ('"data.path=s3\\\\://u\\\\:hunter22@b/x.csv"', "hunter22"),  # the same in JSON (a sweep's jobs/<n>.json)
])
def test_a_uri_password_or_token_is_masked_whatever_its_scheme_and_form(text, secret):
    clean = redacted(text)
    assert secret not in clean and MASK in clean
    assert redacted(clean) == clean


@pytest.mark.parametrize("text", ["https://alice@github.com/o/r", "postgresql://alice@db:5432/mlflow",
                                  "abfss://container@acct.dfs.core.windows.net/x", "ssh://git@github.com/o/r",
                                  "/data/s3:/bucket/x.csv", "sales_2023, temp_2m, x1, date"])
def test_a_user_name_and_a_plain_path_stay(text):
    assert redacted(text) == text


@pytest.mark.parametrize("word, credential", [
    ("Tr0ub4dorXYZ", True), ("Tr0ub4dor&3", True), ("AKIAIOSFODNN7EXAMPLE", True), ("ghp_abcdefghijkl1234", True),
    ("0123456789abcdef0123", True), ("alice", False), ("temp_2m", False), ("sales_2023", False),
    ("temperature_2m_max_celsius", False), ("2020-01-01", False), ("db.internal", False), ("x1", False)])
def test_what_looks_like_a_credential(word, credential):
    assert looks_like_credential(word) == credential


@pytest.mark.parametrize("path, secret", [
    (f"s3://AKIAIOSFODNN7EXAMPLE:{PASSWORD}@bucket/x.csv", PASSWORD),
    (f"http://bob:{PASSWORD}@host/x.csv", PASSWORD),
    (f"ftp://bob:{PASSWORD}@ftp.example/data/x.csv", PASSWORD),
    (f"https://bob:{PASSWORD}@host", PASSWORD),  # no file name: the run's name would have been the userinfo
    ("https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r/x.csv", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("gs://u:p%40ss%2Fw0rd9@bucket/x.csv", "p%40ss%2Fw0rd9"),  # percent-encoded
], ids=["s3", "http", "ftp", "no-file-name", "token-as-user", "percent-encoded"])
def test_a_remote_data_path_is_refused_and_its_password_written_nowhere(tmp_path, path, secret):
    """The brief's command with a password (or a token) in data.path's URI: one data error naming data.path,
    its scheme and the fix, the secret masked; the FAILED run, its artifacts and Hydra's files hold none."""
    cwd = tmp_path / "cwd"
    done = tamrun([*MODEL, f"data.path={path}"], cwd, {})
    assert done.returncode == 2, done.stderr[-3000:]
    scheme, masked = path.split(":", 1)[0], path.replace(secret, MASK)
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"tamrun: data error: data.path='{masked}': a remote {scheme}:// URI: tamrun reads local files and folders "
        "only. Fix: copy the data to a local disk, or mount its bucket"), done.stderr[-2000:]
    assert [run.info.status for run in runs_of(cwd)] == ["FAILED"]
    assert_nowhere([secret], done, cwd)


def test_a_sweep_over_remote_data_paths_writes_no_password(tmp_path):
    """A multirun over two URIs: each job FAILED with the data error; the jobs' run names (cut to a few
    characters, which would cut the '@' that marks a password), the sweep's files and summary hold none."""
    cwd = tmp_path / "cwd"
    paths = f"s3://AKIAIOSFODNN7EXAMPLE:{PASSWORD}@bucket/x.csv,http://bob:{PASSWORD}@host"
    done = tamrun(["-m", *MODEL, f"data.path={paths}"], cwd, {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("a remote ") == 2 and "2 of 2 sweep job(s) did not finish" in done.stderr
    assert [run.info.status for run in runs_of(cwd)] == ["FAILED"] * 3  # the parent too: no job finished
    assert_nowhere([PASSWORD], done, cwd)


def test_a_remote_data_path_in_a_config_dir_yaml_is_refused_too(tmp_path, small_csv):
    """data.path in an experiment YAML of --config-dir (a path Hydra reads, not the command line)."""
    folder = tmp_path / "conf" / "experiment"
    folder.mkdir(parents=True)
    (folder / "remote.yaml").write_text(f"# @package _global_\ndata:\n  path: s3://AKIAIOSFODNN7EXAMPLE:{PASSWORD}"
                                        "@bucket/x.csv\n")
    cwd = tmp_path / "cwd"
    done = tamrun(["--config-dir", str(tmp_path / "conf"), "+experiment=remote", *MODEL], cwd, {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"data.path='s3://AKIAIOSFODNN7EXAMPLE:{MASK}@bucket/x.csv': a remote s3:// URI" in done.stderr
    assert_nowhere([PASSWORD], done, cwd)


def test_a_file_uri_names_the_path_to_give(tmp_path, small_csv):
    error = refused(f"file://{small_csv}", "a file: URI, not a path")
    assert error.fix == f"give the path itself: data.path={small_csv}"


# ---- a credential file given as data --------------------------------------------------------------------

@pytest.mark.parametrize("content, fields, quoted", [
    (PGPASS, {}, ["Tr0ub4dorXYZ", "db.internal", "admin"]),  # one column by ','
    (PGPASS, {"delimiter": ":"}, ["Tr0ub4dorXYZ", "db.internal", "admin"]),  # host, port, db, user, password
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI\nAWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\n", {"delimiter": "="},
     ["wJalrXUtnFEMI", "AWS_SECRET_ACCESS_KEY"]),  # a .env file
    ("machine api.example login bob password hunter2pw\n", {}, ["hunter2pw", "api.example"]),  # ~/.netrc
    ("bob:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n", {}, ["HqJZimcKQFAMYayBlzkrA", "bob:"]),  # .htpasswd
    ("https://bob:hunter2pw@github.com\n", {}, ["hunter2pw", "github.com"]),  # ~/.git-credentials
    ("sales,Tr0ub4dorXYZ,y\n1,2,3\n", {}, ["Tr0ub4dorXYZ", "sales"]),  # a password among plain names
])
def test_a_credential_file_as_data_quotes_none_of_its_fields(tmp_path, content, fields, quoted):
    """A file whose first line is a credential file's: the error says how many columns and why none is
    quoted, and the fix names data.path and data.delimiter; no field of the line is in it."""
    path = tmp_path / "data.csv"
    path.write_text(content)
    text = str(refused(path, "no such column", **fields))
    assert "does not look like a CSV header" in text and "Fix: check that data.path names the data file" in text
    assert not any(field in text for field in quoted), text


def test_a_plain_header_is_still_quoted(tmp_path):
    path = tmp_path / "data.csv"
    names = ["day", "sales_2023", "temp_2m", "Region Name", "y"] + [f"c{i}" for i in range(40)]
    path.write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n")
    error = refused(path, "no such column")
    assert "use one of: day, sales_2023, temp_2m, Region Name, y, c0" in error.fix and "(33 more)" in error.fix
    assert all(quotable(name) for name in names) and not quotable("5432") and not quotable("host:5432")


def test_a_pgpass_file_linked_as_csv_leaks_nothing(tmp_path):
    """The brief's row: a symlink named .csv to a .pgpass file, the whole command: the error quotes no field
    of it, on the terminal, in the FAILED run's tags or in logs/run.log."""
    secret_file = tmp_path / "home" / ".pgpass"
    secret_file.parent.mkdir()
    secret_file.write_text(PGPASS)
    link = tmp_path / "data.csv"
    link.symlink_to(secret_file)
    cwd = tmp_path / "cwd"
    done = tamrun([*MODEL, f"data.path={link}"], cwd, {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tamrun: data error: data.date_column='date': no such column in the data. Fix: check that data.path " \
           "names the data file and data.delimiter its delimiter: the file has 1 column(s)" in done.stderr
    assert [run.info.status for run in runs_of(cwd)] == ["FAILED"]
    assert_nowhere(["Tr0ub4dorXYZ", "hunter2pw", "db.internal:5432"], done, cwd)


# ---- a secret environment variable in a name the store keeps ----------------------------------------------

@pytest.mark.parametrize("args, field, secret", [
    (["tracking.experiment=${oc.env:AWS_SECRET_ACCESS_KEY}"], "tracking.experiment", ENV_SECRET),
    ([f"tracking.experiment={ENV_SECRET}"], "tracking.experiment", ENV_SECRET),  # typed, not interpolated
    (["tracking.run_name=run-${oc.env:MLFLOW_TRACKING_PASSWORD}"], "tracking.run_name", SHORT_SECRET),
    (["hydra.run.dir=out/${oc.env:MLFLOW_TRACKING_PASSWORD}"], "hydra.run.dir", SHORT_SECRET),
    (["-m", "tracking.run_name=${oc.env:MLFLOW_TRACKING_PASSWORD},plain"], "tracking.run_name", SHORT_SECRET),
    (["+experiment=secret"], "tracking.experiment", ENV_SECRET),  # in a --config-dir YAML
], ids=["experiment", "typed", "run-name-short", "run-dir", "sweep-choice", "config-dir"])
def test_a_secret_variable_in_a_written_field_is_refused_before_anything_is_written(tmp_path, small_csv, args,
                                                                                 field, secret):
    """A secret environment variable's value in a field written in clear: one config error naming the field
    and the variable, exit 2, before Hydra makes a folder or the store is opened: nothing written at all."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "secret.yaml").write_text("# @package _global_\ntracking:\n  experiment: ${oc.env:AWS_SECRET_ACCESS_KEY}\n")
    cwd = tmp_path / "cwd"
    env = {"AWS_SECRET_ACCESS_KEY": ENV_SECRET, "MLFLOW_TRACKING_PASSWORD": SHORT_SECRET}
    done = tamrun(["--config-dir", str(tmp_path / "conf"), *args, *MODEL, f"data.path={small_csv}"], cwd, env)
    assert done.returncode == 2, done.stderr[-3000:]
    variable = "AWS_SECRET_ACCESS_KEY" if secret == ENV_SECRET else "MLFLOW_TRACKING_PASSWORD"
    assert f"tamrun: config error: {field}=" in done.stderr
    assert f"it takes the value of the secret environment variable {variable}, and {field} is written in clear" \
           in done.stderr
    assert os.listdir(cwd) == []  # no run folder, no store
    assert_nowhere([secret], done, cwd)


def test_a_secret_as_a_uri_password_is_taken_and_elsewhere_refused(compose_cfg, monkeypatch):
    """Where the redaction masks it by its place (a URI's password), a secret variable is taken; elsewhere
    (a path) refused, naming the field; an artifact root with a password is refused (MLflow keeps it as
    the experiment's artifact location)."""
    monkeypatch.setenv("DB_PASSWORD", "dbPassw0rd")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    check_secret_sources(compose_cfg("tracking.uri=postgresql://u:${oc.env:DB_PASSWORD}@db/mlflow"))
    with pytest.raises(ConfigError, match="secret environment variable AWS_SECRET_ACCESS_KEY") as caught:
        check_secret_sources(compose_cfg("data.path=/data/${oc.env:AWS_SECRET_ACCESS_KEY}.csv"))
    assert caught.value.field == "data.path" and ENV_SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="as the experiment's artifact location") as caught:
        typed_config(compose_cfg(f"tracking.artifact_root=s3://AKIAIOSFODNN7EXAMPLE:{PASSWORD}@bucket/mlruns"))
    assert caught.value.field == "tracking.artifact_root" and PASSWORD not in str(caught.value)


def test_an_experiment_named_by_mlflow_experiment_name_with_a_secret_is_refused(tmp_path, small_csv):
    """MLFLOW_EXPERIMENT_NAME holding a secret variable's value (the store chooses the experiment): refused as
    the store is opened, naming the variable; the store holds no such experiment."""
    cwd = tmp_path / "cwd"
    done = tamrun([*MODEL, f"data.path={small_csv}"], cwd,
                  {"AWS_SECRET_ACCESS_KEY": ENV_SECRET, "MLFLOW_EXPERIMENT_NAME": ENV_SECRET})
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"tamrun: config error: MLFLOW_EXPERIMENT_NAME='{MASK}': it holds a secret" in done.stderr
    assert_nowhere([ENV_SECRET], done, cwd)


def test_a_value_that_looks_like_a_password_is_not_quoted(tmp_path):
    """A column of a credential file named as the dates: the value that does not parse is not quoted when
    it looks like a password; a plain wrong date still is."""
    path = tmp_path / "data.csv"
    path.write_text("host:port:db:user:pw\ndb.internal:5432:prod:admin:Xk9mQ2vLpZ\n")
    error = refused(path, "is not a date", delimiter=":", date_column="pw")
    assert "Xk9mQ2vLpZ" not in str(error) and "the value (not quoted: it looks like a password or a token) " \
        "at line 2" in str(error)
    path.write_text("date,x,g,y\n2020-13-45,1,a,2\n")
    assert "the value '2020-13-45' at line 2" in str(refused(path, "is not a date"))


@pytest.mark.parametrize("column", ["password", "api_key", "DB_PASSWORD"])
def test_a_value_of_a_column_named_like_a_secret_is_never_quoted(column):
    """A column named like a secret (`tamrun.redact.secret_name`) used where numbers are needed: the error
    names the column and the row, never its value, however plain the value looks ('hunter2', 7 characters, is
    no token by its look); a plainly named column's value still is quoted."""
    from tamrun.data.checks import check_table

    frame = pd.DataFrame({"date": pd.date_range("2020-01-01", periods=3), "g": ["a", "a", "b"],
                          column: ["hunter2", "hunter2", "hunter2"], "x": ["1.5", "oops", "2"]})
    with pytest.raises(DataError) as caught:
        check_table(frame, {"data.target": column}, "g", "date")
    text = caught.value.report_line()
    assert "hunter2" not in text and "(not quoted: it looks like a password or a token)" in text, text
    assert f"data.target={column!r}" in text and "the row of 2020-01-01 00:00:00 in group 'a'" in text, text
    with pytest.raises(DataError) as plain:
        check_table(frame, {"model.effects.x.column": "x"}, "g", "date")
    assert "(first: 'oops' at the row of 2020-01-02 00:00:00 in group 'a')" in plain.value.report_line()
