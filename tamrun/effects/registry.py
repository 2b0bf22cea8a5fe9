"""Build effect objects from parsed specs."""

from __future__ import annotations

from typing import Any, Dict, List

from tamrun.config.effects import CategoricalSpec, FourierSpec, LinearSpec, SplineSpec
from tamrun.effects.base import Effect
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.fourier import FourierEffect
from tamrun.effects.linear import LinearEffect
from tamrun.effects.spline import SplineEffect

EFFECT_CLASSES = {
    LinearSpec: LinearEffect,
    FourierSpec: FourierEffect,
    CategoricalSpec: CategoricalEffect,
    SplineSpec: SplineEffect,
}


def build_effects(specs: Dict[str, Any]) -> List[Effect]:
    """One effect object per parsed spec, in config order."""
    return [EFFECT_CLASSES[type(spec)](name, spec) for name, spec in specs.items()]
