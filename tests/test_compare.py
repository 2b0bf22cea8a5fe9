"""`python -m tamrun.compare` on stores written here with MLflow's client (fast; the CLI's own runs, a
sweep and the browser: tests/test_compare_ui.py): the columns, an older run's peak, the objective column,
and the refusals (exit code 2, one line)."""

from __future__ import annotations

import subprocess
import sys

from mlflow import MlflowClient

from conftest import log_recorded_model


def compare(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tamrun.compare", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_table_shows_the_objective_and_an_older_runs_peak_in_mib(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    experiment = client.create_experiment("tamrun")
    older = client.create_run(experiment, run_name="fourier-national", tags={"device": "cpu"}).info.run_id
    for key, value in {"rmse_test": 1655.2345, "mape_test": 2.04056, "fit_seconds": 0.41234,
                       "peak_memory_bytes": 3 * 2**20}.items():
        client.log_metric(older, key, value)
    client.log_param(older, "route", "cg")
    newer = client.create_run(experiment, run_name="fourier-national split.validation_start=2023-01-01").info.run_id
    client.log_metric(newer, "rmse_validation", 0.123456)
    done = compare("--store", store, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header, first, second = [line for line in done.stdout.splitlines() if line.startswith(("name", "fourier"))]
    assert header.split()[:4] == ["name", "status", "rmse_validation", "rmse_test"]  # the objective first
    assert first.split()[2:4] == ["RUNNING", "0.1235"]
    assert second.split()[2:11] == ["-", "1655", "2.041", "-", "0.4123", "3", "cg", "cpu", "-"]


def test_a_missing_store_a_missing_experiment_and_no_count_exit_2(tmp_path):
    missing = compare(cwd=tmp_path)  # the default store: ./outputs/mlflow.db, not created
    assert missing.returncode == 2 and missing.stderr.startswith("tamrun: config error: --store=")
    assert "no MLflow store at" in missing.stderr and not (tmp_path / "outputs").exists()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(store).create_experiment("other")
    for args, field in ((["--experiment", "tamrun"], "--experiment='tamrun'"), (["-n", "0"], "--last=0")):
        done = compare("--store", store, *args, cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and field in done.stderr, done.stderr


def ranked_store(tmp_path):
    """Four runs: three FINISHED with rmse_validation 2.0, 1.5, 1.7 and one FAILED with 0.5."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    experiment = client.create_experiment("tamrun", artifact_location=(tmp_path / "artifacts").as_uri())
    ids = {}
    for name, value, status in (("a", 2.0, "FINISHED"), ("b", 1.5, "FINISHED"), ("failed", 0.5, "FAILED"),
                                ("c", 1.7, "FINISHED")):
        run = client.create_run(experiment, run_name=name).info.run_id
        client.log_metric(run, "rmse_validation", value)
        client.log_metric(run, "rmse_test", 10 - value)
        client.set_terminated(run, status)
        ids[name] = run
    return store, ids


def test_sort_ranks_least_first_marks_the_best_finished_run_and_names_it(tmp_path):
    store, ids = ranked_store(tmp_path)
    done = compare("--store", store, "--sort", "rmse_validation", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header, *rows = [line.split() for line in done.stdout.split("\n\n")[1].splitlines()]
    assert header[:4] == ["best", "name", "status", "rmse_validation"]
    assert [cells[1] for cells in rows if cells[0] == "*"] == ["b"]  # the best marked, alone
    names = [cells[1] if cells[0] == "*" else cells[0] for cells in rows]
    assert names == ["b", "c", "a", "failed"]  # the failed run's lower value does not win: it comes last
    assert "best on rmse_validation (least first)" in done.stdout and "'b' rmse_validation=1.5: " in done.stdout
    assert f"/runs/{ids['b']}" in done.stdout and "its model: none logged" in done.stdout
    most = compare("--store", store, "--sort", "rmse_validation", "--descending", "--best", cwd=tmp_path)
    assert most.returncode == 0 and f"run_id: {ids['a']}" in most.stdout, most.stdout + most.stderr
    on_test = compare("--store", store, "--sort", "rmse_test", "--best", cwd=tmp_path)
    assert f"run_id: {ids['b']}" not in on_test.stdout and f"run_id: {ids['a']}" in on_test.stdout
    assert "leaks the test period" in on_test.stdout  # choosing on a test metric is said to leak


def test_the_best_without_sort_is_chosen_on_the_validation_metric_and_refusals_exit_2(tmp_path):
    store, ids = ranked_store(tmp_path)
    best = compare("--store", store, "--best", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    assert best.stdout.splitlines()[1:] == [f"run_id: {ids['b']}", "run_name: b", "model_uri: -"]
    for args, field in ((["--sort", "rmse_tst"], "--sort='rmse_tst'"),
                        (["--best", "--register", "load"], "--register='load'"),
                        (["--best", "--filter", "metrics.rmse_validation < 1"], "--sort='rmse_validation'")):
        done = compare("--store", store, *args, cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and field in done.stderr, done.stderr
    assert "e.g. rmse_test" in compare("--store", store, "--sort", "rmse_tst", cwd=tmp_path).stderr
    assert not MlflowClient(store).search_registered_models()  # nothing registered by the refusals


def test_a_count_beyond_mlflow_s_search_limit_is_refused_naming_n(tmp_path, capsys):
    """Issue 58: ``-n 1000000000000`` was MLflow's traceback (max_results at most 50000), exit 1."""
    store, _ = ranked_store(tmp_path)
    done = compare("--store", store, "-n", "1000000000000", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("tamrun: config error: --last=1000000000000: a count outside 1 .. 50000 (MLflow "
                                  "returns at most 50000 runs in one search). Fix: give -n a count from 1 to 50000")
    for count in ("50001", "-3"):
        code, _, err = compare_here(capsys, "--store", store, "-n", count)
        assert code == 2 and len(err) == 1 and err[0].startswith(f"tamrun: config error: --last={count}: a count"), err
    assert compare_here(capsys, "--store", store, "-n", "50000")[0] == 0


def model_store(tmp_path):
    """`ranked_store` with a LoggedModel of the best run, 'b': its one file (an MLmodel naming it) under
    tmp_path, recorded in the store as a run records its model's files (`tamrun.tracking.model_files`), so
    that registering's check of its files passes."""
    store, ids = ranked_store(tmp_path)
    client = MlflowClient(store)
    log_recorded_model(client, client.get_run(ids["b"]).info.experiment_id, ids["b"], tmp_path / "model")
    return store, ids


def compare_here(capsys, *args: str):
    """``python -m tamrun.compare`` in this process: (exit code, stdout, its ``tamrun:`` lines on stderr;
    MLflow's own log lines apart)."""
    from tamrun.compare.__main__ import main

    try:
        main(list(args))
        code = 0
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if line.startswith("tamrun:")]


# (the options, the start of the one line), each refused before anything is registered
REFUSED_NAMES = [
    (["--register", ""], "--register='': an empty name. Fix: "),
    (["--register", "a/b"], "--register='a/b': the name holds '/': "),
    (["--register", "a@b"], "--register='a@b': the name holds '@': "),
    (["--register", 'a"b'], "--register='a\"b': the name holds '\"': "),
    (["--register", " ab"], "--register=' ab': the name starts with '.', '-' or a space"),
    (["--register", "x" * 300], "--register='xxx"),
    (["--register", "ok", "--alias", "v1"], "--alias='v1': MLflow's registry refuses it as an alias"),
    (["--register", "ok", "--alias", "a b"], "--alias='a b': MLflow's registry refuses it as an alias"),
]


def test_a_name_the_registry_cannot_take_is_refused_before_anything_is_registered(tmp_path, capsys):
    """Issue 58: ``--register "a'b"`` was a traceback, exit 1, with the model a'b registered anyway; an
    alias MLflow refused left a version registered without it. Odd names MLflow takes and that are safe
    in a models:/ URI (any script, inner spaces, dots) are registered."""
    store, ids = model_store(tmp_path)
    done = compare("--store", store, "--best", "--register", "a'b", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("tamrun: config error: --register=\"a'b\": the name holds \"'\": a registered "
                                  "model's name here is letters, digits") and "Fix: use a name such as 'a-b'" in done.stderr
    for options, start in REFUSED_NAMES:
        code, out, err = compare_here(capsys, "--store", store, "--best", *options)
        assert code == 2 and len(err) == 1 and err[0].startswith(f"tamrun: config error: {start}"), err
    client = MlflowClient(store)
    assert not client.search_registered_models()  # nothing registered by any refusal
    for name in ("modèle ventes", "模型", "load-fc.v2_b"):
        code, out, err = compare_here(capsys, "--store", store, "--best", "--register", name)
        assert code == 0 and f"registered: {name} version 1, alias {name}@champion" in out, err
        assert client.get_model_version_by_alias(name, "champion").run_id == ids["b"]


def test_a_sweep_id_with_a_quote_is_refused_naming_sweep(tmp_path, capsys):
    store, _ = ranked_store(tmp_path)
    code, _, err = compare_here(capsys, "--store", store, "--sweep", "a'b")
    assert code == 2 and len(err) == 1 and err[0].startswith("tamrun: config error: --sweep=\"a'b\": not a sweep id"), err


def test_a_store_server_that_does_not_answer_names_store_not_tracking_uri(capsys):
    """``--store http://bob:pw@127.0.0.1:9`` (the discard port, where nothing listens, as the other tests of
    an unanswered server): the error names the option the URI came from (``--store``), its fix says to pass
    another, and the password is masked."""
    port = 9
    code, _, err = compare_here(capsys, "--store", f"http://bob:Pw9xq2zz@127.0.0.1:{port}")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"tamrun: config error: --store='http://bob:***@127.0.0.1:{port}': the tracking server "
                             f"127.0.0.1:{port} does not answer"), err
    assert "or pass --store with a store that answers" in err[0] and "Pw9xq2zz" not in err[0], err


def test_a_sweep_names_the_job_its_parent_crowned_by_the_old_tag_best_run_id_too(tmp_path, capsys):
    """A sweep's parent recorded before 2026-11-29 names its best job by the tag ``best_run_id`` (now
    ``best_run``): ``--sweep last`` names that job from either; the new tag wins where a parent has both."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    experiment = client.create_experiment("tamrun", artifact_location=(tmp_path / "artifacts").as_uri())
    sweep = "0123456789ab"
    parent = client.create_run(experiment, run_name="sweep-0123456789ab", tags={
        "sweep_id": sweep, "sweep_role": "parent", "sweep_selection": "best on rmse_validation"}).info.run_id
    jobs = {}
    for job, (name, value) in enumerate((("k=4", 2.0), ("k=8", 1.5))):
        jobs[name] = client.create_run(experiment, run_name=name, tags={
            "sweep_id": sweep, "sweep_job": str(job), "mlflow.parentRunId": parent}).info.run_id
        client.log_metric(jobs[name], "rmse_validation", value)
        client.set_terminated(jobs[name])
    code, out, err = compare_here(capsys, "--store", store, "--sweep", "last")
    assert code == 0 and "the sweep's best job" not in out, (out, err)  # a parent that crowned none
    client.set_tag(parent, "best_run_id", jobs["k=8"])  # as an older tamrun tagged it
    code, out, err = compare_here(capsys, "--store", store, "--sweep", "last")
    assert code == 0 and f"the sweep's best job (best on rmse_validation): 'k=8' (run {jobs['k=8']})" in out, (out, err)
    client.set_tag(parent, "best_run", jobs["k=4"])
    code, out, err = compare_here(capsys, "--store", store, "--sweep", "last")
    assert code == 0 and f"the sweep's best job (best on rmse_validation): 'k=4' (run {jobs['k=4']})" in out, (out, err)
