"""The penalised systems of a chunk of groups, assembled from the design row chunk by row chunk.

Per group g with n_g real rows and 0/1 row weights W (padding has weight 0):

    A_g = Phi_g' W Phi_g / n_g + P + jitter I,        b_g = Phi_g' W y_g / n_g

`normal_equations` accumulates Phi' W Phi and Phi' W y over row chunks (direct route);
`solve_normal_equations` normalises, adds P and the jitter and solves by batched Cholesky;
`CgSystem` gives A only through products (CG route): A v = (W Phi)' (W Phi v) / n + P v + jitter v,
with W Phi kept between products when the plan allows, and the pieces of the preconditioner
(diag A, the dense effects' block, the grid rows' blocks, and for two_level the coarse sources
Phi' U_s of `tamrun.solve.coarse`) gathered in one pass over the rows.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import torch

from tamrun.config.schema import SolverConfig
from tamrun.data.batch import GroupedBatch
from tamrun.effects.chunk import BlockPenalty, DesignChunk, add_gram_
from tamrun.effects.design import AdditiveDesign
from tamrun.machine.sampling import repeating
from tamrun.solve.coarse import CoarseCorrection, GroupMatrices, accumulate_sources, coarse_correction
from tamrun.solve.direct import cholesky_solve
from tamrun.solve.preconditioners import Preconditioner, grid_block_inverses, preconditioner
from tamrun.solve.stats import SolveStats


def row_spans(total: int, size: int) -> Iterator[Tuple[int, int]]:
    """[start, stop) of consecutive chunks of ``size`` over ``total`` rows (the last one shorter)."""
    for start in range(0, total, size):
        yield start, min(start + size, total)


def design_chunk(design: AdditiveDesign, batch: GroupedBatch, groups: slice, rows: slice, device: torch.device,
                 weighted: bool = True) -> Tuple[DesignChunk, torch.Tensor]:
    """(W Phi, W y) of rows ``rows`` of groups ``groups`` on ``device`` (W: the 0/1 row weights;
    ``weighted=False`` leaves Phi unweighted)."""
    x, y, w = (batch.x[groups, rows].to(device), batch.y[groups, rows].to(device), batch.weight[groups, rows].to(device))
    return design.chunk(x, groups, w if weighted else None), y * w


def system_scale(batch: GroupedBatch, groups: slice, device: torch.device) -> torch.Tensor:
    """n_g (g,): the real rows of each group (at least 1)."""
    return batch.counts[groups].to(device).clamp_min(1.0)


def normal_equations(design: AdditiveDesign, batch: GroupedBatch, groups: slice, device: torch.device,
                     row_chunk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Phi' W Phi (g, D, D) and Phi' W y (g, D) of a slice of groups, accumulated over chunks of
    ``row_chunk`` rows (not normalised by n)."""
    g, dim = groups.stop - groups.start, design.width
    dtype = batch.x.dtype
    gram = torch.zeros(g, dim, dim, dtype=dtype, device=device)
    rhs = torch.zeros(g, dim, dtype=dtype, device=device)
    loop = object()  # names this loop's row chunks: they allocate alike, the shorter last one less
    for r0, r1 in row_spans(batch.x.shape[1], row_chunk):
        with repeating(("normal equations", loop), r1 - r0):
            chunk, y = design_chunk(design, batch, groups, slice(r0, r1), device)
            if chunk.indexed:
                gram += chunk.gram()
            else:  # weights are 0/1, so (W Phi)'(W Phi) = Phi' W Phi
                add_gram_(gram, chunk.dense)
            rhs += chunk.rmatvec(y)
            del chunk, y
    return gram, rhs


def solve_normal_equations(gram: torch.Tensor, rhs: torch.Tensor, n: torch.Tensor, penalty: BlockPenalty,
                           solver: SolverConfig) -> Tuple[torch.Tensor, SolveStats]:
    """beta = (gram / n + P + jitter I)^-1 rhs / n for gram (g, D, D), rhs (g, D), n (g,): in place on
    gram and rhs. Settings: solver.jitter and its escalation (`cholesky_solve`)."""
    gram.div_(n.view(-1, 1, 1))
    penalty.add_to(gram)
    gram.diagonal(dim1=-2, dim2=-1).add_(solver.jitter)
    rhs.div_(n.view(-1, 1))
    return cholesky_solve(gram, rhs, solver.jitter, solver.jitter_growth, solver.jitter_max_tries)


def indexed_spans(design: AdditiveDesign) -> List[Tuple[int, int]]:
    """(first column, width) of each indexed effect's block, in the design's order."""
    start, spans = design.dense_width, []
    for effect in design.indexed_effects:
        spans.append((start, effect.width))
        start += effect.width
    return spans


class CgSystem:
    """A_g of a chunk of groups for the CG route: ``rhs`` (g, D), ``matvec(v)`` and ``preconditioner``.

    Args:
        design, batch, groups, device: the groups' rows.
        row_chunk: rows per design chunk.
        cache: keep W Phi between products (the plan's cache_design), else rebuild it at each product.
        penalty: P on the device; solver: jitter, preconditioner and block_max_dim.
    """

    def __init__(self, design: AdditiveDesign, batch: GroupedBatch, groups: slice, device: torch.device,
                 row_chunk: int, cache: bool, penalty: BlockPenalty, solver: SolverConfig) -> None:
        self.design, self.batch, self.groups, self.device = design, batch, groups, device
        self.penalty, self.solver = penalty, solver
        self.spans = [slice(r0, r1) for r0, r1 in row_spans(batch.x.shape[1], row_chunk)]
        self.n = system_scale(batch, groups, device).view(-1, 1)
        self.cached: Optional[List[DesignChunk]] = None
        self.coarse: Optional[CoarseCorrection] = None  # two_level's correction (set by _assemble)
        if cache:
            self.cached = []
            for rows in self.spans:  # chunks of a size keep alike (`tamrun.machine.sampling`)
                with repeating(("kept chunk", self.n.shape[0], rows.stop - rows.start, design.width, batch.x.dtype),
                               keeps=True):
                    self.cached.append(self.chunk(rows))
        self.rhs, self.preconditioner = self._assemble()

    def chunk(self, rows: slice) -> DesignChunk:
        """W Phi of ``rows``, prepared for the products (`DesignChunk.prepare`)."""
        return design_chunk(self.design, self.batch, self.groups, rows, self.device)[0].prepare()

    def chunks(self) -> Iterator[DesignChunk]:
        """W Phi chunk by chunk: the kept chunks, or each one rebuilt."""
        if self.cached is not None:
            yield from self.cached
        else:
            for rows in self.spans:
                yield self.chunk(rows)

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """A v for v (g, D)."""
        acc = torch.zeros_like(v)
        blocks = [v[:, start:start + width].contiguous() for start, width in indexed_spans(self.design)]  # once
        for rows, chunk in zip(self.spans, self.chunks()):
            with repeating(("product", v.shape, rows.stop - rows.start, v.dtype)):  # the chunks of a size alike
                chunk.rmatvec(chunk.matvec(v, blocks), out=acc)
        return acc / self.n + self.penalty.matvec(v) + self.solver.jitter * v

    def _assemble(self) -> Tuple[torch.Tensor, Optional[Preconditioner]]:
        """b, and M^-1 from diag A, the dense block and the grid blocks, all in one pass over the rows."""
        batch, groups, n, solver = self.batch, self.groups, self.n, self.solver
        g, dd = groups.stop - groups.start, self.design.dense_width
        rhs = torch.zeros(g, self.design.width, dtype=batch.x.dtype, device=self.device)
        diag = torch.zeros_like(rhs)
        dd = dd if dd <= solver.block_max_dim else 0  # block_jacobi only for a small dense block
        dense_gram = torch.zeros(g, dd, dd, dtype=rhs.dtype, device=rhs.device)
        blocked = solver.preconditioner.value in ("block_jacobi", "two_level")
        two_level = solver.preconditioner.value == "two_level" and bool(self.design.indexed_effects)
        grid_grams: Optional[List[torch.Tensor]] = None
        sources: Optional[GroupMatrices] = None  # two_level: Phi' U_s (g, S, D) (solve/coarse.py)
        loop = object()  # names this pass's row chunks: after the first (which makes the totals) they
        for index, (rows, chunk) in enumerate(zip(self.spans, self.chunks())):  # allocate alike
            with repeating(("assembly", loop, index == 0), rows.stop - rows.start):
                y = (batch.y[groups, rows] * batch.weight[groups, rows]).to(self.device)
                rhs += chunk.rmatvec(y)
                diag += chunk.squared_column_sums()
                if dd:
                    add_gram_(dense_gram, chunk.dense)
                if blocked:
                    grid_grams = accumulate(grid_grams, chunk.grid_grams())
                if two_level:
                    sources = accumulate_sources(sources, chunk)
                del y
        rhs /= n
        diag = diag / n + self.penalty.diagonal() + solver.jitter
        dense_block = dense_gram / n.unsqueeze(-1) + self.penalty.leading(dd)
        dense_block.diagonal(dim1=-2, dim2=-1).add_(solver.jitter)
        grid_blocks = grid_block_inverses(grid_grams or [], indexed_spans(self.design), self.penalty, n, solver.jitter)
        del grid_grams
        one_level = preconditioner(solver.preconditioner.value, diag, dense_block, grid_blocks, solver.block_max_dim)
        if sources is not None:
            sources.matrices.div_(n.unsqueeze(-1))
            self.coarse = coarse_correction(chunk, sources, self.penalty, solver.jitter)
        return rhs, one_level if self.coarse is None else self.coarse.around(one_level)

    def start(self, x0: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """CG's first iterate: ``x0`` (None: zeros), moved by the two-level correction when there is
        one (`CoarseCorrection.start`)."""
        return x0 if self.coarse is None else self.coarse.start(self.rhs, x0, self.matvec)


def accumulate(totals: Optional[List[torch.Tensor]], parts: List[torch.Tensor]) -> List[torch.Tensor]:
    """Add ``parts`` to ``totals`` in place, element by element (the first parts become the totals)."""
    if totals is None:
        return parts
    for total, part in zip(totals, parts):
        total += part
    return totals
