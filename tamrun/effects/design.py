"""The additive design: Phi = [1 | dense effects | indexed effects] and P = blockdiag(lambda_j P_j).

Columns are laid out as the intercept, then the dense effects in config order, then the indexed
effects (forests and their crossings) in config order; `blocks` names each effect's columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from tamrun.data.batch import GroupedBatch, RangeScaler
from tamrun.effects.base import Effect
from tamrun.effects.chunk import BlockPenalty, DesignChunk, PenaltyBlock
from tamrun.effects.indexed import SORT_SLOTS

INDEX_BYTES = 8  # int64 leaf indices


@dataclass
class Block:
    """Columns [start, stop) of Phi belong to effect ``name``."""

    name: str
    start: int
    stop: int


@dataclass(frozen=True)
class RowBytes:
    """Bytes per row of a chunk, per group: to build it, to keep it (CG cache), the extra temporaries
    of its Gram (direct route) and of one product Phi v / Phi' u (CG, prediction)."""

    build: int
    store: int
    gram: int
    apply: int


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
        self.dense_effects = [e for e in self.effects if not e.indexed]
        self.indexed_effects = [e for e in self.effects if e.indexed]

    def _index(self, effect: Effect) -> List[int]:
        return [self._col[c] for c in effect.columns]

    def fit(self, train: GroupedBatch) -> "AdditiveDesign":
        """Learn the per-group ranges and each effect's state from the training batch."""
        self.scaler = RangeScaler.fit(train)
        real = train.weight.cpu() > 0
        raw = train.x.cpu()[real].numpy()
        scaled = self.scaler.to(torch.device("cpu")).apply(train.x.cpu())[real].numpy()
        for effect in self.effects:
            cols = self._index(effect)
            effect.fit(raw[:, cols], scaled[:, cols])
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
        """Move the fitted per-group ranges to ``device`` (effects move their state per call)."""
        if self.scaler is not None:
            self.scaler = self.scaler.to(device)
        return self

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

    # ---- footprint ---------------------------------------------------------------------------------
    @property
    def peak_row_width(self) -> int:
        """Dense columns per row held at the peak of building the dense part (scaled features
        excluded): the blocks built so far plus the one being built and its temporaries, or all
        blocks plus their concatenation: max(2 Dd, max_j (blocks before j + D_j + work_j))."""
        built, peak = int(self.intercept), 0
        for effect in self.dense_effects:
            peak = max(peak, built + effect.width + effect.work_width)
            built += effect.width
        return max(peak, 2 * self.dense_width)

    def row_bytes(self, itemsize: int) -> RowBytes:
        """Per-row bytes (per group) of a chunk of this design, see `RowBytes`. With s = itemsize,
        F features, Dd dense columns, and per indexed block T slots, Q columns per grid row, C columns:

            build  max(dense phase (F + peak_row_width) s,
                       (F + Dd) s + blocks kept so far + 2 C s (its columns, raw and scaled) + Q s (Q > 1)
                       + max(leaf_index: 4T + T s + T, int32 leaves and flat index: 8T))
            store  Dd s + per block 16T + Q s: the flat index (O's indices, 4T), O' (indices 4T, ones
                   shared with O 8T), the row values
            apply  2 s + max(Dd s, per block max(4 Q s, 48 min(T, SORT_SLOTS) + 2 Q s): the products, or
                   O' being built with the row values)
        """
        s = itemsize
        features, dd = len(self.columns), self.dense_width
        build = (features + self.peak_row_width) * s
        held = (features + dd) * s
        store, apply, gram = dd * s, dd * s, 0
        for effect in self.indexed_effects:
            t, q, cols = effect.slots, effect.grid_q, len(effect.columns)
            factor = q * s if q > 1 else 0
            leaves = 4 * t + t * s + t
            build = max(build, held + 2 * cols * s + factor + max(leaves, 8 * t))
            kept = 16 * t + q * s
            held += kept
            store += kept
            apply = max(apply, 4 * q * s, 48 * min(t, SORT_SLOTS) + 2 * q * s)
            gram += t * q * dd * s * 2 + t * INDEX_BYTES
            for other in self.indexed_effects:
                gram += t * other.slots * (2 * q * other.grid_q * s + 3 * INDEX_BYTES)
        return RowBytes(build, store, gram, 2 * s + apply)

    def kernel_row_bytes(self, itemsize: int) -> int:
        """Per-row bytes of the dual route's whitened rows (`tamrun.solve.dual.KernelFeatures`) with
        their concatenation temporaries, and the weighted target and alpha: (2 Dd + sum 2 Q + 2) s + sum 8 T."""
        s = itemsize
        return (2 * self.dense_width + 2) * s + sum(2 * e.grid_q * s + 8 * e.slots for e in self.indexed_effects)

def needed_columns(effects: Sequence[Effect]) -> List[str]:
    """The feature columns the effects read, first-seen order."""
    return list(dict.fromkeys(c for e in effects for c in e.columns))


def describe(design: AdditiveDesign) -> str:
    """One line per block: name, columns, width."""
    return "\n".join(f"{b.name}: columns {b.start}..{b.stop - 1} (width {b.stop - b.start})" for b in design.blocks)
