"""The runs table's shared view (tamrun/tracking/ui_view.py): the decisive columns first, in order and
width, merged run after run on a real sqlite store. What a browser shows of it: tests/test_compare_ui.py."""

from __future__ import annotations

import json

from mlflow import MlflowClient

from tamrun.tracking.ui_view import (CREATED_COLUMN, RUN_NAME_COLUMN, RUNS_VIEW_TAG, RunsView, ensure_runs_view,
                                     runs_view)

DECISIVE = ["metrics.`rmse_test`", "metrics.`mape_test`", "metrics.`fit_seconds`", "metrics.`peak_memory_mib`",
            "params.`route`", "tags.`device`"]


def test_the_decisive_columns_come_first_and_the_others_after():
    view = runs_view(RunsView(swept_tags=("sweep.model",)))
    order = view["columnOrder"]
    assert order[:2] == [RUN_NAME_COLUMN, CREATED_COLUMN]  # the name and the status (the Created column's icon)
    assert order[2:9] == ["tags.`sweep.model`", *DECISIVE]  # the swept values first; no best job on rmse_test
    assert order[9:] == ["duration", "metrics.`cost_usd`", "attributes.`Dataset`", "attributes.`Models`",
                         "metrics.`system/memory/oom_retries`",
                         "params.`model.name`"]
    assert set(order[2:]) - {"duration"} == set(view["selectedColumns"])
    assert set(view["columnWidths"]) == {CREATED_COLUMN, *order[2:9]}


def test_a_sweep_on_a_validation_metric_shows_its_best_job_and_objective_after_the_swept_values():
    view = RunsView(("rmse_validation",), ("sweep.model",))
    assert view.decisive()[:5] == ["tags.`sweep.model`", "tags.`best_job`", "metrics.`best_rmse_validation`",
                                   "metrics.`rmse_validation`", "metrics.`rmse_test`"]
    assert RunsView.parse(json.dumps(runs_view(view))) == view  # best_<objective> is not read back as an objective
    assert "tags.`best_job`" not in RunsView(("rmse_validation",)).decisive()  # plain runs: no best job


def test_the_view_merges_the_objective_and_keeps_earlier_sweeps(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("views")

    def stored() -> dict:
        return json.loads(client.get_experiment(experiment_id).tags[RUNS_VIEW_TAG])

    ensure_runs_view(client, client.get_experiment(experiment_id), "rmse_test", ["sweep.model"])
    ensure_runs_view(client, client.get_experiment(experiment_id), "rmse_validation")  # a plain run after it
    ensure_runs_view(client, client.get_experiment(experiment_id), None, ["sweep.model.effects.toy.m"])
    columns = stored()["columnOrder"]
    assert columns[2:4] == ["tags.`sweep.model.effects.toy.m`", "tags.`sweep.model`"]  # the newest sweep first
    assert columns[4:7] == ["tags.`best_job`", "metrics.`best_rmse_validation`", "metrics.`rmse_validation`"]
    assert RunsView.parse(json.dumps(stored())) == RunsView(("rmse_validation",), ("sweep.model.effects.toy.m",
                                                                                   "sweep.model"))


def test_a_view_of_an_earlier_tamrun_keeps_its_swept_values_only():
    earlier = {"selectedColumns": ["attributes.`Dataset`", "metrics.`rmse_validation`", "metrics.`peak_memory_bytes`",
                                   "params.`route`", "tags.`sweep.model`"]}  # fixed metrics, no columnOrder
    assert RunsView.parse(json.dumps(earlier)) == RunsView((), ("sweep.model",))
