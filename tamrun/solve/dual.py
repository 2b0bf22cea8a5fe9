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

The groups of a chunk are solved as one batch: K (g, N, N), its tiles (g, rows, upto) built by batched
products and one batched Cholesky, so that many groups of a few rows cost a few tensor operations,
not a Python step each; the plan's fit chunk holds as many groups as their kernels fit
(`tamrun.memory.oracle`, per group `dual_system_bytes`). The leaf counts of indexed blocks are built
group by group (their leaves differ) and stacked into the same tiles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from tamrun.config.schema import CountDType, SolverConfig
from tamrun.data.batch import GroupedBatch
from tamrun.effects.chunk import BlockPenalty, DesignChunk, PenaltyBlock, jittered_factor
from tamrun.effects.design import AdditiveDesign
from tamrun.solve.assembly import design_chunk, row_spans, system_scale
from tamrun.solve.direct import cholesky_solve
from tamrun.solve.stats import SolveStats

BF16_EXACT_COUNTS = 256  # bfloat16 holds every integer up to 2^8 exactly


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices natively: CUDA, or a CPU whose oneDNN has
    bfloat16 kernels (AVX512-BF16 / AMX); elsewhere (AVX2) torch emulates them, ~5x slower than float32."""
    if device.type == "cuda":
        return True
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return device.type == "cpu" and probe is not None and bool(probe())


def requested_count_dtype(choice: CountDType, device: torch.device) -> torch.dtype:
    """solver.dual_counts_dtype as a torch dtype on ``device`` (auto: bfloat16 where native, else float32)."""
    if choice == CountDType.auto:
        return torch.bfloat16 if native_bfloat16(device) else torch.float32
    return getattr(torch, choice.value)


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


def shared_leaf_counts(leaves: torch.Tensor, keep: torch.Tensor, pairs_per_step: int) -> torch.Tensor:
    """The lower triangle (diagonal included) of C (N, N) float32 counted over the entries of leaves
    (N, T) where ``keep`` (N, T) is true, by scattering the pairs of data rows that share a leaf; the
    entries above the diagonal are 0. The kept entries are sorted by leaf (stably, so a leaf's rows
    ascend); the entry of rank k in its leaf pairs with the k + 1 entries up to itself, whose rows are
    <= its own. Work and scatters: the sum over leaves of s (s + 1) / 2 for a leaf of s rows, at most
    ``pairs_per_step`` pairs at a time (solver.dual_scatter_pairs_per_step); exact (integer counts)."""
    n_rows, slots = leaves.shape
    device = leaves.device
    counts = torch.zeros(n_rows * n_rows, dtype=torch.float32, device=device)
    entries = keep.reshape(-1).nonzero().squeeze(-1)
    if entries.numel() == 0:
        return counts.view(n_rows, n_rows)
    flat = leaves.reshape(-1)[entries]
    order = torch.argsort(flat, stable=True)
    members = torch.div(entries[order], slots, rounding_mode="floor")  # data row of each entry, sorted by leaf
    _, sizes = torch.unique_consecutive(flat[order], return_counts=True)
    first = torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)  # per entry: its leaf's first entry
    partners = torch.arange(flat.numel(), device=device) - first + 1  # per entry: rank in its leaf + 1
    step = max(1, pairs_per_step // int(sizes.max()))
    ones = torch.ones(step * int(sizes.max()), dtype=torch.float32, device=device)
    for e0 in range(0, flat.numel(), step):
        part = partners[e0:e0 + step]
        offsets = torch.cumsum(part, 0) - part
        within = torch.arange(int(part.sum()), device=device) - torch.repeat_interleave(offsets, part)
        left = torch.repeat_interleave(members[e0:e0 + step], part)
        right = members[torch.repeat_interleave(first[e0:e0 + step], part) + within]
        counts.index_add_(0, left * n_rows + right, ones[:left.numel()])
    return counts.view(n_rows, n_rows)


class LeafCounts:
    """C (N, N), C_ij = the number of slots t with leaves[i, t] = leaves[j, t], one tile of rows at a
    time: C = O O' with O the (N, R) 0/1 indicator of leaves (N, T) in [0, R).

    A leaf column of O costs about N^2 flops in a dense product whatever its size, a leaf of s rows
    s (s + 1) / 2 scattered pairs. So: R <= dense_max, every leaf in the dense product; else the
    leaves of more than ``scatter_max_rows`` rows in the dense product (O restricted to their
    columns, N x R_big in ``dtype``) and the pairs of the others scattered (`shared_leaf_counts`,
    N^2 float32); a tile is the product's tile plus the scattered counts' slice. Entries above the
    diagonal (column > row) are unspecified: K needs only its lower triangle.
    """

    def __init__(self, leaves: torch.Tensor, grid_rows: int, dense_max: int, dtype: torch.dtype,
                 scatter_max_rows: int, pairs_per_step: int) -> None:
        n_rows, device = leaves.shape[0], leaves.device
        self.counts: Optional[torch.Tensor] = None
        if grid_rows <= dense_max:
            dense_leaves = torch.ones(grid_rows, dtype=torch.bool, device=device)
        else:
            dense_leaves = torch.bincount(leaves.reshape(-1), minlength=grid_rows) > scatter_max_rows
            self.counts = shared_leaf_counts(leaves, ~dense_leaves[leaves], pairs_per_step)
        width = int(dense_leaves.sum())
        column = torch.full((grid_rows,), width, dtype=torch.long, device=device)  # scattered leaves: a spare column
        column[dense_leaves] = torch.arange(width, device=device)
        self.indicator = torch.zeros(n_rows, width + 1, dtype=dtype, device=device)
        self.indicator.scatter_(1, column[leaves], 1.0)
        self.indicator = self.indicator[:, :width] if width else None

    def tile(self, start: int, stop: int, upto: int) -> torch.Tensor:
        """C[start:stop, :upto] (stop - start, upto); entries with column > row unspecified."""
        if self.indicator is None:
            return self.counts[start:stop, :upto]
        product = self.indicator[start:stop] @ self.indicator[:upto].mT
        return product if self.counts is None else self.counts[start:stop, :upto] + product


def chunk_kernel(features: KernelFeatures, solver: SolverConfig) -> torch.Tensor:
    """K = Phi_w P~^-1 Phi_w' (g, N, N) of every group of the chunk: its lower triangle (diagonal
    included); the entries above the diagonal are left unset. Settings: solver.dual_dense_counts_max,
    dual_scatter_max_leaf_rows, dual_scatter_pairs_per_step, dual_counts_dtype (`LeafCounts`, `count_dtype`),
    dual_tile_rows."""
    dense = features.dense
    groups, n_rows, tile_rows = dense.shape[0], dense.shape[1], solver.dual_tile_rows
    requested = requested_count_dtype(solver.dual_counts_dtype, dense.device)
    blocks = [([LeafCounts(leaves[group], grid_rows, solver.dual_dense_counts_max,
                           count_dtype(leaves.shape[-1], requested), solver.dual_scatter_max_leaf_rows,
                           solver.dual_scatter_pairs_per_step) for group in range(groups)], values)
              for leaves, values, grid_rows in features.indexed]
    kernel = torch.empty(groups, n_rows, n_rows, dtype=dense.dtype, device=dense.device)
    for start in range(0, n_rows, tile_rows):
        stop = min(start + tile_rows, n_rows)
        tile = dense[:, start:stop] @ dense[:, :stop].mT
        for shared, values in blocks:  # tile += (G_r G_c') o C_rc: trees in which rows i and j share a leaf
            counts = torch.stack([group.tile(start, stop, stop) for group in shared])
            tile.addcmul_(values[:, start:stop] @ values[:, :stop].mT, counts)
        kernel[:, start:stop, :stop] = tile
    return kernel


def dual_coefficients(chunks: List[DesignChunk], penalty: BlockPenalty, weighted_y: torch.Tensor,
                      n: torch.Tensor, solver: SolverConfig) -> Tuple[torch.Tensor, SolveStats]:
    """beta (g, D) of the groups of ``chunks`` (row chunks in order, weights applied), weighted_y
    (g, N), n (g,) the real row counts; solver: the jitter and its retries, and the kernel's
    settings (`chunk_kernel`). One batched kernel and Cholesky for all g groups."""
    jitter = solver.jitter
    began = time.perf_counter()
    features = kernel_features(chunks, penalty, jitter)
    kernel = chunk_kernel(features, solver)
    kernel.diagonal(dim1=-2, dim2=-1).add_(n.to(kernel.dtype).unsqueeze(-1))
    built = time.perf_counter()
    alpha, stats = cholesky_solve(kernel, weighted_y, 0.0, solver.jitter_growth, solver.jitter_max_tries,
                                  lower_only=True)
    del kernel
    stats.setup_seconds, stats.solve_seconds = built - began, time.perf_counter() - built
    start, rhs = 0, None
    for chunk in chunks:
        rows = chunk.dense.shape[1]
        part = chunk.rmatvec(alpha[:, start:start + rows])
        rhs = part if rhs is None else rhs + part
        start += rows
    return penalty.solve(rhs, jitter), stats


def fit_dual(design: AdditiveDesign, batch: GroupedBatch, groups: slice, penalty: BlockPenalty, device: torch.device,
             row_chunk: int, solver: SolverConfig) -> Tuple[torch.Tensor, SolveStats]:
    """The direct route in the dual form for a slice of groups: all their rows, built ``row_chunk``
    rows at a time, then `dual_coefficients`."""
    parts = [design_chunk(design, batch, groups, slice(r0, r1), device) for r0, r1 in row_spans(batch.x.shape[1], row_chunk)]
    weighted_y = torch.cat([y for _, y in parts], dim=1)
    return dual_coefficients([chunk for chunk, _ in parts], penalty, weighted_y, system_scale(batch, groups, device), solver)
