"""Fourier effect with a Sobolev penalty.

phi(z) = [cos(k pi z / c) for k = 1..m, sin(k pi z / c) for k = 1..m]  (D = 2m), c = 1 if cyclic else 2,
z the column scaled to [-1, 1] over its training range; with a period P: z = x, the raw value, and c = P / 2
P = lambda * diag(w, w), w_k = 1 + k^(2s)
"""

from __future__ import annotations

import torch

from tamrun.config.effects import FourierSpec
from tamrun.effects.base import ColumnEffect


def fourier_features(z: torch.Tensor, m: int, period_factor: float) -> torch.Tensor:
    """z (..., n) -> (..., n, 2m): cosines then sines of k pi z / period_factor, k = 1..m."""
    k = torch.arange(1, m + 1, dtype=z.dtype, device=z.device)
    angle = z.unsqueeze(-1) * (k * (torch.pi / period_factor))
    return torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)


def sobolev_weights(m: int, s: float) -> torch.Tensor:
    """(2m,) float64: 1 + k^(2s) for the cosine and the sine of each k = 1..m."""
    k = torch.arange(1, m + 1, dtype=torch.float64)
    w = 1.0 + k ** (2.0 * s)
    return torch.cat([w, w])


class FourierEffect(ColumnEffect):
    def __init__(self, name: str, spec: FourierSpec) -> None:
        super().__init__(name, spec.column, spec.ap)
        self.m, self.s = spec.m, spec.s
        self.period_factor = 1.0 if spec.cyclic else 2.0
        if spec.period is not None:  # a fixed period in the column's units: the raw value, not its range
            self.period_factor, self.scaled_input = spec.period / 2.0, False

    @property
    def width(self) -> int:
        return 2 * self.m

    @property
    def work_width(self) -> int:
        return 3 * self.m  # angles, cosines, sines before their concatenation

    def design(self, x: torch.Tensor) -> torch.Tensor:
        return fourier_features(x, self.m, self.period_factor)

    def structure(self) -> torch.Tensor:
        return sobolev_weights(self.m, self.s)
