"""Categorical effect over the levels seen in training.

nominal / difference / cyclic: phi = one-hot of the level (D = n levels), with penalty
    nominal: lambda I;  difference: lambda D1' D1 (consecutive levels);  cyclic: the same plus last-first.
fourier: level i of n is placed at z_i = 2i/(n-1) - 1 and described by a Fourier effect with
    m = ceil(n/2) frequencies (D = 2m), penalty lambda diag(1 + k^(2s)) (the peer's topo='fourier').
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tamrun.config.effects import CategoricalSpec
from tamrun.effects.base import ColumnEffect
from tamrun.effects.fourier import fourier_features, sobolev_weights


class CategoricalEffect(ColumnEffect):
    scaled_input = False

    def __init__(self, name: str, spec: CategoricalSpec) -> None:
        super().__init__(name, spec.column, spec.ap)
        self.topo, self.s = spec.topo, spec.s
        self.levels: torch.Tensor = torch.zeros(0, dtype=torch.float64)

    def fit(self, raw: np.ndarray, scaled: np.ndarray) -> None:
        self.levels = torch.as_tensor(np.unique(raw[:, 0]), dtype=torch.float64)

    @property
    def n_levels(self) -> int:
        return int(self.levels.numel())

    @property
    def m(self) -> int:
        return math.ceil(self.n_levels / 2)

    @property
    def width(self) -> int:
        return 2 * self.m if self.topo == "fourier" else self.n_levels

    @property
    def work_width(self) -> int:
        return 2 * self.width + 6  # level indices (int64), the integer one-hot, the mask

    def unseen_levels(self, values: np.ndarray) -> list:
        """Values that are not among the training levels."""
        return sorted(set(np.unique(values).tolist()) - set(self.levels.tolist()))

    def level_index(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., n) -> (..., n) level position, -1 for a value not seen in training."""
        levels = self.levels.to(device=x.device, dtype=x.dtype)
        idx = torch.searchsorted(levels, x.contiguous()).clamp(max=self.n_levels - 1)
        return torch.where(levels[idx] == x, idx, torch.full_like(idx, -1))

    def design(self, x: torch.Tensor) -> torch.Tensor:
        idx = self.level_index(x)
        if self.topo == "fourier":
            z = 2.0 * idx.to(x.dtype) / max(self.n_levels - 1, 1) - 1.0
            block = fourier_features(z, self.m, period_factor=2.0)
        else:
            block = torch.nn.functional.one_hot(idx.clamp(min=0), self.n_levels).to(x.dtype)
        return block * (idx >= 0).unsqueeze(-1).to(x.dtype)  # unseen value (or padding): no contribution

    def structure(self) -> torch.Tensor:
        n = self.n_levels
        if self.topo == "fourier":
            return sobolev_weights(self.m, self.s)
        if self.topo == "nominal" or n < 2:
            return torch.ones(n, dtype=torch.float64)
        diff = torch.diff(torch.eye(n, dtype=torch.float64), dim=0)
        if self.topo == "cyclic" and n > 2:
            wrap = torch.zeros(1, n, dtype=torch.float64)
            wrap[0, 0], wrap[0, -1] = 1.0, -1.0
            diff = torch.cat([diff, wrap])
        return diff.T @ diff
