"""The contract every effect fulfils: what `tamrun.effects.design.AdditiveDesign` and the memory
footprints (`tamrun.memory.footprint`) call.

    Effect          a dense block: ``block(raw, scaled)`` (..., n, D_j), penalty lambda_j P_j
    ColumnEffect    an Effect of one column: ``design(x)`` of the column (scaled or raw)
    IndexedEffect   a block with T non-zeros per row over an (R, Q) grid of coefficients, never
                    materialised: ``indexed_block(raw, scaled)`` (`IndexedBlock`), penalty
                    lambda kron(I_R, M) with M = ``grid_penalty()`` (Q, Q)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import List, Optional

import numpy as np
import torch

from tamrun.effects.indexed import IndexedBlock


class Effect(ABC):
    """One additive term f_j(x_j) = phi_j(x_j)' beta_j with penalty beta_j' (lambda_j P_j) beta_j.

    ``columns``: the feature columns the effect reads (``column`` first). ``indexed``: the block is
    an `IndexedBlock` (see `IndexedEffect`).
    """

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
    def stateful(self) -> bool:
        """Whether `fit` learns anything from the rows (an effect that does not override it keeps none)."""
        return type(self).fit is not Effect.fit

    @property
    @abstractmethod
    def width(self) -> int:
        """D_j, the number of columns of the design block."""

    @property
    def work_width(self) -> int:
        """Temporary columns per row while the block is built (beyond the block itself), for the
        memory footprint of a design chunk (`tamrun.memory.footprint.peak_row_width`)."""
        return 0

    @abstractmethod
    def block(self, raw: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        """Dense design block from the effect's columns, raw and scaled (..., n, C) -> (..., n, D_j)."""

    @abstractmethod
    def structure(self) -> torch.Tensor:
        """P_j, the penalty without lambda, float64 on the CPU: (D_j, D_j), or (D_j,) when diagonal."""

    def penalty(self) -> torch.Tensor:
        """lambda_j P_j as a float64 (D_j, D_j) matrix on the CPU."""
        structure = self.structure()
        return self.lam * (torch.diag(structure) if structure.dim() == 1 else structure)


class ColumnEffect(Effect):
    """An effect of one column, read scaled to [-1, 1] per group over the training range
    (``scaled_input``) or raw (categorical levels)."""

    scaled_input: bool = True

    @abstractmethod
    def design(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., n) -> phi_j(x) (..., n, D_j)."""

    def block(self, raw: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        return self.design((scaled if self.scaled_input else raw)[..., 0])


class IndexedEffect(Effect):
    """A block kept as indices: per row, T grid rows (``slots``) of an (R, Q) grid of coefficients
    (``grid_q`` = Q columns per grid row, D_j = R Q), weighted by the row's Q values."""

    indexed = True

    @property
    @abstractmethod
    def slots(self) -> int:
        """T, the non-zero grid rows per data row."""

    @property
    @abstractmethod
    def grid_q(self) -> int:
        """Q, the columns per grid row."""

    @abstractmethod
    def indexed_block(self, raw: torch.Tensor, scaled: torch.Tensor,
                      factor: Optional[torch.Tensor] = None) -> IndexedBlock:
        """The block of the rows (..., n, C) as an `IndexedBlock`; ``factor`` (..., n, Q) weights each
        grid row's Q columns (crossings)."""

    @abstractmethod
    def grid_penalty(self) -> torch.Tensor:
        """M (Q, Q) float64 with P_j = kron(I_R, M)."""

    def block(self, raw: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        """The block materialised densely (tests and tiny problems only)."""
        return self.indexed_block(raw, scaled).to_dense().to(scaled.dtype)
