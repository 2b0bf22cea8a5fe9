"""The dual (kernel) form of the direct route, for groups with fewer rows than columns (n < D).

Per group, with W the 0/1 row weights and P~ = P + jitter I (block diagonal, so invertible block by
block), the primal system (Phi' W Phi / n + P~) beta = Phi' W y / n has the same solution as

    (K + n I) alpha = W y,   K = Phi_w P~^-1 Phi_w'   (N x N),      beta = P~^-1 Phi_w' alpha

(the push-through identity (Phi'Phi + nP~)^-1 Phi' = P~^-1 Phi' (Phi P~^-1 Phi' + nI)^-1): a Cholesky
of N^3/3 flops instead of D^3/3. Padded rows have a zero design row, so alpha is 0 there.
K is a sum over the blocks of P~ (no cross terms):

    dense columns:   B B',       B = Phi_d L_d^-T,        L_d L_d' = P~_d  (the dense effects' block)
    indexed block:   (G G') o C, G = scale w F L_M^-T,    L_M L_M' = lambda M + jitter I  (Q x Q)
                     C_ij = the number of trees in which rows i and j share a leaf = O O' (O the 0/1
                     leaf indicator, N x R); F = 1, M = 1 for a forest.

Only K's lower triangle is built (the Cholesky reads nothing else), ``tile_rows`` rows at a time:
tile [r0, r1) x [0, r1) = B_r B_c' + sum over indexed blocks of (G_r G_c') o C_rc. This halves the
flops of the products and keeps every temporary at tile size. The counts are integers <= T, exact
in bfloat16 for T <= 256 (8 significand bits; the products accumulate in float32), so the leaf
indicator's product runs in bfloat16 where that is exact, else in float32 (exact below 2^24).

Groups are solved one at a time (a group's K is N^2 numbers): the plan's fit chunk holds one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch

from tamrun.effects.chunk import BlockPenalty, DesignChunk, PenaltyBlock, jittered_factor
from tamrun.effects.indexed import IndexedBlock, csr_matrix
from tamrun.solve.direct import DirectStats, cholesky_solve

BF16_EXACT_COUNTS = 256  # bfloat16 holds every integer up to 2^8 exactly


def count_dtype(slots: int, requested: torch.dtype) -> torch.dtype:
    """The dtype of the leaf co-occurrence counts: ``requested`` (bfloat16 or float32) while every
    count (at most ``slots``) is exact in it, else float32."""
    if requested == torch.bfloat16 and slots <= BF16_EXACT_COUNTS:
        return torch.bfloat16
    return torch.float32


@dataclass
class KernelFeatures:
    """All N rows of the groups in a chunk, whitened by the penalty: B (g, N, Dd), and per indexed
    block its leaves (g, N, T) int64, whitened row values G (g, N, Q) and grid rows R."""

    dense: torch.Tensor
    indexed: List[Tuple[torch.Tensor, torch.Tensor, int]]


def _whiten(rows: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """rows (g, N, K) -> rows L^-T, i.e. (L^-1 rows')'."""
    if rows.shape[-1] == 0:
        return rows
    return torch.linalg.solve_triangular(factor, rows.mT, upper=False).mT


def kernel_features(chunks: List[DesignChunk], penalty: BlockPenalty, jitter: float) -> KernelFeatures:
    """The whitened rows of the design chunks (row chunks of the same groups, in row order)."""
    dd = chunks[0].dense.shape[-1]
    dense = torch.cat([chunk.dense for chunk in chunks], dim=1)
    dense = _whiten(dense, jittered_factor(penalty.leading(dd), jitter)) if dd else dense
    grid_blocks: List[PenaltyBlock] = [b for b in penalty.blocks if b.grid]
    indexed = []
    for i, block in enumerate(grid_blocks):
        leaves = torch.cat([chunk.indexed[i][1].local_index() for chunk in chunks], dim=1)
        values = torch.cat([chunk.indexed[i][1].row_values() for chunk in chunks], dim=1)
        indexed.append((leaves, _whiten(values, jittered_factor(block.matrix, jitter)),
                        chunks[0].indexed[i][1].n_rows_grid))
    return KernelFeatures(dense, indexed)


class LeafCounts:
    """C (N, N), C_ij = the number of slots t with leaves[i, t] = leaves[j, t], one tile of rows at a
    time: C = O O' with O the (N, R) 0/1 indicator of leaves (N, T) in [0, R).

    R <= dense_max: O dense in ``dtype`` (N R itemsize bytes); a tile is the product O_r O_c'
    (2 b m R flops for a b x m tile). Else O and O' as CSR (12 bytes per non-zero, built once); a
    tile is the sparse product O_r O' (work: the tile rows' shared-leaf pairs), scattered into a dense
    float32 tile.
    """

    def __init__(self, leaves: torch.Tensor, grid_rows: int, dense_max: int, dtype: torch.dtype) -> None:
        self.n_rows, self.slots = leaves.shape
        self.dense = grid_rows <= dense_max
        if self.dense:
            self.indicator = torch.zeros(self.n_rows, grid_rows, dtype=dtype, device=leaves.device)
            self.indicator.scatter_(1, leaves, 1.0)
        else:
            block = IndexedBlock(leaves.unsqueeze(0), grid_rows, 1.0)  # O and O' as CSR, built once
            _, self.transposed = block.indicators(torch.float32)
            self.flat = block.flat.reshape(-1)
            self.grid_rows = grid_rows

    def tile(self, start: int, stop: int, upto: int) -> torch.Tensor:
        """C[start:stop, :upto] (stop - start, upto)."""
        if self.dense:
            return self.indicator[start:stop] @ self.indicator[:upto].mT
        rows, slots, device = stop - start, self.slots, self.flat.device
        crow = torch.arange(0, rows * slots + 1, slots, dtype=self.flat.dtype, device=device)
        ones = torch.ones(rows * slots, dtype=torch.float32, device=device)
        block = csr_matrix(crow, self.flat[start * slots:stop * slots], ones, (rows, self.grid_rows))
        product = block @ self.transposed  # (rows, N) CSR
        at = torch.repeat_interleave(torch.arange(rows, device=device), product.crow_indices().diff())
        out = torch.zeros(rows, self.n_rows, dtype=torch.float32, device=device)
        out.view(-1)[at * self.n_rows + product.col_indices()] = product.values()
        return out[:, :upto]


def group_kernel(features: KernelFeatures, group: int, dense_max: int, counts: torch.dtype,
                 tile_rows: int) -> torch.Tensor:
    """K = Phi_w P~^-1 Phi_w' (N, N) of one group of the chunk: its lower triangle (diagonal
    included); the entries above the diagonal are left unset."""
    dense = features.dense[group]
    n_rows = dense.shape[0]
    blocks = [(LeafCounts(leaves[group], grid_rows, dense_max, count_dtype(leaves.shape[-1], counts)), values[group])
              for leaves, values, grid_rows in features.indexed]
    kernel = torch.empty(n_rows, n_rows, dtype=dense.dtype, device=dense.device)
    for start in range(0, n_rows, tile_rows):
        stop = min(start + tile_rows, n_rows)
        tile = dense[start:stop] @ dense[:stop].mT
        for shared, values in blocks:  # tile += (G_r G_c') o C_rc: trees in which rows i and j share a leaf
            tile.addcmul_(values[start:stop] @ values[:stop].mT, shared.tile(start, stop, stop))
        kernel[start:stop, :stop] = tile
    return kernel


def dual_coefficients(chunks: List[DesignChunk], penalty: BlockPenalty, weighted_y: torch.Tensor,
                      n: torch.Tensor, jitter: float, growth: float, max_tries: int,
                      dense_max: int, counts: torch.dtype = torch.bfloat16,
                      tile_rows: int = 1024) -> Tuple[torch.Tensor, DirectStats]:
    """beta (g, D) of the groups of ``chunks`` (row chunks in order, weights applied), weighted_y
    (g, N), n (g,) the real row counts; dense_max, counts: see `LeafCounts` and `count_dtype`;
    tile_rows: rows of K built at a time (`group_kernel`)."""
    features = kernel_features(chunks, penalty, jitter)
    alpha = torch.empty_like(weighted_y)
    stats = DirectStats()
    for group in range(weighted_y.shape[0]):
        kernel = group_kernel(features, group, dense_max, counts, tile_rows)
        kernel.diagonal().add_(n[group])
        solved, group_stats = cholesky_solve(kernel.unsqueeze(0), weighted_y[group:group + 1], 0.0, growth, max_tries,
                                             lower_only=True)
        del kernel
        alpha[group] = solved[0]
        stats.jitter_escalations = max(stats.jitter_escalations, group_stats.jitter_escalations)
        stats.lu_fallback_groups += group_stats.lu_fallback_groups
    start, rhs = 0, None
    for chunk in chunks:
        rows = chunk.dense.shape[1]
        part = chunk.rmatvec(alpha[:, start:start + rows])
        rhs = part if rhs is None else rhs + part
        start += rows
    return penalty.solve(rhs, jitter), stats
