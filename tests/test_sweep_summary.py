"""A sweep's run names, without Hydra's launch: the names from the sweep's command line."""

from __future__ import annotations

import pytest

from tamrun.tracking.sweep_names import MAX_RUN_NAME, job_run_name, job_values, swept_keys, value_tags

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
