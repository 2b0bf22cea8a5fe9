"""The params a run logs: the experiment's settings, not the schema's untouched defaults."""

from __future__ import annotations

from tamrun.config.load import resolved_container
from tamrun.config.schema import Config
from tamrun.tracking.params import ALWAYS, experiment_params


def settings(mode: str = "run") -> dict:
    config = Config()
    config.mode.name = mode
    config.memory.safety_margin = "32MiB"  # set by the user
    config.tracking.uri = "sqlite:///x.db"  # set, but where the run is recorded is not a param
    tree = resolved_container(config)
    tree["model"] = {"name": "fourier", "effects": {"toy": {"kind": "fourier", "column": "toy", "m": 6, "ap": -3,
                                                              "k": None}}}
    return tree


def test_params_are_what_was_set_and_the_axes_of_every_comparison():
    params = experiment_params(settings(), resolved_container(Config()))
    assert params["memory.safety_margin"] == "32MiB" and params["model.effects.toy.m"] == 6
    assert set(ALWAYS) - {"split.train_start", "split.validation_start", "split.validation_end"} <= set(params)
    assert "split.validation_start" in params and params["split.validation_start"] is None  # an axis, even unset
    assert "model.effects.toy.k" not in params  # null: not a setting
    assert not [k for k in params if k.startswith(("tracking.", "adaptive.", "progress"))]
    assert "memory.dense_fraction" not in params  # the schema's default, untouched


def test_the_active_mode_logs_its_whole_section():
    params = experiment_params(settings("adaptive"), resolved_container(Config()))
    assert params["adaptive.window"] == Config().adaptive.window and params["mode.name"] == "adaptive"


def test_the_active_adaptive_method_logs_its_settings_only():
    sliding = experiment_params(settings("adaptive"), resolved_container(Config()))
    assert "adaptive.window" in sliding and not [k for k in sliding if k.startswith("adaptive.kalman.")]
    tree = settings("adaptive")
    tree["adaptive"]["method"] = "kalman"
    kalman = experiment_params(tree, resolved_container(Config()))
    assert kalman["adaptive.kalman.q"] == Config().adaptive.kalman.q and kalman["adaptive.method"] == "kalman"
    assert not [k for k in kalman if k.startswith(("adaptive.window", "adaptive.step", "adaptive.refresh"))]
