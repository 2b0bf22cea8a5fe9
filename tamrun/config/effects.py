"""Typed specs of the model's effects and the parser from the config mapping.

A model's ``effects`` is a mapping ``name -> {kind: ..., column: ..., <kind's fields>}``; each entry
is merged into the dataclass of its kind, so a misspelt field or a wrong type is refused with the
effect's full config path. Penalties are given as ``ap`` = log10(lambda), the peer's convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from omegaconf import MISSING, DictConfig

from tamrun.config.entries import typed_entry
from tamrun.config.ranges import EFFECTS, check_numbers
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
    With a ``period`` P (in the column's own units): [cos(2 pi k x / P), sin(2 pi k x / P)] on the raw
    x, whatever range the training rows cover (a calendar part: day_of_year with P = 365.25).

    Penalty lambda * diag(1 + k^(2s)) on both the cos and the sin of frequency k (Sobolev order s).
    """

    kind: str = "fourier"
    column: str = MISSING
    m: int = 6
    s: float = 2.0
    cyclic: bool = False
    period: Optional[float] = None
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


@dataclass
class ForestSpec:
    """Random binning: ``n_trees`` oblivious random trees of depth ``max_depth`` over ``column`` and
    ``others`` (scaled to [-1, 1]); each level splits on a random feature at a random threshold: a
    random quantile of its training values (``split=quantile``) or uniformly in its training range (``split=uniform``, the
    default). Phi = one-hot of each tree's leaf / sqrt(T): T non-zeros among T 2^d columns,
    kept as leaf indices, never dense. Penalty lambda I. ``seed`` None = the run's seed.
    """

    kind: str = "forest"
    column: str = MISSING
    others: List[str] = field(default_factory=list)
    n_trees: int = 50
    max_depth: int = 6
    # uniform: thresholds uniform in the feature's training range (the peer's default);
    # quantile: at a uniform random quantile of its training values.
    split: str = "uniform"
    seed: Optional[int] = None
    ap: float = -3.0


@dataclass
class CrossingSpec:
    """Row-wise Kronecker product of two effects (``left`` x ``right``), e.g. forest x fourier.

    Columns (a, b) -> a * D_right + b (a forest is always put first); penalty
    lambda (lambda_left P_left (x) I + lambda_right I (x) P_right): each side's ap weights its margin
    and the crossing's ap multiplies both (the peer's te(), whose margins default to ap=-9).
    """

    kind: str = "crossing"
    left: Any = MISSING
    right: Any = MISSING
    ap: float = -3.0


EFFECT_SPECS: Dict[str, type] = {
    "linear": LinearSpec,
    "fourier": FourierSpec,
    "categorical": CategoricalSpec,
    "spline": SplineSpec,
    "forest": ForestSpec,
    "crossing": CrossingSpec,
}


def _require(ok: bool, field: str, value: Any, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field, value, problem, fix)


def _check_ranges(spec: Any, path: str) -> None:
    """Every number against its declared range (`tamrun.config.ranges.EFFECTS`), then what depends on
    several fields or is not a number."""
    defaults = type(spec)()
    check_numbers(spec, path, EFFECTS[spec.kind], lambda name: getattr(defaults, name))
    if isinstance(spec, LinearSpec):
        _require(spec.scale != 0, f"{path}.scale", spec.scale, "the feature scale must be non-zero",
                 "leave scale at pi (the peer's convention)")
    elif isinstance(spec, SplineSpec):
        _require(spec.p < spec.k + spec.deg, f"{path}.p", spec.p,
                 f"the difference order must be in [0, {spec.k + spec.deg - 1}] (basis width k+deg)", "use p=2")
    elif isinstance(spec, ForestSpec):
        _require(spec.split in ("uniform", "quantile"), f"{path}.split", spec.split, "unknown split strategy",
                 "use split=uniform or split=quantile")
    elif isinstance(spec, CategoricalSpec):
        _require(spec.topo in CATEGORICAL_TOPOLOGIES, f"{path}.topo", spec.topo, "unknown topology",
                 f"use one of {', '.join(CATEGORICAL_TOPOLOGIES)}")


def _check_crossing(spec: CrossingSpec, path: str) -> None:
    """Refuse crossings of crossings and of two forests."""
    for side in ("left", "right"):
        if isinstance(getattr(spec, side), CrossingSpec):
            raise ConfigError(f"{path}.{side}.kind", "crossing", "a crossing of crossings is not supported",
                              "cross two plain effects (e.g. forest x fourier)")
    if isinstance(spec.left, ForestSpec) and isinstance(spec.right, ForestSpec):
        raise ConfigError(f"{path}.right.kind", "forest", "a crossing of two forests is not supported",
                          "make one side a dense effect (fourier, spline, linear, categorical)")


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
    spec = typed_entry(EFFECT_SPECS[kind], node, path, f"a {kind} effect", hidden=("kind",))
    if isinstance(spec, CrossingSpec):
        spec.left = parse_effect("left", spec.left, path)
        spec.right = parse_effect("right", spec.right, path)
        _check_crossing(spec, path)
    _check_ranges(spec, path)
    return spec


def parse_effects(effects: Any, path_prefix: str = "model.effects") -> Dict[str, Any]:
    """Parse a whole ``name -> spec`` mapping, keeping its order."""
    if not effects:
        raise ConfigError(path_prefix, dict(effects or {}), "the model has no effects",
                          "pick a preset (model=fourier) or add model.effects.<name>={kind:..., column:...}")
    return {str(name): parse_effect(str(name), node, path_prefix) for name, node in effects.items()}


def spec_columns(spec: Any, path: str) -> Dict[str, str]:
    """Config path -> column name for every column an effect reads (for data checks)."""
    if isinstance(spec, CrossingSpec):
        return {**spec_columns(spec.left, f"{path}.left"), **spec_columns(spec.right, f"{path}.right")}
    out = {f"{path}.column": spec.column}
    out.update({f"{path}.others[{i}]": column for i, column in enumerate(getattr(spec, "others", []) or [])})
    return out


def effect_columns(specs: Mapping[str, Any]) -> Dict[str, str]:
    """Config path -> column name for every column every effect reads."""
    out: Dict[str, str] = {}
    for name, spec in specs.items():
        out.update(spec_columns(spec, f"model.effects.{name}"))
    return out
