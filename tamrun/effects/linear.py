"""Linear effect: phi(z) = scale * z; penalty lambda."""

from __future__ import annotations

import torch

from tamrun.config.effects import LinearSpec
from tamrun.effects.base import ColumnEffect


class LinearEffect(ColumnEffect):
    def __init__(self, name: str, spec: LinearSpec) -> None:
        super().__init__(name, spec.column, spec.ap)
        self.scale = spec.scale

    @property
    def width(self) -> int:
        return 1

    def design(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scale * x).unsqueeze(-1)

    def structure(self) -> torch.Tensor:
        return torch.ones(1, dtype=torch.float64)
