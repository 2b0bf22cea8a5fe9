"""The contract every effect fulfils."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch


class Effect(ABC):
    """One additive term f_j(x_j) = phi_j(x_j)' beta_j with penalty beta_j' (lambda_j P_j) beta_j.

    ``scaled_input``: the effect reads the feature scaled to [-1, 1] per group over the training
    range (True) or the raw values (False, e.g. categorical levels).
    """

    scaled_input: bool = True

    def __init__(self, name: str, column: str, ap: float) -> None:
        self.name = name
        self.column = column
        self.lam = 10.0 ** ap

    def fit(self, train_values: np.ndarray) -> None:
        """Learn state from the training split's values of the column (real rows only)."""

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
        """Design block: x (..., n) -> phi_j(x) (..., n, D_j), same dtype and device as x."""

    @abstractmethod
    def penalty(self) -> torch.Tensor:
        """lambda_j P_j as a float64 (D_j, D_j) matrix on the CPU."""
