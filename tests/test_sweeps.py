"""Multirun sweeps as users run them: the CLI in a subprocess, real launchers, a real sqlite store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient

from tamrun.config.load import config_dir
from tamrun.config.store import register_configs
from tamrun.tracking.sweep_record.sweep_files import SWEEP_FILE

from conftest import csv_overrides
from test_cli import tamrun

# A model preset of the user's own (one spline effect on the synthetic CSV), found through
# hydra.searchpath: a sweeper can then tune its fields (optuna sets them before any `+key=`).
SYN_MODEL = """name: syn
effects:
  sx: {kind: spline, column: x, k: 10, ap: -6}
"""


def sweep_args(csv_path: Path, store: str, sweep_dir: Path) -> list:
    """The CSV, the user's model, one thread per job (2 cores in CI), the store and the sweep folder."""
    conf = sweep_dir.parent / "user_conf"
    (conf / "model").mkdir(parents=True, exist_ok=True)
    (conf / "model" / "syn.yaml").write_text(SYN_MODEL)
    data = [o for o in csv_overrides(csv_path) if not o.startswith(("model=", "+model."))]
    return [f"tracking.uri={store}", f"hydra.sweep.dir={sweep_dir}", f"hydra.searchpath=[file://{conf}]",
            "model=syn", "hw.threads=1", *data]


def sweep_runs(store: str, sweep_dir: Path):
    """(parent run, child runs by job number) of the sweep recorded in ``sweep_dir``."""
    info = json.loads((sweep_dir / SWEEP_FILE).read_text())
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([info["experiment_id"]], filter_string=f"tags.sweep_id = '{info['sweep_id']}'")
    parent = [r for r in runs if r.info.run_id == info["parent_run_id"]]
    children = sorted((r for r in runs if r.info.run_id != info["parent_run_id"]),
                      key=lambda r: int(r.data.tags["sweep_job"]))
    return client, parent[0], children


def test_a_parallel_sweep_records_every_job_under_one_parent(tmp_path, csv_path):
    """4 jobs, 2 processes at once (hydra/launcher=parallel, joblib's loky), one sqlite store."""
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    done = tamrun("-m", "hydra/launcher=parallel", *sweep_args(csv_path, store, sweep_dir),
                  "model.effects.sx.k=6,8,10,12", "tracking.log_plots=false", "tracking.log_model=false",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Joblib.Parallel(n_jobs=2,backend=loky" in done.stdout + done.stderr
    assert "workers forked from this process" in done.stdout + done.stderr  # hw.fork_workers (default)
    assert "should not be used with `loky`" not in done.stderr
    client, parent, children = sweep_runs(store, sweep_dir)
    assert [r.info.status for r in children] == ["FINISHED"] * 4
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert [r.data.params["model.effects.sx.k"] for r in children] == ["6", "8", "10", "12"]
    assert parent.info.status == "FINISHED" and parent.data.metrics["sweep_jobs"] == 4
    summary = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/summary.csv", str(tmp_path)))
    assert summary["job"].tolist() == [0, 1, 2, 3] and set(summary["status"]) == {"FINISHED"}
    for row, run in zip(summary.itertuples(), children):
        assert row.run_id == run.info.run_id
        assert row.rmse_test == pytest.approx(run.data.metrics["rmse_test"], rel=1e-12)
        assert "model.effects.sx.k=" in row.overrides
    # each run named by its swept value; no validation split: the test year crowns no best run
    assert [r.info.run_name for r in children] == ["k=6", "k=8", "k=10", "k=12"]
    assert [r.data.tags["sweep.model.effects.sx.k"] for r in children] == ["6", "8", "10", "12"]
    assert summary["model.effects.sx.k"].tolist() == [6, 8, 10, 12] and summary["rmse_test"].notna().all()
    assert not any(key.startswith("best") for key in [*parent.data.tags, *parent.data.metrics])
    assert parent.data.tags["sweep_selection"].startswith("none: rmse_test is a test metric")
    assert "sweep/objective.png" in {a.path for a in client.list_artifacts(parent.info.run_id, "sweep")}
    assert "| job | run_id |" in (Path(client.download_artifacts(parent.info.run_id, "sweep/summary.md",
                                                                     str(tmp_path)))).read_text()


def test_fresh_loky_workers_give_the_same_jobs_as_forked_ones(tmp_path, csv_path):
    """hw.fork_workers=false: joblib's own fresh interpreters; the same runs, metric for metric, as the
    forked workers of the default."""
    results = {}
    for fork in ("true", "false"):
        store, sweep_dir = f"sqlite:///{tmp_path / fork / 'mlflow.db'}", tmp_path / fork / "sweep"
        (tmp_path / fork).mkdir()
        done = tamrun("-m", "hydra/launcher=parallel", f"hw.fork_workers={fork}", *sweep_args(csv_path, store, sweep_dir),
                      "model.effects.sx.k=6,8", "tracking.log_plots=false", "tracking.log_model=false", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert ("workers forked from this process" in done.stdout + done.stderr) == (fork == "true")
        _, _, children = sweep_runs(store, sweep_dir)
        assert [r.info.status for r in children] == ["FINISHED"] * 2
        results[fork] = [r.data.metrics["rmse_test"] for r in children]
    assert results["true"] == results["false"]


def optuna_sweep(tmp_path: Path, csv_path: Path, trials: int, *extra: str):
    """An Optuna search (seeded, one job at a time) of the spline's penalty on a validation period carved
    out of training; (store, sweep folder) once it exited 0."""
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    done = tamrun("-m", "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.n_jobs=1",
                  "hydra.sweeper.sampler.seed=0", *extra, *sweep_args(csv_path, store, sweep_dir),
                  "split.validation_start=2020-11-01", "model.effects.sx.ap=interval(-9.0, 1.0)",
                  "tracking.log_plots=false", "tracking.log_model=false", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return store, sweep_dir


def test_optuna_minimises_the_validation_rmse_never_the_test_one(tmp_path, csv_path):
    """The optuna sweeper gets rmse_validation (a period carved out of training) as the objective."""
    store, sweep_dir = optuna_sweep(tmp_path, csv_path, 4)
    client, parent, children = sweep_runs(store, sweep_dir)
    assert len(children) == 4 and {r.info.status for r in children} == {"FINISHED"}
    validation = [r.data.metrics["rmse_validation"] for r in children]
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(min(validation), rel=1e-12)
    assert not any(math.isclose(best["best_value"], r.data.metrics["rmse_test"]) for r in children)
    assert parent.data.metrics["best_rmse_validation"] == pytest.approx(min(validation), rel=1e-12)
    assert parent.data.tags["best_run"] == children[validation.index(min(validation))].info.run_id
    # optuna may draw a value twice: the names carry the sampled value and the job number
    assert [r.info.run_name.rsplit(" #", 1)[1] for r in children] == ["0", "1", "2", "3"]
    assert all(r.info.run_name.startswith("ap=") for r in children)
    # the validation rows (Nov-Dec 2020) were not fitted: fewer training rows than the full year
    assert {r.data.metrics["system/data/n_train_rows"] for r in children} == {24 * (366 - 61)}


def test_optuna_trades_the_validation_rmse_against_the_cost_on_a_pareto_front(tmp_path, csv_path):
    """more_objectives=[cost_usd]: each job returns [rmse_validation, cost_usd] to Optuna's multi-objective
    sweeper, whose Pareto front is made of the jobs' own logged values."""
    store, sweep_dir = optuna_sweep(tmp_path, csv_path, 2, "hydra.sweeper.direction=[minimize,minimize]",
                                    "more_objectives=[cost_usd]")
    _, _, children = sweep_runs(store, sweep_dir)
    assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
    logged = [(r.data.metrics["rmse_validation"], r.data.metrics["cost_usd"]) for r in children]
    front = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())["solutions"]
    assert 1 <= len(front) <= 2
    for solution in front:  # each point of the front is a job's logged pair, exactly
        assert any(solution["values"] == pytest.approx(list(pair), rel=1e-12) for pair in logged)
    # no job dominates a point of the front on both objectives
    for solution in front:
        rmse, cost = solution["values"]
        assert not any(r < rmse and c < cost for r, c in logged)


def test_a_local_submitit_job_runs_end_to_end(tmp_path, csv_path):
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    done = tamrun("-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5",
                  *sweep_args(csv_path, store, sweep_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _, parent, children = sweep_runs(store, sweep_dir)
    assert [r.info.status for r in children] == ["FINISHED"] and parent.info.status == "FINISHED"
    assert (sweep_dir / ".submitit").is_dir()  # submitit's own job folder: it did launch the job


def compose_hydra(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("launcher,target,field,value", [
    ("parallel", "hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "backend", "loky"),
    ("slurm", "hydra_submitit_launcher.submitit_launcher.SlurmLauncher", "timeout_min", 60),
    ("ray_cluster", "tamrun_ray_launcher.ray_cluster_launcher.RayClusterLauncher", "ray",
     {"init": {"address": "auto", "log_to_driver": False},
      "remote": {"num_cpus": 4, "num_gpus": 0, "max_retries": 0}}),
])
def test_launcher_configs_compose(launcher, target, field, value):
    cfg = compose_hydra(f"hydra/launcher={launcher}")
    assert cfg.hydra.launcher._target_ == f"hydra_plugins.{target}"
    assert cfg.hydra.launcher[field] == value


def test_the_penalty_search_tunes_on_a_validation_year_before_the_test_year():
    cfg = compose_hydra("+experiment=tune_penalties")
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.n_trials >= 20
    assert all(key.endswith(".ap") for key in sweeper.params) and len(sweeper.params) >= 5
    assert cfg.objective == "rmse_validation" and cfg.model.name == "fourier"
    assert cfg.split.validation_start < cfg.split.train_end < cfg.split.test_start
    assert "tamrun.sweeps.sweep.SweepCallback" in str(cfg.hydra.callbacks)


def test_help_lists_the_groups_the_experiment_and_the_launchers(tmp_path):
    done = tamrun("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for line in ("experiment: day_ahead, day_ahead_aggregate, day_ahead_aggregate_pool, day_ahead_static, tune_penalties",
                 "mode: adaptive, aggregate, backtest, plan, run",
                 "model: calendar, custom, forest, forest_big, forest_fourier, fourier, fourier_holidays, fourier_lags, spline, "
                 "spline_holidays, spline_lags, static_day_ahead",
                 "hydra/launcher=parallel|slurm|ray_cluster|submitit_local", "docs/sweeps.md"):
        assert line in done.stdout, done.stdout[:2000]


@pytest.mark.parametrize("bad", ["model.intercept_ap=100", "+model.effects.sx.column=nowhere"],
                         ids=["refused-by-the-config-checks", "refused-by-the-data-checks"])
def test_a_bad_middle_job_fails_alone_and_the_sweep_exits_non_zero(tmp_path, csv_path, bad):
    """3 jobs, the middle one with bad input (refused before its run starts, or after): jobs 1 and 3
    FINISHED, job 2 FAILED with its error, the parent's summary lists all three, exit code 2."""
    store, sweep_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep"
    key, value = bad.lstrip("+").split("=")
    good = {"model.intercept_ap": "-9", "model.effects.sx.column": "x"}[key]
    done = tamrun("-m", *sweep_args(csv_path, store, sweep_dir), f"{key}={good},{value},{good}",
                  "tracking.log_plots=false", "tracking.log_model=false", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    kind, error = ("config", "ConfigError") if key == "model.intercept_ap" else ("data", "DataError")
    assert done.stderr.splitlines()[-1].startswith(f"tamrun: 1 of 3 sweep job(s) did not finish (job 1: {kind} error "
                                                   f"{error}); summary in run "), done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    client, parent, children = sweep_runs(store, sweep_dir)
    assert [r.info.status for r in children] == ["FINISHED", "FAILED", "FINISHED"]
    assert children[1].data.tags["error_type"] == error and value in children[1].data.tags["error"]
    assert children[1].data.tags["error_kind"] == kind
    summary = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/summary.csv", str(tmp_path)))
    assert summary["job"].tolist() == [0, 1, 2] and summary["status"].tolist() == ["FINISHED", "FAILED", "FINISHED"]
    assert parent.info.status == "FAILED"
    # the values repeat (good, bad, good): the job number keeps the names apart
    label = key.rsplit(".", 1)[1]
    assert [r.info.run_name for r in children] == [f"{label}={good} #0", f"{label}={value} #1", f"{label}={good} #2"]
    assert summary["error_type"].tolist()[1] == error and summary["error_kind"].tolist()[1] == kind
    assert parent.data.metrics["sweep_failed_jobs"] == 1
    assert parent.data.tags["sweep_failed_jobs"] == "1 of 3 (job(s) 1)"
    assert "2 finished, 1 did not (job 1 FAILED)" in parent.data.tags["mlflow.note.content"]
