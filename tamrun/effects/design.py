"""The additive design: Phi = [1 | dense effects | indexed effects] and P = blockdiag(lambda_j P_j).

Columns are laid out as the intercept, then the dense effects in config order, then the indexed
effects (forests and their crossings) in config order; `blocks` names each effect's columns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from tamrun.data.batch import GroupedBatch, RangeScaler
from tamrun.effects.base import Effect, IndexedEffect
from tamrun.effects.chunk import BlockPenalty, DesignChunk, PenaltyBlock
from tamrun.machine.placement import HOST, to_device


@dataclass
class Block:
    """Columns [start, stop) of Phi belong to effect ``name``."""

    name: str
    start: int
    stop: int


class AdditiveDesign:
    """Stacks the effects' blocks (plus an intercept column) over a batch of groups.

    Fitted on the training batch: the per-group `RangeScaler` maps features to [-1, 1] and each
    effect learns its state from its columns' raw and scaled training values.
    """

    def __init__(self, effects: Sequence[Effect], columns: Sequence[str], intercept: bool,
                 intercept_ap: float) -> None:
        self.effects = list(effects)
        self.columns = list(columns)
        self.intercept = intercept
        self.intercept_lam = 10.0 ** intercept_ap
        self.scaler: Optional[RangeScaler] = None
        self._col = {name: i for i, name in enumerate(self.columns)}
        self.dense_effects: List[Effect] = [e for e in self.effects if not isinstance(e, IndexedEffect)]
        self.indexed_effects: List[IndexedEffect] = [e for e in self.effects if isinstance(e, IndexedEffect)]

    def _index(self, effect: Effect) -> List[int]:
        return [self._col[c] for c in effect.columns]

    def fit(self, train: GroupedBatch) -> "AdditiveDesign":
        """Learn the per-group ranges and each effect's state from the training batch."""
        return self.fit_rows(RangeScaler.fit(train).to(HOST), train.x.cpu(), train.weight.cpu() > 0)

    def fit_rows(self, scaler: RangeScaler, x: torch.Tensor, real: torch.Tensor) -> "AdditiveDesign":
        """Take the per-group ranges ``scaler`` and learn each stateful effect's state from the rows of x
        (G, N, F) where ``real`` (G, N), one effect's columns at a time (its real rows, raw and scaled)."""
        self.scaler = scaler  # a design's state is made on the host
        group = None
        for effect in self.effects:
            if not effect.stateful:
                continue
            if group is None:
                group = torch.nonzero(real)[:, 0]
            cols = self._index(effect)
            raw = x[..., cols][real]
            scaled = (raw - scaler.center[group][:, cols]) / scaler.half[group][:, cols]
            effect.fit(raw.numpy(), scaled.numpy())
        return self

    # ---- layout ------------------------------------------------------------------------------------
    @property
    def blocks(self) -> List[Block]:
        out, start = [], 0
        if self.intercept:
            out.append(Block("intercept", 0, 1))
            start = 1
        for effect in self.dense_effects + self.indexed_effects:
            out.append(Block(effect.name, start, start + effect.width))
            start += effect.width
        return out

    @property
    def width(self) -> int:
        """D, the number of columns of Phi."""
        return int(self.intercept) + sum(e.width for e in self.effects)

    @property
    def dense_width(self) -> int:
        return int(self.intercept) + sum(e.width for e in self.dense_effects)

    def to(self, device: torch.device) -> "AdditiveDesign":
        """A copy with every tensor of the design (per-group ranges, each effect's state) on ``device``
        (`tamrun.machine.placement.to_device`); this design is left as it is."""
        return to_device(self, device)

    def of_groups(self, index: torch.Tensor) -> "AdditiveDesign":
        """A shallow copy whose groups are those of ``index`` (k,) in that order: the per-group ranges taken
        at ``index``, the effects' state shared (it is the same for every group)."""
        chosen = copy.copy(self)
        chosen.scaler = RangeScaler(self.scaler.center[index], self.scaler.half[index])
        return chosen

    def block_slices(self) -> List[Tuple[str, slice]]:
        return [(b.name, slice(b.start, b.stop)) for b in self.blocks]

    # ---- design ------------------------------------------------------------------------------------
    def chunk(self, x: torch.Tensor, group_slice: slice = slice(None),
              weight: Optional[torch.Tensor] = None) -> DesignChunk:
        """The design of raw features x (g, n, F) of groups ``group_slice``; rows scaled by ``weight``
        (g, n) when given (0 for padding)."""
        z = self.scaler.apply(x, group_slice)
        parts = [torch.ones(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)] if self.intercept else []
        for effect in self.dense_effects:
            cols = self._index(effect)
            parts.append(effect.block(x[..., cols], z[..., cols]))
        dense = torch.cat(parts, dim=-1) if parts else x.new_zeros(x.shape[:-1] + (0,))
        del parts  # the blocks live on in dense only
        if weight is not None:
            dense.mul_(weight.unsqueeze(-1))
        indexed, start = [], self.dense_width
        for effect in self.indexed_effects:
            cols = self._index(effect)
            block = effect.indexed_block(x[..., cols], z[..., cols])
            block.weight = weight
            if block.factor is not None:
                block.factor = block.factor.to(x.dtype)
            indexed.append((start, block))
            start += effect.width
        return DesignChunk(dense, indexed, self.width)

    def design(self, x: torch.Tensor, group_slice: slice = slice(None)) -> torch.Tensor:
        """Phi as a dense (g, n, D) tensor (indexed blocks materialised: small problems and tests)."""
        return self.chunk(x, group_slice).to_dense()

    # ---- penalty -----------------------------------------------------------------------------------
    def penalty_operator(self) -> BlockPenalty:
        """P as blocks, float64 on the CPU (indexed effects as lambda kron(I_R, M))."""
        blocks, start = [], 0
        if self.intercept:
            blocks.append(PenaltyBlock(0, 1, torch.full((1, 1), self.intercept_lam, dtype=torch.float64)))
            start = 1
        for effect in self.dense_effects:
            blocks.append(PenaltyBlock(start, effect.width, effect.penalty()))
            start += effect.width
        for effect in self.indexed_effects:
            blocks.append(PenaltyBlock(start, effect.width, effect.lam * effect.grid_penalty(), grid=True))
            start += effect.width
        return BlockPenalty(blocks, self.width)

    def penalty(self) -> torch.Tensor:
        """P (D, D) float64 on the CPU (small problems and tests)."""
        return self.penalty_operator().dense()

def needed_columns(effects: Sequence[Effect]) -> List[str]:
    """The feature columns the effects read, first-seen order."""
    return list(dict.fromkeys(c for e in effects for c in e.columns))


def describe(design: AdditiveDesign) -> str:
    """One line per block: name, columns, width."""
    return "\n".join(f"{b.name}: columns {b.start}..{b.stop - 1} (width {b.stop - b.start})" for b in design.blocks)


def same_effects(a: AdditiveDesign, b: AdditiveDesign) -> bool:
    """Whether two designs' effects hold the same state (levels, thresholds, sizes, penalties; the per-group
    feature ranges aside): one fitted design then reads both's columns alike once given the other's ranges."""
    return a.columns == b.columns and len(a.effects) == len(b.effects) and all(
        same_state(x, y) for x, y in zip(a.effects, b.effects))


def same_state(a: Any, b: Any) -> bool:
    """Equality of two states: tensors and arrays element for element (dtype and shape too), containers
    item by item, tamrun's own objects field by field, anything else by ``==``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[key], b[key]) for key in a)
    if type(a).__module__.startswith("tamrun.") and hasattr(a, "__dict__"):
        return same_state(vars(a), vars(b))
    return bool(a == b)
