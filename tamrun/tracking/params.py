"""Flatten a nested config into MLflow parameters."""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, Mapping

# MLflow's limits on a parameter's key and value (mlflow.utils.validation).
MAX_PARAM_VALUE = 6000
MAX_PARAM_KEY = 250


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
