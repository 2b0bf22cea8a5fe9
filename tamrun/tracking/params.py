"""MLflow parameters of a run: the knobs a user set or a preset chose, flattened.

A run's params are what tells two runs apart in the MLflow UI, so they hold the experiment's settings
only (`experiment_params`):

- a setting whose value differs from the schema's default (`tamrun.config.schema.Config`): set on
  the command line or by a preset (``model/*.yaml``, ``data/*.yaml``, an experiment);
- the settings every comparison needs (`ALWAYS`: the model, the data, the mode, the solver, the
  dtype, the device asked for and the split's dates), even at their defaults;
- the active mode's own section whole (``adaptive.*`` in ``mode=adaptive``, ``backtest.*`` in
  ``mode=backtest``), nothing of the other
  modes' (``adaptive.*`` in ``mode=run``), and of ``adaptive.*`` the active method's settings only
  (``adaptive.kalman.*`` with ``adaptive.method=kalman``, the window settings with ``sliding``);
- nothing about where and how the run is recorded (`NEVER`: ``tracking.*``, ``progress``), nor the
  machine classes and their prices (``tco.*``: they price the run, the cost_usd metric says it); null
  settings are left out.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, Mapping

# MLflow's limits on a parameter's key and value (mlflow.utils.validation).
MAX_PARAM_VALUE = 6000
MAX_PARAM_KEY = 250
# Logged whatever their value: the axes every comparison of runs needs.
ALWAYS = ("model.name", "data.name", "data.target", "data.group", "mode.name", "solver.name", "dtype", "hw.device",
          "split.train_start", "split.train_end", "split.validation_start", "split.validation_end", "split.test_start",
          "split.test_end")
# Never logged as params: where and how the run is recorded, not what it computes.
NEVER = ("tracking.", "progress", "hydra.", "tco.")
# Config sections of one mode only (mode name -> key prefix).
MODE_SECTIONS = {"adaptive": "adaptive.", "backtest": "backtest."}
# Settings of one adaptive method only (adaptive.method -> key prefixes): the other method's are left out.
ADAPTIVE_METHODS = {
    "sliding": ("adaptive.window", "adaptive.step", "adaptive.horizon", "adaptive.refresh",
                "adaptive.max_batch_windows", "adaptive.keep_coefficients"),
    "kalman": ("adaptive.kalman.",),
}


def flatten(tree: Any, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay as one value."""
    out: Dict[str, Any] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        if not tree and prefix:
            out[prefix[:-1]] = "{}"
    else:
        out[prefix[:-1]] = tree
    return out


def as_param_value(value: Any) -> str:
    """A value as MLflow stores it (enums by name, None as 'null'), cut to MLflow's limit."""
    if isinstance(value, Enum):
        value = value.value
    text = "null" if value is None else str(value)
    return text if len(text) <= MAX_PARAM_VALUE else text[: MAX_PARAM_VALUE - 3] + "..."


def to_params(tree: Any) -> Dict[str, str]:
    """Flattened, stringified parameters within MLflow's key and value limits."""
    return {key[:MAX_PARAM_KEY]: as_param_value(value) for key, value in flatten(tree).items()}


def experiment_params(resolved: Mapping[str, Any], defaults: Mapping[str, Any]) -> Dict[str, Any]:
    """The params of a run (see the module doc): ``resolved`` is its config and ``defaults`` the
    schema's, both as plain nested containers; returns flat ``{key: value}``."""
    flat, base = flatten(resolved), flatten(defaults)
    mode = str(flat.get("mode.name", "run"))
    skipped = NEVER + tuple(prefix for name, prefix in MODE_SECTIONS.items() if name != mode)
    method = str(flat.get("adaptive.method", "sliding"))
    skipped += tuple(key for name, keys in ADAPTIVE_METHODS.items() if name != method for key in keys)
    active = MODE_SECTIONS.get(mode, "\0")
    kept: Dict[str, Any] = {}
    for key, value in flat.items():
        if key.startswith(skipped):
            continue
        set_here = value is not None and value != "{}" and (key not in base or base[key] != value)
        if key in ALWAYS or set_here or (key.startswith(active) and value is not None):
            kept[key] = value
    return kept
