"""A row chunk of the design, Phi = [Dense | Indexed_1 | ...], and the block-diagonal penalty.

The dense columns (intercept and dense effects) come first, then each indexed effect's columns.
All products carry a leading group dimension g; weights (0 for padding) are already applied.

Batch invariance: a group's products are bitwise the same whatever other groups share its chunk (a
memory cap changes the chunks; the coefficients must not change). Batched BLAS calls are not (a
chunk of one group takes a matrix-vector path, a larger one a batched product; MKL's GEMM also
rounds by its output's memory alignment), so the dense products here are elementwise products
reduced per row, and Gram blocks one 2-D product per group into a fresh tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from tamrun.effects.indexed import IndexedBlock
from tamrun.machine.sampling import repeating, steady


def jittered_factor(matrix: torch.Tensor, jitter: float) -> torch.Tensor:
    """Cholesky factor of matrix + jitter I (a penalty block, with the system's jitter)."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return torch.linalg.cholesky(matrix + jitter * eye)


def one_group_at_a_time(tensor: torch.Tensor) -> bool:
    """Whether per-group products on ``tensor``'s device run one group at a time: on the CPU, where MKL
    rounds by its operands' alignment and a group's result must not depend on its place in the chunk; off
    it one batched call, as one group at a time costs a launch per group."""
    return tensor.device.type == "cpu"


def add_gram_(out: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """out (g, K, K) += dense_g' dense_g for dense (g, n, K): one 2-D product per group, each into a
    fresh (64-byte aligned) tensor, then added: MKL's GEMM rounds differently with the alignment of
    its output, and out[g]'s alignment depends on the group's place in the chunk. The groups repeat
    the first one's allocations (`tamrun.machine.sampling`). Off the CPU, one batched product."""
    if not one_group_at_a_time(dense):
        return out.add_(dense.mT @ dense)
    with repeating(("gram", dense.shape, dense.dtype)):
        for group in range(dense.shape[0]):
            out[group] += dense[group].mT @ dense[group]
            steady()
    return out


@dataclass
class DesignChunk:
    dense: torch.Tensor  # (g, n, Dd)
    indexed: List[Tuple[int, IndexedBlock]]  # (first column, block)
    width: int

    def prepare(self) -> "DesignChunk":
        """The chunk with what its products would build at their first call built now (`IndexedBlock.prepare`)."""
        for _, block in self.indexed:
            block.prepare(self.dense.dtype)
        return self

    def matvec(self, v: torch.Tensor, blocks: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
        """Phi v: (g, D) -> (g, n); ``blocks``: each indexed block's columns of v as a contiguous (g, R Q)
        tensor, when a product over several row chunks has copied them once (a block's product reads
        them as a grid, a copy of a slice of v)."""
        dd = self.dense.shape[-1]
        out = (self.dense * v[:, None, :dd]).sum(dim=-1)
        if blocks is None:
            blocks = [v[:, start:start + block.width] for start, block in self.indexed]
        for (_, block), columns in zip(self.indexed, blocks, strict=True):
            out += block.matvec(columns)
        return out

    def rmatvec(self, u: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Phi' u: (g, n) -> (g, D); given ``out`` (g, D), out += Phi' u part by part (no concatenated copy)."""
        dense = (self.dense * u.unsqueeze(-1)).sum(dim=1)
        if out is None:
            return torch.cat([dense] + [block.rmatvec(u) for _, block in self.indexed], dim=-1)
        out[:, :dense.shape[-1]] += dense
        for start, block in self.indexed:
            out[:, start:start + block.width] += block.rmatvec(u)
        return out

    def squared_column_sums(self) -> torch.Tensor:
        """diag(Phi' Phi): (g, D)."""
        parts = [(self.dense * self.dense).sum(dim=1)]
        parts += [block.squared_column_sums() for _, block in self.indexed]
        return torch.cat(parts, dim=-1)

    def grid_grams(self) -> List[torch.Tensor]:
        """Per indexed block with Q > 1 columns per grid row: its (g, R, Q, Q) diagonal blocks of
        Phi' Phi (empty tensors for Q = 1, whose diagonal is the Jacobi one)."""
        return [block.grid_gram() if block.q > 1 else self.dense.new_zeros(0) for _, block in self.indexed]

    def gram(self) -> torch.Tensor:
        """Phi' Phi: (g, D, D), indexed blocks by scatters (never one-hot)."""
        g, dd = self.dense.shape[0], self.dense.shape[-1]
        out = torch.zeros(g, self.width, self.width, dtype=self.dense.dtype, device=self.dense.device)
        add_gram_(out[:, :dd, :dd], self.dense)
        for i, (start, block) in enumerate(self.indexed):
            rows = slice(start, start + block.width)
            cross = block.cross_dense(self.dense)  # (g, Wi, Dd)
            out[:, rows, :dd] = cross
            out[:, :dd, rows] = cross.mT
            for other_start, other in self.indexed[i:]:
                cols = slice(other_start, other_start + other.width)
                product = block.cross_indexed(other)
                out[:, rows, cols] = product
                if other_start != start:
                    out[:, cols, rows] = product.mT
        return out

    def to_dense(self) -> torch.Tensor:
        """The chunk as one dense (g, n, D) tensor (tests and tiny problems only)."""
        return torch.cat([self.dense] + [b.to_dense().to(self.dense.dtype) for _, b in self.indexed], dim=-1)


@dataclass
class PenaltyBlock:
    """Columns [start, start + width) carry lambda * matrix (dense) or lambda * kron(I_R, matrix) (grid)."""

    start: int
    width: int
    matrix: torch.Tensor  # (width, width) for dense; (Q, Q) for grid
    grid: bool = False


@dataclass
class BlockPenalty:
    """P = blockdiag of the effects' lambda P_j, applied without forming a D x D matrix."""

    blocks: List[PenaltyBlock]
    width: int

    def to(self, device: torch.device, dtype: torch.dtype) -> "BlockPenalty":
        return BlockPenalty([PenaltyBlock(b.start, b.width, b.matrix.to(device=device, dtype=dtype), b.grid)
                             for b in self.blocks], self.width)

    def scaled(self, factors: Sequence[float]) -> "BlockPenalty":
        """P with block i's lambda multiplied by ``factors[i]`` (one factor per block, in order)."""
        return BlockPenalty([PenaltyBlock(b.start, b.width, b.matrix * float(f), b.grid)
                             for b, f in zip(self.blocks, factors, strict=True)], self.width)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """P v for v (g, D)."""
        out = torch.empty_like(v)
        for b in self.blocks:
            part = v[:, b.start:b.start + b.width]
            if b.grid:
                q = b.matrix.shape[0]
                out[:, b.start:b.start + b.width] = (part.reshape(v.shape[0], -1, q) @ b.matrix).reshape(part.shape)
            else:  # elementwise, not part @ matrix (see the module docstring)
                out[:, b.start:b.start + b.width] = (part.unsqueeze(-1) * b.matrix).sum(dim=-2)
        return out

    def solve(self, v: torch.Tensor, jitter: float) -> torch.Tensor:
        """(P + jitter I)^-1 v for v (g, D), block by block (Cholesky of each block, or of a grid
        block's (Q, Q) matrix once for all its R rows)."""
        out = torch.empty_like(v)
        for b in self.blocks:
            factor = jittered_factor(b.matrix, jitter)
            part = v[:, b.start:b.start + b.width]
            q = b.matrix.shape[0]
            columns = part.reshape(-1, q).T  # (q, g R) for a grid block, (W, g) otherwise
            out[:, b.start:b.start + b.width] = torch.cholesky_solve(columns, factor).T.reshape(part.shape)
        return out

    def diagonal(self) -> torch.Tensor:
        """diag(P): (D,)."""
        parts = [b.matrix.diagonal().repeat(b.width // b.matrix.shape[0]) if b.grid else b.matrix.diagonal()
                 for b in self.blocks]
        return torch.cat(parts)

    def add_to(self, gram: torch.Tensor) -> None:
        """gram (g, D, D) += P, block by block."""
        for b in self.blocks:
            block = gram[:, b.start:b.start + b.width, b.start:b.start + b.width]
            if not b.grid:
                block += b.matrix
            elif b.matrix.shape[0] == 1:
                block.diagonal(dim1=-2, dim2=-1).add_(b.matrix[0, 0])
            else:
                q = b.matrix.shape[0]
                for r in range(b.width // q):
                    block[:, r * q:(r + 1) * q, r * q:(r + 1) * q] += b.matrix

    def leading(self, width: int) -> torch.Tensor:
        """The (width, width) leading block of P (the blocks that lie inside it), as a matrix."""
        out = torch.zeros(1, width, width, dtype=self.blocks[0].matrix.dtype, device=self.blocks[0].matrix.device)
        BlockPenalty([b for b in self.blocks if b.start + b.width <= width], width).add_to(out)
        return out[0]

    def dense(self) -> torch.Tensor:
        """P as a (D, D) matrix (small problems and tests)."""
        out = torch.zeros(1, self.width, self.width, dtype=self.blocks[0].matrix.dtype if self.blocks else torch.float64)
        self.add_to(out)
        return out[0]
