"""Build effect objects from parsed specs."""

from __future__ import annotations

import zlib
from typing import Any, Dict, List

from tamrun.config.effects import (CategoricalSpec, CrossingSpec, ForestSpec, FourierSpec, LinearSpec,
                                   SplineSpec)
from tamrun.effects.base import Effect
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.crossing import crossing
from tamrun.effects.forest import ForestEffect
from tamrun.effects.fourier import FourierEffect
from tamrun.effects.linear import LinearEffect
from tamrun.effects.spline import SplineEffect

EFFECT_CLASSES = {
    LinearSpec: LinearEffect,
    FourierSpec: FourierEffect,
    CategoricalSpec: CategoricalEffect,
    SplineSpec: SplineEffect,
}


def build_effect(name: str, spec: Any, seed: int = 0) -> Effect:
    """One effect object from a parsed spec (forests take ``seed`` unless their spec sets one)."""
    if isinstance(spec, ForestSpec):
        return ForestEffect(name, spec, seed)
    if isinstance(spec, CrossingSpec):
        return crossing(name, spec, build_effect(f"{name}.left", spec.left, seed),
                              build_effect(f"{name}.right", spec.right, seed + 1))
    return EFFECT_CLASSES[type(spec)](name, spec)


def build_effects(specs: Dict[str, Any], seed: int = 0) -> List[Effect]:
    """One effect object per parsed spec, in config order."""
    return [build_effect(name, spec, seed + zlib.crc32(name.encode()) % 1_000_003) for name, spec in specs.items()]
