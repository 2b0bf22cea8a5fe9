"""The dispatcher: builds each group chunk's normal equations (or CG operator) chunk by chunk, under
the memory tracker and the OOM guard, and hands them to the solver the oracle chose.

Per group g with n_g real rows, weights w in {0, 1} (padding has w = 0):
    A_g = Phi_g' W Phi_g / n_g + P + jitter I,     b_g = Phi_g' W y_g / n_g
direct: A_g accumulated over row chunks, then batched Cholesky; or, in the dual form (n_g < D), the
        N x N kernel system of `tamrun.solve.dual`, one group at a time.
cg:     A_g v = (W Phi_g)' (W Phi_g v) / n_g + P v + jitter v, with W Phi_g kept (if the plan allows)
        or rebuilt chunk by chunk at each product; Jacobi preconditioner diag(A_g).
A step that runs out of memory (or would exceed the tracker's budget) is retried with fewer groups.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from tamrun.config.schema import OomConfig, SolverConfig
from tamrun.data.batch import GroupedBatch
from tamrun.device import DeviceManager
from tamrun.effects.chunk import BlockPenalty, DesignChunk, add_gram_
from tamrun.effects.design import AdditiveDesign
from tamrun.memory.guard import OomLog, retry_on_oom
from tamrun.memory.oracle import Plan
from tamrun.memory.tracker import MemoryTracker
from tamrun.solve.cg import DEFAULT_TOL, conjugate_gradient
from tamrun.solve.direct import cholesky_solve
from tamrun.solve.dual import dual_coefficients

log = logging.getLogger(__name__)


@dataclass
class FitStats:
    route: str
    group_chunk: int
    row_chunk: int
    jitter_escalations: int = 0
    lu_fallback_groups: int = 0
    cg_iterations: int = 0  # max over groups and chunks
    cg_unconverged_groups: int = 0
    cg_final_residual: float = 0.0  # worst final ||r|| / ||b||
    cg_history: List[float] = field(default_factory=list)  # worst residual per iteration (first chunk)


def per_group_inverse(factor: torch.Tensor) -> torch.Tensor:
    """(L L')^-1 from Cholesky factors (g, ..., K, K), one group at a time: a batched
    cholesky_inverse rounds a group differently with other groups beside it (seen with MKL on AMD
    CPUs), and a memory cap changes which groups share a chunk (see `tamrun.effects.chunk`)."""
    return torch.stack([torch.cholesky_inverse(group) for group in factor])


def _spans(total: int, size: int) -> Iterator[Tuple[int, int]]:
    for start in range(0, total, size):
        yield start, min(start + size, total)


class Dispatcher:
    """Fits and predicts one additive design over a batch of groups.

    Args:
        design: the fitted `AdditiveDesign` (width D).
        devices: the run's `DeviceManager`.
        plan: the oracle's `Plan` (route, chunk sizes and their per-group costs).
        solver: solver settings (tolerance, iterations, preconditioner, jitter).
        oom_policy, oom_log: the retry settings and the run's OOM event log.
        tracker: the budget every step is charged to (None: an unlimited one).
        snapshot: called with a label after each chunk (the memory timeline).
        initial: (G, D) coefficients CG starts from (solver.warm_start), None for zeros.
    """

    def __init__(self, design: AdditiveDesign, devices: DeviceManager, plan: Plan, solver: SolverConfig,
                 oom_policy: OomConfig, oom_log: OomLog, tracker: Optional[MemoryTracker] = None,
                 snapshot: Callable[[str], None] = lambda label: None,
                 initial: Optional[torch.Tensor] = None) -> None:
        self.design = design
        self.devices = devices
        self.plan = plan
        self.solver = solver
        self.oom_policy = oom_policy
        self.oom_log = oom_log
        self.tracker = tracker or MemoryTracker(None, plan.overhead)
        self.snapshot = snapshot
        self._learned: dict = {}  # phase -> chunk size an OOM taught
        self.initial = initial

    def _guarded(self, step: Callable[[int], Tuple[int, int]], total: int, chunk: int, rows: int, phase: str,
                 cost, unit: str = "groups") -> int:
        """Run ``step(start, size)`` over ``total`` groups (or other ``unit``s: the adaptive mode's
        windows) in chunks, each charged ``cost.bytes(size, rows, 1.0)`` to the tracker and retried
        with fewer on OOM; returns the chunk size that was kept (and remembered for the phase's next call)."""
        chunk = min(chunk, self._learned.get(phase, chunk))
        start = 0
        while start < total:
            def attempt(size: int, start: int = start) -> Tuple[int, int]:
                take = min(size, total - start)
                with self.tracker.hold(cost.bytes(take, rows, 1.0), f"{phase} of {take} {unit}"):
                    step(start, take)
                self.snapshot(f"{phase} {unit} {start}..{start + take - 1}")
                return take, size

            done, chunk = retry_on_oom(attempt, chunk, self.oom_policy, phase, self.oom_log,
                                       free_memory=self.devices.empty_cache,
                                       needed_bytes=lambda size: cost.bytes(size, rows, self.plan.overhead))
            start += done
        self._learned[phase] = chunk
        return chunk

    # ---- fit -------------------------------------------------------------------------------------
    def fit(self, batch: GroupedBatch) -> Tuple[torch.Tensor, FitStats]:
        """Coefficients (G, D) in the batch's dtype, on the CPU, and the fit statistics."""
        stats = FitStats(route=self.plan.route, group_chunk=self.plan.fit.groups, row_chunk=self.plan.fit.rows)
        coef = torch.empty(len(batch.groups), self.design.width, dtype=batch.x.dtype)
        penalty = self.design.penalty_operator().to(self.devices.device, batch.x.dtype)
        solve = self._fit_cg if self.plan.route == "cg" else self._fit_dual if self.plan.dual else self._fit_direct

        def step(start: int, size: int) -> None:
            groups = slice(start, start + size)
            coef[groups] = solve(batch, groups, penalty, stats).cpu()

        stats.group_chunk = self._guarded(step, len(batch.groups), self.plan.fit.groups, self.plan.fit.rows,
                                          f"fit/{self.plan.route}", self.plan.fit_cost)
        return coef, stats

    def _chunk(self, batch: GroupedBatch, groups: slice, rows: slice, weighted: bool = True):
        """(design chunk, W y) of a slice: padded rows have weight 0."""
        device = self.devices.device
        x, y, w = (batch.x[groups, rows].to(device), batch.y[groups, rows].to(device),
                   batch.weight[groups, rows].to(device))
        return self.design.chunk(x, groups, w if weighted else None), y * w

    def _system_scale(self, batch: GroupedBatch, groups: slice) -> torch.Tensor:
        return batch.counts[groups].to(self.devices.device).clamp_min(1.0)

    def _fit_direct(self, batch: GroupedBatch, groups: slice, penalty: BlockPenalty, stats: FitStats) -> torch.Tensor:
        gram, rhs = self.normal_equations(batch, groups)
        return self.solve_normal_equations(gram, rhs, self._system_scale(batch, groups), penalty, stats)

    def normal_equations(self, batch: GroupedBatch, groups: slice) -> Tuple[torch.Tensor, torch.Tensor]:
        """Phi' W Phi (g, D, D) and Phi' W y (g, D) of a slice of groups, accumulated over row chunks
        (not normalised by n)."""
        g, dim = groups.stop - groups.start, self.design.width
        dtype, device = batch.x.dtype, self.devices.device
        gram = torch.zeros(g, dim, dim, dtype=dtype, device=device)
        rhs = torch.zeros(g, dim, dtype=dtype, device=device)
        for r0, r1 in _spans(batch.x.shape[1], self.plan.fit.rows):
            chunk, y = self._chunk(batch, groups, slice(r0, r1))
            if chunk.indexed:
                gram += chunk.gram()
            else:  # weights are 0/1, so (W Phi)'(W Phi) = Phi' W Phi
                add_gram_(gram, chunk.dense)
            rhs += chunk.rmatvec(y)
            del chunk, y
        return gram, rhs

    def solve_normal_equations(self, gram: torch.Tensor, rhs: torch.Tensor, n: torch.Tensor, penalty: BlockPenalty,
                               stats: FitStats) -> torch.Tensor:
        """beta = (gram / n + P + jitter I)^-1 rhs / n for (g, D, D), (g, D), n (g,): in place on gram and rhs."""
        gram.div_(n.view(-1, 1, 1))
        penalty.add_to(gram)
        gram.diagonal(dim1=-2, dim2=-1).add_(self.solver.jitter)
        rhs.div_(n.view(-1, 1))
        coef, direct = cholesky_solve(gram, rhs, self.solver.jitter, self.solver.jitter_growth,
                                      self.solver.jitter_max_tries)
        stats.jitter_escalations = max(stats.jitter_escalations, direct.jitter_escalations)
        stats.lu_fallback_groups += direct.lu_fallback_groups
        return coef

    def _fit_dual(self, batch: GroupedBatch, groups: slice, penalty: BlockPenalty, stats: FitStats) -> torch.Tensor:
        """The direct route in the dual form (`tamrun.solve.dual`): all rows of the groups at once."""
        parts = [self._chunk(batch, groups, slice(r0, r1)) for r0, r1 in _spans(batch.x.shape[1], self.plan.fit.rows)]
        weighted_y = torch.cat([y for _, y in parts], dim=1)
        coef, direct = dual_coefficients([chunk for chunk, _ in parts], penalty, weighted_y,
                                         self._system_scale(batch, groups), self.solver)
        stats.jitter_escalations = max(stats.jitter_escalations, direct.jitter_escalations)
        stats.lu_fallback_groups += direct.lu_fallback_groups
        return coef

    def _fit_cg(self, batch: GroupedBatch, groups: slice, penalty: BlockPenalty, stats: FitStats) -> torch.Tensor:
        spans = [slice(r0, r1) for r0, r1 in _spans(batch.x.shape[1], self.plan.fit.rows)]
        n = self._system_scale(batch, groups).view(-1, 1)
        cached: Optional[List[DesignChunk]] = None
        if self.plan.cache_design:
            cached = [self._chunk(batch, groups, rows)[0] for rows in spans]

        def chunks() -> Iterator[DesignChunk]:
            if cached is not None:
                yield from cached
            else:
                for rows in spans:
                    yield self._chunk(batch, groups, rows)[0]

        g, dd = groups.stop - groups.start, self.design.dense_width
        rhs = torch.zeros(g, self.design.width, dtype=batch.x.dtype, device=self.devices.device)
        diag = torch.zeros_like(rhs)
        dd = dd if dd <= self.solver.block_max_dim else 0  # block_jacobi only for a small dense block
        dense_gram = torch.zeros(g, dd, dd, dtype=rhs.dtype, device=rhs.device)
        blocked = self.solver.preconditioner.value == "block_jacobi"
        grid_grams: Optional[List[torch.Tensor]] = None
        for rows, chunk in zip(spans, chunks()):  # rhs, Jacobi diagonal and the blocks in one pass
            y = (batch.y[groups, rows] * batch.weight[groups, rows]).to(self.devices.device)
            rhs += chunk.rmatvec(y)
            diag += chunk.squared_column_sums()
            if dd:
                add_gram_(dense_gram, chunk.dense)
            if blocked:
                grams = chunk.grid_grams()
                if grid_grams is None:
                    grid_grams = grams
                else:
                    for total, part in zip(grid_grams, grams):
                        total += part
                del grams
        rhs /= n
        diag = diag / n + penalty.diagonal() + self.solver.jitter
        dense_block = dense_gram / n.unsqueeze(-1) + penalty.leading(dd)
        dense_block.diagonal(dim1=-2, dim2=-1).add_(self.solver.jitter)

        def matvec(v: torch.Tensor) -> torch.Tensor:
            acc = torch.zeros_like(v)
            for chunk in chunks():
                acc += chunk.rmatvec(chunk.matvec(v))
            return acc / n + penalty.matvec(v) + self.solver.jitter * v

        tol = self.solver.tol if self.solver.tol is not None else DEFAULT_TOL[rhs.dtype]
        grid_blocks = self._grid_blocks(grid_grams or [], penalty, n)
        del grid_grams
        x0 = None if self.initial is None else self.initial[groups].to(device=rhs.device, dtype=rhs.dtype)
        result = conjugate_gradient(matvec, rhs, self._preconditioner(diag, dense_block, grid_blocks), tol,
                                    self.solver.max_iter, x0)
        stats.cg_iterations = max(stats.cg_iterations, int(result.iterations.max()))
        stats.cg_unconverged_groups += int((~result.converged).sum())
        stats.cg_final_residual = max(stats.cg_final_residual, float(result.relative_residual.max()))
        if not stats.cg_history:
            stats.cg_history = result.history
        return result.x

    def _grid_blocks(self, grid_grams: List[torch.Tensor], penalty: BlockPenalty,
                     n: torch.Tensor) -> List[Tuple[int, torch.Tensor]]:
        """Inverses of the per-leaf (Q, Q) blocks of A for indexed blocks with Q > 1, from their
        Cholesky factors: [(first column, inverse (g, R, Q, Q))]."""
        out = []
        grid_penalties = [b for b in penalty.blocks if b.grid]
        for gram, (start, width), pen in zip(grid_grams, self._indexed_spans(), grid_penalties):
            if gram.numel() == 0:
                continue
            block = gram.div_(n.view(-1, 1, 1, 1)).add_(pen.matrix)  # in place: the Gram is not needed after
            block.diagonal(dim1=-2, dim2=-1).add_(self.solver.jitter)
            factor, info = torch.linalg.cholesky_ex(block)
            del block
            if bool((info > 0).any()):
                log.warning("a leaf block is not positive definite: Jacobi on its columns")
                continue
            out.append((start, per_group_inverse(factor)))
        return out

    def _indexed_spans(self) -> List[Tuple[int, int]]:
        start, spans = self.design.dense_width, []
        for effect in self.design.indexed_effects:
            spans.append((start, effect.width))
            start += effect.width
        return spans

    def _preconditioner(self, diag: torch.Tensor, dense_block: torch.Tensor,
                        grid_blocks: List[Tuple[int, torch.Tensor]]):
        """M^-1 per solver.preconditioner: none; jacobi (1 / diag A); block_jacobi (the dense
        effects' block of A inverted exactly by Cholesky, each leaf's (Q, Q) block of a forest
        crossing likewise, Jacobi on the other columns)."""
        kind = self.solver.preconditioner.value
        if kind == "none":
            return None
        inverse_diagonal = 1.0 / diag
        if kind == "jacobi":
            return lambda r: r * inverse_diagonal
        dd = dense_block.shape[-1]
        dense_inverse = None
        if 0 < dd <= self.solver.block_max_dim:
            factor, info = torch.linalg.cholesky_ex(dense_block)
            if bool((info > 0).any()):
                log.warning("the dense block is not positive definite: Jacobi on its columns")
            else:
                dense_inverse = per_group_inverse(factor)

        # Explicit block inverses (a preconditioner needs no more accuracy; products are several times
        # faster than triangular solves). The dense block is applied elementwise (a batched product of
        # one vector per group takes a different path for a chunk of one group; see effects/chunk.py);
        # the many small leaf blocks go through the batched product's per-element loop.
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

    # ---- predict ---------------------------------------------------------------------------------
    def predict(self, batch: GroupedBatch, coef: torch.Tensor) -> torch.Tensor:
        """Predictions (G, N) on the CPU; padded rows hold 0."""
        n_groups, n_rows = batch.x.shape[:2]
        out = torch.zeros(n_groups, n_rows, dtype=batch.x.dtype)
        rows = max(1, min(self.plan.predict.rows, n_rows))
        coef_dev = coef.to(device=self.devices.device, dtype=batch.x.dtype)

        def step(start: int, size: int) -> None:
            groups = slice(start, start + size)
            for r0, r1 in _spans(n_rows, rows):
                chunk = self.design.chunk(batch.x[groups, r0:r1].to(self.devices.device), groups)
                out[groups, r0:r1] = chunk.matvec(coef_dev[groups]).cpu()
                del chunk

        self._guarded(step, n_groups, self.plan.predict.groups, rows, "predict", self.plan.predict_cost)
        return out.mul_(batch.weight)
