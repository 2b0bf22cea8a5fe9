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
                     leaf indicator, N x R, float32: exact for counts < 2^24); F = 1, M = 1 for a forest.

Groups are solved one at a time (a group's K is N^2 numbers): the plan's fit chunk holds one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch

from tamrun.effects.chunk import BlockPenalty, DesignChunk, PenaltyBlock, jittered_factor
from tamrun.effects.indexed import IndexedBlock, csr_matrix
from tamrun.solve.direct import DirectStats, cholesky_solve

COUNT_DTYPE = torch.float32  # leaf co-occurrence counts: exact integers below 2^24


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


def leaf_counts(leaves: torch.Tensor, grid_rows: int, dense_max: int, block_rows: int = 512) -> torch.Tensor:
    """C (N, N) float32: C_ij = the number of slots t with leaves[i, t] = leaves[j, t], for leaves
    (N, T) in [0, R). C = O O' with O the (N, R) 0/1 indicator: a dense float32 product when
    R <= dense_max (N R 4 bytes, 2 N^2 R flops), else a sparse product (work: the sum over grid rows
    of their row counts squared), block_rows rows of C at a time."""
    n_rows, slots = leaves.shape
    device = leaves.device
    if grid_rows <= dense_max:
        indicator = torch.zeros(n_rows, grid_rows, dtype=COUNT_DTYPE, device=device)
        indicator.scatter_(1, leaves, 1.0)
        return indicator @ indicator.mT
    indicator = IndexedBlock(leaves.unsqueeze(0), grid_rows, 1.0)  # O and O' as CSR, built once
    _, transposed = indicator.indicators(COUNT_DTYPE)
    flat = indicator.flat.reshape(-1)
    ones = torch.ones(min(block_rows, n_rows) * slots, dtype=COUNT_DTYPE, device=device)
    counts = torch.empty(n_rows, n_rows, dtype=COUNT_DTYPE, device=device)
    for start in range(0, n_rows, block_rows):
        stop = min(start + block_rows, n_rows)
        crow = torch.arange(0, (stop - start) * slots + 1, slots, dtype=flat.dtype, device=device)
        block = csr_matrix(crow, flat[start * slots:stop * slots], ones[:(stop - start) * slots], (stop - start, grid_rows))
        product = block @ transposed  # (block, N) CSR
        rows = torch.repeat_interleave(torch.arange(stop - start, device=device), product.crow_indices().diff())
        part = counts[start:stop].zero_()
        part.view(-1)[rows * n_rows + product.col_indices()] = product.values()
    return counts


def group_kernel(features: KernelFeatures, group: int, dense_max: int) -> torch.Tensor:
    """K = Phi_w P~^-1 Phi_w' (N, N) of one group of the chunk."""
    dense = features.dense[group]
    kernel = dense @ dense.mT
    for leaves, values, grid_rows in features.indexed:
        shared = leaf_counts(leaves[group], grid_rows, dense_max)  # C: trees in which rows i and j share a leaf
        term = values[group] @ values[group].mT
        kernel.addcmul_(term, shared)  # one pass: kernel += term o C
    return kernel


def dual_coefficients(chunks: List[DesignChunk], penalty: BlockPenalty, weighted_y: torch.Tensor,
                      n: torch.Tensor, jitter: float, growth: float, max_tries: int,
                      dense_max: int) -> Tuple[torch.Tensor, DirectStats]:
    """beta (g, D) of the groups of ``chunks`` (row chunks in order, weights applied), weighted_y
    (g, N), n (g,) the real row counts; dense_max: see `leaf_counts`."""
    features = kernel_features(chunks, penalty, jitter)
    alpha = torch.empty_like(weighted_y)
    stats = DirectStats()
    for group in range(weighted_y.shape[0]):
        kernel = group_kernel(features, group, dense_max)
        kernel.diagonal().add_(n[group])
        solved, group_stats = cholesky_solve(kernel.unsqueeze(0), weighted_y[group:group + 1], 0.0, growth, max_tries)
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
