"""Crossing: the row-wise Kronecker product of two effects, phi(x) = phi_a(x_a) (x) phi_b(x_b).

Columns (a, b) -> a D_b + b; penalty lambda (lambda_a P_a (x) I + lambda_b I (x) P_b): each side's own
weight (its ap) multiplies its margin, and the crossing's ap multiplies both (the peer's te(): one
smoothing parameter per margin, the te-level weight folded into each).
A forest side is always put first: forest x dense is an `IndexedBlock` with T D_b non-zeros per row
(the dense side's columns as weights) and penalty lambda kron(I_R, M), M = lambda_a I + lambda_b P_b.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from tamrun.config.effects import CrossingSpec
from tamrun.effects.base import Effect, IndexedEffect
from tamrun.effects.indexed import IndexedBlock


def as_matrix(structure: torch.Tensor) -> torch.Tensor:
    return torch.diag(structure) if structure.dim() == 1 else structure


class CrossingEffect(Effect):
    """A crossing of two dense effects: a dense block of D_a D_b columns."""

    def __init__(self, name: str, spec: CrossingSpec, left: Effect, right: Effect) -> None:
        super().__init__(name, left.column, spec.ap)
        self.left, self.right = left, right

    @property
    def columns(self) -> List[str]:
        return self.left.columns + self.right.columns

    @property
    def width(self) -> int:
        return self.left.width * self.right.width

    @property
    def work_width(self) -> int:
        return self.left.work_width + self.right.width + self.right.work_width + self.width

    def _split(self, values):
        cut = len(self.left.columns)
        return values[..., :cut], values[..., cut:]

    def fit(self, raw: np.ndarray, scaled: np.ndarray) -> None:
        (raw_a, raw_b), (scaled_a, scaled_b) = self._split(raw), self._split(scaled)
        self.left.fit(raw_a, scaled_a)
        self.right.fit(raw_b, scaled_b)

    def block(self, raw: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        (raw_a, raw_b), (scaled_a, scaled_b) = self._split(raw), self._split(scaled)
        a, b = self.left.block(raw_a, scaled_a), self.right.block(raw_b, scaled_b)
        return (a.unsqueeze(-1) * b.unsqueeze(-2)).reshape(a.shape[:-1] + (self.width,))

    def structure(self) -> torch.Tensor:
        sa, sb = self.left.lam * self.left.structure(), self.right.lam * self.right.structure()
        if sa.dim() == 1 and sb.dim() == 1:
            return (sa.unsqueeze(1) + sb.unsqueeze(0)).reshape(-1)
        ia = torch.eye(self.left.width, dtype=torch.float64)
        ib = torch.eye(self.right.width, dtype=torch.float64)
        return torch.kron(as_matrix(sa), ib) + torch.kron(ia, as_matrix(sb))


class ForestCrossingEffect(CrossingEffect, IndexedEffect):
    """An indexed effect (a forest) crossed with a dense one: an `IndexedBlock` whose grid rows are
    the forest's leaves and whose Q = D_b columns per leaf are the dense side's block."""

    left: IndexedEffect

    @property
    def slots(self) -> int:
        return self.left.slots

    @property
    def grid_q(self) -> int:
        """Columns per grid row: the dense side's width."""
        return self.right.width

    @property
    def work_width(self) -> int:
        return self.left.work_width + self.right.width + self.right.work_width

    def indexed_block(self, raw: torch.Tensor, scaled: torch.Tensor,
                      factor: Optional[torch.Tensor] = None) -> IndexedBlock:
        (raw_a, raw_b), (scaled_a, scaled_b) = self._split(raw), self._split(scaled)
        return self.left.indexed_block(raw_a, scaled_a, factor=self.right.block(raw_b, scaled_b))

    def block(self, raw: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        return IndexedEffect.block(self, raw, scaled)

    def grid_penalty(self) -> torch.Tensor:
        """M with P / lambda = kron(I_R, M) (the forest's structure is I): lambda_a I + lambda_b P_b."""
        return (self.left.lam * torch.eye(self.right.width, dtype=torch.float64)
                + self.right.lam * as_matrix(self.right.structure()))


def crossing(name: str, spec: CrossingSpec, left: Effect, right: Effect) -> CrossingEffect:
    """The crossing of two effects; an indexed side (a forest) goes first and makes it indexed."""
    if isinstance(right, IndexedEffect):
        left, right = right, left
    if isinstance(left, IndexedEffect):
        return ForestCrossingEffect(name, spec, left, right)
    return CrossingEffect(name, spec, left, right)
