"""Preconditioners of the CG route: M^-1 applied to the residuals r (g, D) of a chunk of groups.

    none           M = I
    jacobi         M = diag(A)
    block_jacobi   M = blockdiag(A_dd, A_leaf_1, ..., diag(A) elsewhere): the dense effects' block
                   A_dd (Dd x Dd, when Dd <= solver.block_max_dim) and, for each indexed block with
                   Q > 1 columns per grid row (forest crossings), every grid row's (Q, Q) diagonal
                   block A_r = G_r / n + lambda M + jitter I, inverted exactly by Cholesky.
    two_level      block_jacobi plus a coarse correction on the forests' tree sums
                   (`tamrun.solve.coarse`, built by `tamrun.solve.assembly.CgSystem`).

The inverses are explicit: a preconditioner needs no more accuracy, and products are several times
faster than triangular solves.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Tuple

import torch

from tamrun.effects.chunk import BlockPenalty, one_group_at_a_time

log = logging.getLogger(__name__)

Preconditioner = Callable[[torch.Tensor], torch.Tensor]


def per_group_inverse(factor: torch.Tensor) -> torch.Tensor:
    """(L L')^-1 from Cholesky factors (g, ..., K, K), one group at a time: a batched
    cholesky_inverse rounds a group differently with other groups beside it (seen with MKL on AMD
    CPUs), and a memory cap changes which groups share a chunk (see `tamrun.effects.chunk`). Off the
    CPU, one batched call."""
    if not one_group_at_a_time(factor):
        return torch.cholesky_inverse(factor)
    return torch.stack([torch.cholesky_inverse(group) for group in factor])


def grid_block_inverses(grid_grams: List[torch.Tensor], spans: List[Tuple[int, int]], penalty: BlockPenalty,
                        n: torch.Tensor, jitter: float) -> List[Tuple[int, torch.Tensor]]:
    """Inverses of the per-grid-row (Q, Q) blocks A_r = G_r / n + lambda M + jitter I of the indexed
    blocks with Q > 1, from their Cholesky factors: [(first column, inverse (g, R, Q, Q))]. ``grid_grams``
    and ``spans`` (first column, width) follow the design's indexed blocks; n (g, 1) the row counts.
    The Grams are consumed (normalised in place)."""
    out = []
    grid_penalties = [b for b in penalty.blocks if b.grid]
    for gram, (start, _), pen in zip(grid_grams, spans, grid_penalties):
        if gram.numel() == 0:
            continue
        block = gram.div_(n.view(-1, 1, 1, 1)).add_(pen.matrix)
        block.diagonal(dim1=-2, dim2=-1).add_(jitter)
        factor, info = torch.linalg.cholesky_ex(block)
        del block
        if bool((info > 0).any()):
            log.warning("a leaf block is not positive definite: Jacobi on its columns")
            continue
        out.append((start, per_group_inverse(factor)))
    return out


def dense_block_inverse(dense_block: torch.Tensor, block_max_dim: int) -> Optional[torch.Tensor]:
    """A_dd^-1 (g, Dd, Dd) when 0 < Dd <= block_max_dim and every group's block is positive
    definite, else None (Jacobi on those columns)."""
    dd = dense_block.shape[-1]
    if not 0 < dd <= block_max_dim:
        return None
    factor, info = torch.linalg.cholesky_ex(dense_block)
    if bool((info > 0).any()):
        log.warning("the dense block is not positive definite: Jacobi on its columns")
        return None
    return per_group_inverse(factor)


def preconditioner(kind: str, diag: torch.Tensor, dense_block: torch.Tensor,
                   grid_blocks: List[Tuple[int, torch.Tensor]], block_max_dim: int) -> Optional[Preconditioner]:
    """M^-1 per solver.preconditioner (``kind``): None for none; r / diag(A) for jacobi; block_jacobi
    (also two_level's first level, `tamrun.solve.coarse`) as in the module docstring, Jacobi on the
    columns outside its blocks."""
    if kind == "none":
        return None
    inverse_diagonal = 1.0 / diag
    if kind == "jacobi":
        return lambda r: r * inverse_diagonal
    dd = dense_block.shape[-1]
    dense_inverse = dense_block_inverse(dense_block, block_max_dim)

    # The dense block is applied elementwise (a batched product of one vector per group takes a
    # different path for a chunk of one group; see effects/chunk.py); the many small leaf blocks go
    # through the batched product's per-element loop.
    def apply(r: torch.Tensor) -> torch.Tensor:
        out = r * inverse_diagonal
        if dense_inverse is not None:
            out[:, :dd] = (dense_inverse * r[:, None, :dd]).sum(dim=-1)
        for start, leaf_inverse in grid_blocks:
            g, rows, q = leaf_inverse.shape[:3]
            part = r[:, start:start + rows * q].reshape(g, rows, q, 1)
            out[:, start:start + rows * q] = (leaf_inverse @ part).reshape(g, rows * q)
        return out

    return apply
