"""A sweep's run names, its parent's choice of a best job and its objective plot, without Hydra's
launch: the names from the sweep's command line, the summary from runs in a real sqlite store
(`close_sweep`, as the callback calls it), the plot's data from a summary table."""

from __future__ import annotations

import logging
import math

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.tracking.artifacts.plots import sweep_objective_figure, sweep_objective_panels
from tamrun.tracking.sweep_record.sweep_summary import close_sweep
from tamrun.tracking.sweep_record.sweep_names import MAX_RUN_NAME, job_run_name, job_values, swept_keys, value_tags

GROUPS = ["model", "data", "hw", "solver"]


def names(command, jobs, sweeper_params=None, grid=True):
    """The run names of ``jobs`` (each a job's overrides) of a sweep launched with ``command``."""
    swept = swept_keys(command, sweeper_params, GROUPS, grid)
    return [job_run_name(swept, num, job_values(job, swept.labels), "fourier-national")
            for num, job in enumerate(jobs)]


def test_a_grid_sweep_names_each_job_by_the_values_that_vary_only():
    command = ["model=fourier,spline", "model.effects.toy.ap=-3,-4", "solver.tol=1e-8", "tracking.uri=x"]
    jobs = [[f"model={m}", f"model.effects.toy.ap={a}", "solver.tol=1e-8", "tracking.uri=x"]
            for m in ("fourier", "spline") for a in (-3, -4)]
    assert names(command, jobs) == ["fourier · ap=-3", "fourier · ap=-4", "spline · ap=-3", "spline · ap=-4"]


def test_fields_with_the_same_last_part_keep_enough_of_their_key_to_differ():
    command = ["model.effects.toy.ap=-3,-4", "model.effects.day.ap=range(1,3)", "+model.effects.sx.k=6,8"]
    job = ["model.effects.toy.ap=-3", "model.effects.day.ap=1", "+model.effects.sx.k=6"]
    assert names(command, [job]) == ["toy.ap=-3 · day.ap=1 · k=6"]


@pytest.mark.parametrize("command,params,grid,values", [
    (["+model.effects.sx.column=x,nowhere,x"], None, True, ["x", "nowhere", "x"]),     # a value listed twice
    (["seed=1"], {"model.effects.toy.ap": "interval(-9, 1)"}, False, ["-4.187364987198273"] * 3),  # optuna
    (["seed=1"], None, True, ["1", "1", "1"]),                                           # nothing swept
], ids=["repeated-value", "sampling-sweeper", "nothing-swept"])
def test_the_job_number_tells_jobs_apart_when_their_values_may_not(command, params, grid, values):
    key = next(iter(params)) if params else command[0].split("=")[0].lstrip("+")
    jobs = [[f"{key}={value}"] for value in values]
    got = names(command, jobs, params, grid)
    assert len(set(got)) == len(got) and all(name.endswith(f" #{num}") for num, name in enumerate(got))
    if params:
        assert got[0] == "ap=-4.18736 #0"


def test_a_long_name_is_cut_within_the_limit_and_keeps_the_job_number():
    long_values = ["x" * 60 + "1", "x" * 60 + "2"]
    got = names(["+model.effects.a.column=" + ",".join(long_values), "model.effects.b.ap=-3,-4"],
                [[f"+model.effects.a.column={v}", "model.effects.b.ap=-3"] for v in long_values])
    assert got == [f"column={'x' * 23}… · ap=-3 #0", f"column={'x' * 23}… · ap=-3 #1"]
    # six keys: the name is cut at MAX_RUN_NAME, the last key's values (the ones that differ) with it
    keys = [f"model.effects.e{i}.column" for i in range(6)]
    command = [f"{key}=long_column_name_{i},other" for i, key in enumerate(keys)]
    jobs = [[f"{key}=long_column_name_{i}" for i, key in enumerate(keys[:-1])] + [f"{keys[-1]}={v}"]
            for v in ("long_column_name_5", "other")]
    got = names(command, jobs)
    assert len(set(got)) == 2 and all(len(n) == MAX_RUN_NAME and n.endswith(f"… #{j}") for j, n in enumerate(got))
    assert value_tags({"model@odd:key": "v"}) == {"sweep.model_odd_key": "v"}  # MLflow's tag keys: no @, no :


# --- the parent's summary on a real store --------------------------------------------------------


def recorded_sweep(tmp_path, jobs, objective, asked):
    """A parent run and one child run per ``(status, metrics, k)`` in a sqlite store, and the sweep
    file's content that `close_sweep` reads."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("sweep")
    parent = client.create_run(experiment, run_name="sweep-abc", tags={"sweep_id": "abc"}).info.run_id
    children = []
    for num, (status, metrics, k) in enumerate(jobs):
        tags = {"sweep_id": "abc", "sweep_job": str(num), "mlflow.parentRunId": parent,
                **value_tags({"model.effects.sx.k": str(k)})}
        run_id = client.create_run(experiment, run_name=f"k={k}", tags=tags).info.run_id
        for name, value in metrics.items():
            client.log_metric(run_id, name, value)
        client.set_terminated(run_id, status=status)
        children.append(run_id)
    info = {"sweep_id": "abc", "parent_run_id": parent, "experiment_id": experiment, "tracking_uri": uri,
            "busy_timeout_s": 5.0, "lock_timeout_s": 5.0, "objective": objective, "objective_asked": asked,
            "swept": {"model.effects.sx.k": "k"}, "numbered": False}
    return client, info, children


JOBS = [("FINISHED", {"rmse_validation": 2.0, "rmse_test": 1.0}, 6),
        ("FINISHED", {"rmse_validation": 1.5, "rmse_test": 3.0}, 8),
        ("FAILED", {"rmse_validation": 0.5}, 10),  # logged a metric, then failed: never the best
        ("FINISHED", {"rmse_validation": 1.7, "rmse_test": 2.0}, 12)]


def test_with_a_validation_split_the_best_job_is_the_least_validation_rmse_of_the_finished_ones(tmp_path, caplog):
    client, info, children = recorded_sweep(tmp_path, JOBS, "rmse_validation", asked=False)
    caplog.set_level(logging.INFO, logger="tamrun.tracking.sweep_record.sweep_summary")
    table = close_sweep(info)
    # the sweep's line names the chosen job, its metric and its page
    assert (f"best on rmse_validation: job 1 'k=8' rmse_validation=1.5: http://127.0.0.1:5000/#/experiments/"
            f"{info['experiment_id']}/runs/{children[1]}; summary in run {info['parent_run_id']}") in caplog.text
    parent = client.get_run(info["parent_run_id"]).data
    assert parent.tags["best_run"] == children[1] and parent.tags["best_job"] == "k=8"
    # the objective and the job's other decisive metrics, so that the parent's row shows them (issue 61)
    assert {k: v for k, v in parent.metrics.items() if k.startswith("best")} == {"best_rmse_validation": 1.5,
                                                                                 "best_rmse_test": 3.0}
    assert not any(key.startswith("best_on_test") for key in [*parent.tags, *parent.metrics])
    assert parent.tags["sweep_selection"] == "best on rmse_validation"
    assert parent.metrics["sweep_failed_jobs"] == 1 and parent.tags["sweep_failed_jobs"] == "1 of 4 (job(s) 2)"
    assert "3 finished, 1 did not (job 2 FAILED)" in parent.tags["mlflow.note.content"]
    assert table["model.effects.sx.k"].tolist() == ["6", "8", "10", "12"]
    assert table["status"].tolist() == ["FINISHED", "FINISHED", "FAILED", "FINISHED"]


def test_without_a_validation_split_no_best_is_crowned_on_the_test_year(tmp_path, caplog):
    jobs = [(status, {n: v for n, v in metrics.items() if n == "rmse_test"}, k) for status, metrics, k in JOBS]
    client, info, _ = recorded_sweep(tmp_path, jobs, "rmse_test", asked=False)
    caplog.set_level(logging.INFO, logger="tamrun.tracking.sweep_record.sweep_summary")
    table = close_sweep(info)
    parent = client.get_run(info["parent_run_id"])
    assert not any(key.startswith("best") for key in [*parent.data.tags, *parent.data.metrics])
    assert parent.data.tags["sweep_selection"].startswith("none: rmse_test is a test metric")
    assert table["rmse_test"].tolist()[:2] == [1.0, 3.0]  # the summary still lists the test metrics
    assert "no best run chosen" in caplog.text and parent.info.status == "FAILED"  # job 2 failed
    assert "1 not FINISHED; none: rmse_test is a test metric and the split has no validation period; summary" \
        in caplog.text
    artifacts = {a.path for a in client.list_artifacts(info["parent_run_id"], "sweep")}
    assert {"sweep/summary.csv", "sweep/summary.md", "sweep/objective.png"} <= artifacts


def test_a_test_metric_asked_for_is_crowned_as_such_with_a_warning(tmp_path, caplog):
    client, info, children = recorded_sweep(tmp_path, JOBS, "rmse_test", asked=True)
    caplog.set_level(logging.WARNING, logger="tamrun.tracking.sweep_record.sweep_summary")
    close_sweep(info)
    parent = client.get_run(info["parent_run_id"]).data
    assert parent.tags["best_on_test_run"] == children[0] and parent.metrics["best_on_test_rmse_test"] == 1.0
    assert parent.tags["best_on_test_job"] == "k=6" and parent.metrics["best_on_test_rmse_validation"] == 2.0
    assert "best_run" not in parent.tags and "best_rmse_test" not in parent.metrics
    assert "leaks" in caplog.text and "leaks" in parent.tags["sweep_selection"]


# --- the objective plot's data -------------------------------------------------------------------


def test_the_objective_is_plotted_against_the_swept_values():
    table = pd.DataFrame({"job": [0, 1, 2, 3], "status": ["FINISHED", "FINISHED", "FAILED", "FINISHED"],
                          "model": ["fourier", "fourier", "spline", "spline"],
                          "model.effects.sx.k": ["6", "10", "6", "10"],
                          "rmse_validation": [2.0, 1.0, math.nan, 1.5]})
    by_model, by_k = sweep_objective_panels(table, "rmse_validation", ["model", "model.effects.sx.k"])
    assert by_k["param"] == "model.effects.sx.k" and by_k["x"] == [6.0, 10.0, 6.0, 10.0] and by_k["ticks"] is None
    assert by_model["ticks"] == ["fourier", "spline"] and by_model["x"] == [0.0, 0.0, 1.0, 1.0]
    assert by_k["y"][:2] == [2.0, 1.0] and by_k["failed"] == [False, False, True, False]
    figure = sweep_objective_figure(table, "rmse_validation", ["model", "model.effects.sx.k"], best_job=1)
    axes = [a for a in figure.axes if a.get_visible()]
    assert [a.get_xlabel() for a in axes] == ["model", "model.effects.sx.k"]
    assert "failed: job(s) 2" in figure.get_suptitle()


def test_without_swept_keys_the_objective_is_plotted_by_job_number():
    table = pd.DataFrame({"job": [0, 1], "status": ["FINISHED", "FAILED"], "rmse_test": [1.0, math.nan]})
    (panel,) = sweep_objective_panels(table, "rmse_test", [])
    assert panel["param"] == "job" and panel["x"] == [0.0, 1.0] and panel["failed"] == [False, True]
