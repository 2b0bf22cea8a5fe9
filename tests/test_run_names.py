"""Runs named apart: a single run's name says what its command line changed from the presets, identical
reruns are numbered in the order they started (tamrun/tracking/run_names.py), against a real sqlite store."""

from __future__ import annotations

from mlflow import MlflowClient

from tamrun.config.schema import TrackingConfig
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tracking.run_names import run_name


def test_the_name_says_what_the_command_line_changed():
    assert run_name("fourier", "national") == "fourier-national"
    assert run_name("fourier", "national", ["model.effects.toy.m=8"], "cuda") == "fourier-national toy.m=8 cuda"
    assert run_name("spline", "national", ["model=spline", "solver=cg", "hw=cpu", "dtype=float32"]) == \
        "spline-national cg cpu dtype=float32"
    assert run_name("fourier", "national", ["memory.limit=2GiB", "hw=cuda"], "cuda") == \
        "fourier-national memory.limit=2GiB cuda"  # the device once, as the command named it
    assert run_name("custom", "csv", ["data=csv", "data.path=/home/me/data/my.csv", "data.group=null"]) == \
        "custom-csv data.path=my.csv data.group=null"  # a path by its file's name
    assert run_name("fourier", "national", ["~model.effects.toy", "+experiment=day_ahead", "seed=3"]) == \
        "fourier-national ~effects.toy day_ahead seed=3"


def test_what_changes_nothing_computed_is_not_in_the_name():
    overrides = ["tracking.uri=sqlite:///x.db", "tracking.log_plots=false", "progress=off", "model=fourier"]
    assert run_name("fourier", "national", overrides) == "fourier-national"


def test_a_long_name_is_cut_but_keeps_its_device():
    name = run_name("custom", "csv", [f"+model.effects.e{i}={{kind: spline, column: x{i}, k: 10}}" for i in range(6)],
                    "cuda")
    assert len(name) <= 96 and name.endswith("… cuda")


def _tracked(store: str, name: str, **settings) -> TrackedRun:
    return TrackedRun(TrackingConfig(uri=store, **settings), run_name=name, tags={}, number_reruns=True)


def test_identical_reruns_are_numbered_and_other_names_are_not(store_uri):
    names = []
    for name in ["fourier-national", "fourier-national", "fourier-national toy.m=8", "fourier-national"]:
        with _tracked(store_uri, name) as tracked:
            names.append(tracked.run_name)
    assert names == ["fourier-national", "fourier-national #2", "fourier-national toy.m=8", "fourier-national #3"]
    client = MlflowClient(store_uri)
    stored = [r.info.run_name for r in client.search_runs([tracked.experiment_id], order_by=["attributes.start_time"])]
    assert stored == names


def test_a_name_the_user_set_is_kept_as_it_is(store_uri):
    for _ in range(2):
        with _tracked(store_uri, "fourier-national", run_name="baseline") as tracked:
            assert tracked.run_name == "baseline"
