"""The two-level preconditioner of the CG route: block-Jacobi plus a coarse correction on the trees.

Every tree of a forest partitions the rows, so the sum of one tree's leaf columns (for a crossing,
its leaves' column q) is the same function of the data whatever the tree: the intercept (or the
crossing's q-th column). T trees leave T - 1 directions per column q that only the tiny penalty
fixes; block-Jacobi, which sees one leaf at a time, cannot resolve them (forest x Fourier: 1,823
iterations). The coarse space Z (D, k) holds exactly those sums, with the dense columns beside them:

    dense column j:                 e_j                                        (j < Dd)
    indexed block b, slot t, col q: sum of e_{start_b + r Q_b + q} over the grid rows r of slot t

(slot t owns grid rows [t R/T, (t + 1) R/T), the layout of `tamrun.effects.forest`; a block whose R
is not a multiple of T gets one slot). Z's columns have disjoint supports, so Z is stored as the
coarse column of each design column, and Phi Z_i is one of S = Dd + sum_b Q_b "source" vectors U_s
(the dense column j, or the block's row values' column q: a row lies in one grid row of each slot).
With H_s = Phi' U_s / n (S rmatvecs in the assembly pass):

    A Z_i = H_s(i) + P Z_i + jitter Z_i,    E = Z' A Z (k, k) per group, by Cholesky
    Z' P Z = blockdiag(P_dd, |slot t| lambda M_b for every block and slot)      (closed form)

and the balancing (BNN) preconditioner, symmetric positive definite for any full-rank Z, with
Q = Z E^-1 Z':

    M2^-1 r = (I - Q A) M^-1 (I - A Q) r + Q r

CG starts from x0 + Q (b - A x0) (`CoarseCorrection.start`), whose residual has no part in the coarse
space. (The cheaper adapted-deflation form A-DEF2, y + Z E^-1 (Z'r - (AZ)'y) with y = M^-1 r, takes
the same steps in exact arithmetic but is not symmetric: at tol 1e-13 it stagnated where this form
converges, tests/test_adaptive.py; forest_fourier: 260 iterations at 20 ms an application, against
271 at 11 ms with A-DEF2.) It needs no product with Phi: per application two (S, D) and two
(k, k) matrix-vector products per group, two products with P and three segment sums. Memory per group:
H, summed in place in its padded layout (`GroupMatrices`, S' D'), and E, its factor, its inverse and the
inverse padded (3 k^2 + k'^2; S', D', k' rounded up to 64 bytes):
`tamrun.memory.footprint.coarse_elements`. Each product is one batched product over the chunk's groups,
on every device (`GroupMatrices`: a group's result does not depend on its chunk; on a GPU one group at a
time cost 48 launches per product, four products per iteration, and made forest x Fourier's iterations
launch-bound).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from tamrun.effects.chunk import BlockPenalty, DesignChunk
from tamrun.effects.indexed import IndexedBlock
from tamrun.machine.sampling import repeating, steady
from tamrun.solve.preconditioners import Preconditioner, per_group_inverse

log = logging.getLogger(__name__)


def slot_rows(block: IndexedBlock) -> int:
    """Grid rows per slot: R / T when the slots split the grid evenly, else R (one slot)."""
    grid_rows, slots = block.n_rows_grid, block.shape[-1]
    return grid_rows // slots if grid_rows % slots == 0 else grid_rows


@dataclass
class CoarseSpace:
    """Z (D, k) with disjoint column supports: ``assignment`` (D,) the coarse column of each design
    column, ``source`` (k,) the index s of U_s = Phi Z_i, ``sizes`` (k,) the design columns of each;
    ``dense`` the dense columns (Z's identity part) and ``blocks`` (slots, grid rows per slot, Q) of each
    indexed block, whose coarse columns follow in that order."""

    assignment: torch.Tensor
    source: torch.Tensor
    sizes: torch.Tensor
    n_sources: int
    dense: int
    blocks: List[Tuple[int, int, int]]

    @property
    def size(self) -> int:
        return self.source.numel()

    def restrict(self, v: torch.Tensor) -> torch.Tensor:
        """Z' v: (g, D) -> (g, k), the sums of v over each coarse column's support."""
        return v.new_zeros(v.shape[0], self.size).index_add_(1, self.assignment, v)

    def prolong(self, c: torch.Tensor) -> torch.Tensor:
        """Z c: (g, k) -> (g, D): the dense coordinates, then each slot's Q values repeated over its grid
        rows (a broadcast copy per block; the same values as c[:, assignment], about a third of the time)."""
        g, dd = c.shape[0], self.dense
        out = c.new_empty(g, self.assignment.numel())
        out[:, :dd] = c[:, :dd]
        coarse, column = dd, dd
        for slots, per_slot, q in self.blocks:
            values = c[:, coarse:coarse + slots * q].reshape(g, slots, 1, q)
            out[:, column:column + slots * per_slot * q].view(g, slots, per_slot, q).copy_(
                values.expand(g, slots, per_slot, q))
            coarse, column = coarse + slots * q, column + slots * per_slot * q
        return out

    def by_source(self, c: torch.Tensor) -> torch.Tensor:
        """(g, k) -> (g, S): the sums of c over the coarse columns that share a source vector."""
        return c.new_zeros(c.shape[0], self.n_sources).index_add_(1, self.source, c)


def coarse_space(chunk: DesignChunk) -> CoarseSpace:
    """Z of a design (its layout read off one of its row chunks): the dense columns, then per indexed
    block, slot and column q the slot's sum (module docstring)."""
    dd, device = chunk.dense.shape[-1], chunk.dense.device
    assignment = [torch.arange(dd, device=device)]
    source, sizes, base, sources = [torch.arange(dd, device=device)], [torch.ones(dd, device=device)], dd, dd
    blocks = []
    for _, block in chunk.indexed:
        q, per_slot = block.q, slot_rows(block)
        slots = block.n_rows_grid // per_slot
        blocks.append((slots, per_slot, q))
        grid_slot = torch.arange(block.n_rows_grid, device=device) // per_slot  # (R,)
        assignment.append((base + grid_slot.unsqueeze(1) * q + torch.arange(q, device=device)).reshape(-1))
        source.append((sources + torch.arange(q, device=device)).repeat(slots))
        sizes.append(torch.full((slots * q,), float(per_slot), device=device))
        base, sources = base + slots * q, sources + q
    return CoarseSpace(torch.cat(assignment), torch.cat(source), torch.cat(sizes), sources, dd, blocks)


SOURCE_COLUMNS = 16  # columns of one sparse product of the sources: 16 // Q sources at a time (at least one)


def source_vectors(chunk: DesignChunk) -> List[torch.Tensor]:
    """U_s (g, n) for s < S: the chunk's dense columns, then each indexed block's row values' columns."""
    out = [chunk.dense[..., j] for j in range(chunk.dense.shape[-1])]
    for _, block in chunk.indexed:
        values = block.row_values()
        out += [values[..., q] for q in range(block.q)]
    return out


def accumulate_sources(total: Optional[GroupMatrices], chunk: DesignChunk) -> GroupMatrices:
    """total (g, S, D) + Phi' U_s of one row chunk, for every source s, in place (zeros to start with when
    ``total`` is None; kept in the padded layout the correction's products read, `GroupMatrices`): the
    dense columns' sums per source, each indexed block's products a few sources at a time
    (`IndexedBlock.rmatmat`, `SOURCE_COLUMNS`: a forest's 12 sources in one product; a crossing's Q = 12
    columns one source at a time, as many columns take longer than the products one by one)."""
    sources = source_vectors(chunk)
    dense = chunk.dense
    if total is None:
        total = GroupMatrices.zeros(dense.shape[0], len(sources), chunk.width, like=dense)
    matrices = total.matrices
    dd = dense.shape[-1]
    for s, u in enumerate(sources):
        matrices[:, s, :dd] += (dense * u.unsqueeze(-1)).sum(dim=1)
    for start, block in chunk.indexed:
        step = max(1, SOURCE_COLUMNS // block.q)
        for first in range(0, len(sources), step):
            batch = torch.stack(sources[first:first + step], dim=-1)  # (g, n, K)
            matrices[:, first:first + batch.shape[-1], start:start + block.width] += block.rmatmat(batch)
    return total


def coarse_penalty(space: CoarseSpace, chunk: DesignChunk, penalty: BlockPenalty) -> torch.Tensor:
    """Z' P Z (k, k): P's dense block, then each slot's |slot| lambda M_b on its Q coarse columns."""
    dd = chunk.dense.shape[-1]
    out = torch.zeros(space.size, space.size, dtype=chunk.dense.dtype, device=chunk.dense.device)
    if dd:
        out[:dd, :dd] = penalty.leading(dd).to(out.dtype)
    start = dd
    grid_penalties = [b for b in penalty.blocks if b.grid]
    for (_, block), pen in zip(chunk.indexed, grid_penalties):
        q, per_slot = block.q, slot_rows(block)
        with repeating(("coarse penalty", pen.matrix.shape, pen.matrix.dtype)):
            for _ in range(block.n_rows_grid // per_slot):
                out[start:start + q, start:start + q] = per_slot * pen.matrix
                start += q
                steady()  # the other slots allocate as the first did
    return out


ALIGN_BYTES = 64  # torch's CPU allocator aligns every storage to 64 bytes; MKL rounds by its operands' alignment


def aligned_width(width: int, itemsize: int) -> int:
    """``width`` rounded up to whole `ALIGN_BYTES` of elements of ``itemsize`` bytes."""
    step = max(1, ALIGN_BYTES // itemsize)
    return -(-width // step) * step


class GroupMatrices:
    """One (m, p) matrix per group, for products with one vector per group: stored as (g, m', p'), m' and p'
    rounded up to whole 64 bytes (`aligned_width`) with zeros beyond, so that every group's matrix, each
    of its rows, each padded vector and each result row starts 64-byte aligned whatever the group's place
    in the chunk. Each product is one batched product over the chunk's groups, ``v' M'`` or ``u' M`` as
    (g, 1, p') x (g, p', m'): MKL runs it as one small product per group, in parallel over the groups, with
    the same kernel and alignment for every group, so a group's result does not depend on its chunk
    (tests/test_two_level.py). (One matrix-vector product per group, the form before, ran on one core:
    forest x Fourier's four products per iteration took 13.6 ms, about 6.3 ms batched on 2 cores,
    docs/benchmarks.md.)"""

    def __init__(self, padded: torch.Tensor, rows: int, columns: int) -> None:
        """``padded`` (g, m', p'), zeros beyond (m, p) = (``rows``, ``columns``): use `zeros` or `of`."""
        self.padded, self.rows, self.columns = padded, rows, columns

    @classmethod
    def zeros(cls, groups: int, rows: int, columns: int, like: torch.Tensor) -> "GroupMatrices":
        """(g, m, p) zero matrices of ``like``'s dtype and device, to be filled through `matrices`."""
        size = like.element_size()
        return cls(like.new_zeros(groups, aligned_width(rows, size), aligned_width(columns, size)), rows, columns)

    @classmethod
    def of(cls, stacked: torch.Tensor) -> "GroupMatrices":
        """``stacked`` (g, m, p), copied into the padded layout."""
        out = cls.zeros(*stacked.shape, like=stacked)
        out.matrices.copy_(stacked)
        return out

    @property
    def matrices(self) -> torch.Tensor:
        """(g, m, p): a view of the matrices without their padding."""
        return self.padded[:, :self.rows, :self.columns]

    def _as_rows(self, vectors: torch.Tensor, width: int) -> torch.Tensor:
        """(g, k) -> (g, 1, width), zeros beyond k: a fresh tensor, every row 64-byte aligned."""
        out = vectors.new_empty(vectors.shape[0], 1, width)
        out[:, 0, :vectors.shape[-1]] = vectors
        out[:, 0, vectors.shape[-1]:] = 0
        return out

    def times(self, vectors: torch.Tensor) -> torch.Tensor:
        """M_i v_i: (g, p) -> (g, m)."""
        rows = self._as_rows(vectors, self.padded.shape[-1])
        return torch.bmm(rows, self.padded.mT)[:, 0, :self.rows]

    def transposed_times(self, vectors: torch.Tensor) -> torch.Tensor:
        """M_i' u_i: (g, m) -> (g, p)."""
        rows = self._as_rows(vectors, self.padded.shape[-2])
        return torch.bmm(rows, self.padded)[:, 0, :self.columns]


class CoarseCorrection:
    """The balancing two-level preconditioner around a one-level ``base`` M^-1, and CG's start (module docstring).

    Args:
        space: Z; a_phi: per group H (S, D), the sources' Phi' U_s / n; penalty: P; jitter: the
        system's jitter; inverse: per group E^-1 (k, k).
    """

    def __init__(self, space: CoarseSpace, a_phi: GroupMatrices, penalty: BlockPenalty, jitter: float,
                 inverse: GroupMatrices) -> None:
        self.space, self.a_phi, self.penalty, self.jitter, self.inverse = space, a_phi, penalty, jitter, inverse

    def a_z(self, c: torch.Tensor) -> torch.Tensor:
        """A Z c (g, D) for c (g, k), without a product with Phi."""
        zc = self.space.prolong(c)
        out = self.penalty.matvec(zc).add_(zc, alpha=self.jitter)
        return out.add_(self.a_phi.transposed_times(self.space.by_source(c)))

    def a_z_transposed(self, y: torch.Tensor) -> torch.Tensor:
        """(A Z)' y = Z' A y (g, k) for y (g, D)."""
        h = self.a_phi.times(y)  # (g, S): U_s' Phi y / n
        return h[:, self.space.source] + self.space.restrict(self.penalty.matvec(y).add_(y, alpha=self.jitter))

    def solve_coarse(self, c: torch.Tensor) -> torch.Tensor:
        """E^-1 c (g, k)."""
        return self.inverse.times(c)

    def start(self, rhs: torch.Tensor, x0: Optional[torch.Tensor],
              matvec: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """CG's start x0 + Q (b - A x0) (Q b from zeros), whose residual has Z' r = 0."""
        residual = rhs if x0 is None else rhs - matvec(x0)
        correction = self.space.prolong(self.solve_coarse(self.space.restrict(residual)))
        return correction if x0 is None else x0 + correction

    def around(self, base: Preconditioner) -> Preconditioner:
        """M2^-1 r = (I - Q A) M^-1 (I - A Q) r + Q r (the balancing form), Q = Z E^-1 Z'."""
        def apply(r: torch.Tensor) -> torch.Tensor:
            c = self.solve_coarse(self.space.restrict(r))
            y = base(r - self.a_z(c))
            return y + self.space.prolong(c - self.solve_coarse(self.a_z_transposed(y)))
        return apply


def coarse_correction(chunk: DesignChunk, a_phi: GroupMatrices, penalty: BlockPenalty,
                      jitter: float) -> Optional[CoarseCorrection]:
    """The correction of a chunk of groups from H = a_phi (g, S, D) (already divided by n; kept, not
    copied): E = Z' A Z factored per group; None (with a warning) where some group's E is not positive
    definite."""
    space = coarse_space(chunk)
    h = a_phi.matrices
    segment = h.new_zeros(h.shape[0], h.shape[1], space.size).index_add_(2, space.assignment, h)
    coarse = segment[:, space.source, :].mT + coarse_penalty(space, chunk, penalty)  # Z' H_s(j), + Z' P Z
    coarse.diagonal(dim1=-2, dim2=-1).add_(jitter * space.sizes.to(coarse.dtype))
    coarse = (coarse + coarse.mT) / 2
    factor, info = torch.linalg.cholesky_ex(coarse)
    if bool((info > 0).any()):
        log.warning("the coarse system Z'AZ is not positive definite: block-Jacobi without the coarse correction")
        return None
    return CoarseCorrection(space, a_phi, penalty, jitter, GroupMatrices.of(per_group_inverse(factor)))


def two_level_dims(dense_width: int, indexed: List[Tuple[int, int, int]]) -> Tuple[int, int]:
    """(S, k) of a design: Dd + sum Q_b sources and Dd + sum T_b' Q_b coarse columns, for indexed
    blocks given as (R, Q, T) (T_b' = T_b when T_b divides R, else 1)."""
    sources, size = dense_width, dense_width
    for grid_rows, q, slots in indexed:
        sources += q
        size += (slots if grid_rows % slots == 0 else 1) * q
    return sources, size
