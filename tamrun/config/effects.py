"""Typed specs of the model's effects and the parser from the config mapping.

A model's ``effects`` is a mapping ``name -> {kind: ..., column: ..., <kind's fields>}``; each entry
is merged into the dataclass of its kind, so a misspelt field or a wrong type is refused with the
effect's full config path. Penalties are given as ``ap`` = log10(lambda), the peer's convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tamrun.errors import ConfigError

CATEGORICAL_TOPOLOGIES = ("nominal", "fourier", "cyclic", "difference")


@dataclass
class LinearSpec:
    """f(z) = beta * scale * z on z scaled to [-1, 1]; penalty lambda * beta^2.

    ``scale`` = pi is the peer's convention, so that ``ap`` means the same penalty in both.
    """

    kind: str = "linear"
    column: str = MISSING
    scale: float = math.pi
    ap: float = -5.0


@dataclass
class FourierSpec:
    """[cos(k pi x / c), sin(k pi x / c)], k = 1..m, on x scaled to [-1, 1]; c = 1 if cyclic else 2.

    Penalty lambda * diag(1 + k^(2s)) on both the cos and the sin of frequency k (Sobolev order s).
    """

    kind: str = "fourier"
    column: str = MISSING
    m: int = 6
    s: float = 2.0
    cyclic: bool = False
    ap: float = -3.0


@dataclass
class CategoricalSpec:
    """One-hot of the level (levels learned on the training split).

    topo ``nominal``: lambda I; ``difference``: first differences between consecutive levels;
    ``cyclic``: the same with the last level next to the first; ``fourier``: the levels placed on a
    segment [-1, 1] (level i of n at z = 2i/(n-1) - 1) and described by a Fourier effect with
    m = ceil(n/2) frequencies and Sobolev order ``s`` (the peer's ``topo='fourier'``).
    """

    kind: str = "categorical"
    column: str = MISSING
    topo: str = "nominal"
    s: float = 0.0
    ap: float = -3.0


@dataclass
class SplineSpec:
    """Degree-``deg`` B-splines on ``k`` equal intervals of [-1, 1] (clamped knots): k + deg columns,
    extended linearly outside [-1, 1]. Penalty lambda * D_p' D_p with D_p the order-``p`` difference
    matrix (P-spline).
    """

    kind: str = "spline"
    column: str = MISSING
    k: int = 20
    deg: int = 3
    p: int = 2
    ap: float = -5.0


EFFECT_SPECS: Dict[str, type] = {
    "linear": LinearSpec,
    "fourier": FourierSpec,
    "categorical": CategoricalSpec,
    "spline": SplineSpec,
}


def _require(ok: bool, field: str, value: Any, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field, value, problem, fix)


def _check_ranges(spec: Any, path: str) -> None:
    _require(math.isfinite(spec.ap) and -60 <= spec.ap <= 20, f"{path}.ap", spec.ap,
             "the log10 penalty is not a finite number in [-60, 20]", "give ap as log10(lambda), e.g. -3")
    if isinstance(spec, FourierSpec):
        _require(1 <= spec.m <= 1000, f"{path}.m", spec.m, "the number of frequencies must be in [1, 1000]",
                 "set m to a positive integer such as 6")
        _require(spec.s >= 0, f"{path}.s", spec.s, "the Sobolev order must be >= 0", "set s to e.g. 2")
    elif isinstance(spec, LinearSpec):
        _require(math.isfinite(spec.scale) and spec.scale != 0, f"{path}.scale", spec.scale,
                 "the feature scale must be a finite non-zero number", "leave scale at pi (the peer's convention)")
    elif isinstance(spec, SplineSpec):
        _require(1 <= spec.deg <= 5, f"{path}.deg", spec.deg, "the spline degree must be in [1, 5]",
                 "use deg=3 (cubic)")
        _require(1 <= spec.k <= 10_000, f"{path}.k", spec.k, "the number of knot intervals must be in [1, 10000]",
                 "set k to e.g. 20")
        _require(0 <= spec.p < spec.k + spec.deg, f"{path}.p", spec.p,
                 f"the difference order must be in [0, {spec.k + spec.deg - 1}] (basis width k+deg)",
                 "use p=2")
    elif isinstance(spec, CategoricalSpec):
        _require(spec.topo in CATEGORICAL_TOPOLOGIES, f"{path}.topo", spec.topo, "unknown topology",
                 f"use one of {', '.join(CATEGORICAL_TOPOLOGIES)}")
        _require(spec.s >= 0, f"{path}.s", spec.s, "the Sobolev order must be >= 0", "set s to e.g. 2")


def parse_effect(name: str, node: Any, path_prefix: str = "model.effects") -> Any:
    """Parse one effect's config node into the dataclass of its kind (validated).

    Raises:
        ConfigError: unknown kind, unknown field, wrong type or out-of-range value.
    """
    path = f"{path_prefix}.{name}"
    if not isinstance(node, (DictConfig, Mapping)):
        raise ConfigError(path, node, "an effect must be a mapping with a 'kind' and a 'column'",
                          f"write it as {path}: {{kind: linear, column: <column>}}")
    kind = node.get("kind")
    if kind not in EFFECT_SPECS:
        raise ConfigError(f"{path}.kind", kind, "unknown effect kind",
                          f"use one of {', '.join(EFFECT_SPECS)}")
    cls = EFFECT_SPECS[kind]
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), node)
        spec = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "key", None) or getattr(exc, "full_key", None) or "?"
        allowed = ", ".join(f for f in cls.__dataclass_fields__ if f != "kind")
        value = node.get(key) if isinstance(key, str) and key in node else None
        reason = str(exc.msg).splitlines()[0]
        raise ConfigError(f"{path}.{key}", value, f"not a valid field of a {kind} effect ({reason})",
                          f"a {kind} effect takes: {allowed}") from None
    _check_ranges(spec, path)
    return spec


def parse_effects(effects: Any, path_prefix: str = "model.effects") -> Dict[str, Any]:
    """Parse a whole ``name -> spec`` mapping, keeping its order."""
    if not effects:
        raise ConfigError(path_prefix, dict(effects or {}), "the model has no effects",
                          "pick a preset (model=fourier) or add model.effects.<name>={kind:..., column:...}")
    return {str(name): parse_effect(str(name), node, path_prefix) for name, node in effects.items()}


def effect_columns(specs: Mapping[str, Any]) -> Dict[str, str]:
    """Map each effect's config path of its column to the column name (for data checks)."""
    return {f"model.effects.{name}.column": spec.column for name, spec in specs.items()}


def spec_to_dict(spec: Any) -> Dict[str, Optional[Any]]:
    """A plain dict of a spec (for logging the parsed, defaults-filled model)."""
    return dict(OmegaConf.to_container(OmegaConf.structured(spec)))
