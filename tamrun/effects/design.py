"""The additive design: Phi = [1 | phi_1 | ... | phi_J] and P = blockdiag(lambda_0, lambda_j P_j)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from tamrun.data.batch import GroupedBatch, RangeScaler
from tamrun.effects.base import Effect


@dataclass
class Block:
    """Columns [start, stop) of Phi belong to effect ``name``."""

    name: str
    start: int
    stop: int


class AdditiveDesign:
    """Stacks the effects' blocks (plus an intercept column) over a batch of groups.

    Fitted on the training batch: each effect learns its state from the raw training values, and
    the per-group `RangeScaler` maps scaled-input features to [-1, 1].
    """

    def __init__(self, effects: Sequence[Effect], columns: Sequence[str], intercept: bool,
                 intercept_ap: float) -> None:
        self.effects = list(effects)
        self.columns = list(columns)
        self.intercept = intercept
        self.intercept_lam = 10.0 ** intercept_ap
        self.scaler: RangeScaler | None = None
        self._col = {name: i for i, name in enumerate(self.columns)}

    def fit(self, train: GroupedBatch) -> "AdditiveDesign":
        """Learn the per-group ranges and each effect's state from the training batch."""
        self.scaler = RangeScaler.fit(train)
        real = train.weight.cpu().numpy() > 0
        x = train.x.cpu().numpy()
        for effect in self.effects:
            effect.fit(x[..., self._col[effect.column]][real])
        return self

    @property
    def blocks(self) -> List[Block]:
        out, start = [], 0
        if self.intercept:
            out.append(Block("intercept", 0, 1))
            start = 1
        for effect in self.effects:
            out.append(Block(effect.name, start, start + effect.width))
            start += effect.width
        return out

    @property
    def peak_row_width(self) -> int:
        """Columns per row held at the peak of `design` (scaled features excluded): the blocks built
        so far plus the one being built and its temporaries, or all blocks plus their concatenation.

            max(2 D, max_j (blocks before j + D_j + work_j))
        """
        built, peak = int(self.intercept), 0
        for effect in self.effects:
            peak = max(peak, built + effect.width + effect.work_width)
            built += effect.width
        return max(peak, 2 * self.width)

    @property
    def width(self) -> int:
        """D, the number of columns of Phi."""
        return int(self.intercept) + sum(e.width for e in self.effects)

    def design(self, x: torch.Tensor, group_slice: slice = slice(None)) -> torch.Tensor:
        """Phi for raw features x (g, n, F) of groups ``group_slice``: (g, n, D)."""
        z = self.scaler.apply(x, group_slice)
        parts = [torch.ones(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)] if self.intercept else []
        for effect in self.effects:
            source = z if effect.scaled_input else x
            parts.append(effect.design(source[..., self._col[effect.column]]))
        return torch.cat(parts, dim=-1)

    def penalty(self) -> torch.Tensor:
        """P (D, D) float64 on the CPU."""
        blocks = [torch.full((1, 1), self.intercept_lam, dtype=torch.float64)] if self.intercept else []
        blocks += [effect.penalty() for effect in self.effects]
        return torch.block_diag(*blocks)

    def block_slices(self) -> List[Tuple[str, slice]]:
        return [(b.name, slice(b.start, b.stop)) for b in self.blocks]

    def to(self, device: torch.device) -> "AdditiveDesign":
        if self.scaler is not None:
            self.scaler = self.scaler.to(device)
        return self


def needed_columns(effects: Sequence[Effect]) -> List[str]:
    """The feature columns the effects read, first-seen order."""
    return list(dict.fromkeys(e.column for e in effects))


def describe(design: AdditiveDesign) -> str:
    """One line per block: name, columns, width."""
    return "\n".join(f"{b.name}: columns {b.start}..{b.stop - 1} (width {b.stop - b.start})" for b in design.blocks)

