"""The contract every effect fulfils."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List

import numpy as np
import torch


class Effect(ABC):
    """One additive term f_j(x_j) = phi_j(x_j)' beta_j with penalty beta_j' (lambda_j P_j) beta_j.

    ``columns``: the feature columns the effect reads. ``scaled_input``: a single-column effect reads
    its feature scaled to [-1, 1] per group over the training range (True) or the raw values (False,
    e.g. categorical levels). ``indexed``: the block is an `IndexedBlock` (a few non-zeros per row,
    never materialised densely) rather than a dense tensor.
    """

    scaled_input: bool = True
    indexed: bool = False

    def __init__(self, name: str, column: str, ap: float) -> None:
        self.name = name
        self.column = column
        self.lam = 10.0 ** ap

    @property
    def columns(self) -> List[str]:
        return [self.column]

    def fit(self, raw: np.ndarray, scaled: np.ndarray) -> None:
        """Learn state from the training split's real rows: raw and scaled values, (n, C) each."""

    @property
    @abstractmethod
    def width(self) -> int:
        """D_j, the number of columns of the design block."""

    @property
    def work_width(self) -> int:
        """Temporary columns per row while the block is built (beyond the block itself), for the
        memory oracle's footprint of a design chunk."""
        return 0

    @abstractmethod
    def design(self, x: torch.Tensor) -> torch.Tensor:
        """Design block of a single-column effect: x (..., n) -> phi_j(x) (..., n, D_j)."""

    def block(self, raw: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        """Dense design block from the effect's columns, raw and scaled (..., n, C) -> (..., n, D_j)."""
        return self.design((scaled if self.scaled_input else raw)[..., 0])

    @abstractmethod
    def structure(self) -> torch.Tensor:
        """P_j, the penalty without lambda, float64 on the CPU: (D_j, D_j), or (D_j,) when diagonal."""

    def penalty(self) -> torch.Tensor:
        """lambda_j P_j as a float64 (D_j, D_j) matrix on the CPU."""
        structure = self.structure()
        return self.lam * (torch.diag(structure) if structure.dim() == 1 else structure)
