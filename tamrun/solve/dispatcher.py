"""The dispatcher: builds each group chunk's normal equations (or CG operator) chunk by chunk, under
the memory tracker and the OOM guard, and hands them to the solver the oracle chose.

Per group g with n_g real rows, weights w in {0, 1} (padding has w = 0):
    A_g = Phi_g' W Phi_g / n_g + P + jitter I,     b_g = Phi_g' W y_g / n_g
direct: A_g accumulated over row chunks, then batched Cholesky.
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
from tamrun.effects.design import AdditiveDesign
from tamrun.memory.guard import OomLog, retry_on_oom
from tamrun.memory.oracle import Plan
from tamrun.memory.tracker import MemoryTracker
from tamrun.solve.cg import DEFAULT_TOL, conjugate_gradient
from tamrun.solve.direct import cholesky_solve

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
    """

    def __init__(self, design: AdditiveDesign, devices: DeviceManager, plan: Plan, solver: SolverConfig,
                 oom_policy: OomConfig, oom_log: OomLog, tracker: Optional[MemoryTracker] = None,
                 snapshot: Callable[[str], None] = lambda label: None) -> None:
        self.design = design
        self.devices = devices
        self.plan = plan
        self.solver = solver
        self.oom_policy = oom_policy
        self.oom_log = oom_log
        self.tracker = tracker or MemoryTracker(None, plan.overhead)
        self.snapshot = snapshot
        self._learned: dict = {}  # phase -> chunk size an OOM taught

    def _guarded(self, step: Callable[[int], Tuple[int, int]], total: int, chunk: int, rows: int, phase: str,
                 cost) -> int:
        """Run ``step(start, size)`` over ``total`` groups in chunks, each charged to the tracker and
        retried with fewer groups on OOM; returns the chunk size that was kept (and remembered for
        the phase's next call)."""
        chunk = min(chunk, self._learned.get(phase, chunk))
        start = 0
        while start < total:
            def attempt(size: int, start: int = start) -> Tuple[int, int]:
                take = min(size, total - start)
                with self.tracker.hold(cost.bytes(take, rows, 1.0), f"{phase} of {take} group(s)"):
                    step(start, take)
                self.snapshot(f"{phase} groups {start}..{start + take - 1}")
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
        penalty = self.design.penalty().to(device=self.devices.device, dtype=batch.x.dtype)
        solve = self._fit_direct if self.plan.route == "direct" else self._fit_cg

        def step(start: int, size: int) -> None:
            groups = slice(start, start + size)
            coef[groups] = solve(batch, groups, penalty, stats).cpu()

        stats.group_chunk = self._guarded(step, len(batch.groups), self.plan.fit.groups, self.plan.fit.rows,
                                          f"fit/{self.plan.route}", self.plan.fit_cost)
        return coef, stats

    def _weighted_design(self, batch: GroupedBatch, groups: slice, rows: slice) -> Tuple[torch.Tensor, torch.Tensor]:
        """(W Phi, W y) of a chunk: padded rows zeroed in place (no second copy of Phi)."""
        device = self.devices.device
        x, y, w = (batch.x[groups, rows].to(device), batch.y[groups, rows].to(device),
                   batch.weight[groups, rows].to(device))
        return self.design.design(x, groups).mul_(w.unsqueeze(-1)), y * w

    def _system_scale(self, batch: GroupedBatch, groups: slice) -> torch.Tensor:
        return batch.counts[groups].to(self.devices.device).clamp_min(1.0)

    def _fit_direct(self, batch: GroupedBatch, groups: slice, penalty: torch.Tensor, stats: FitStats) -> torch.Tensor:
        g, dim = groups.stop - groups.start, self.design.width
        dtype, device = batch.x.dtype, self.devices.device
        gram = torch.zeros(g, dim, dim, dtype=dtype, device=device)
        rhs = torch.zeros(g, dim, dtype=dtype, device=device)
        for r0, r1 in _spans(batch.x.shape[1], self.plan.fit.rows):
            phi, y = self._weighted_design(batch, groups, slice(r0, r1))
            gram.baddbmm_(phi.mT, phi)  # weights are 0/1, so (W Phi)'(W Phi) = Phi' W Phi
            rhs.unsqueeze(-1).baddbmm_(phi.mT, y.unsqueeze(-1))
            del phi, y
        n = self._system_scale(batch, groups)
        gram.div_(n.view(-1, 1, 1)).add_(penalty).diagonal(dim1=-2, dim2=-1).add_(self.solver.jitter)
        rhs.div_(n.view(-1, 1))
        coef, direct = cholesky_solve(gram, rhs, self.solver.jitter, self.solver.jitter_growth,
                                      self.solver.jitter_max_tries)
        stats.jitter_escalations = max(stats.jitter_escalations, direct.jitter_escalations)
        stats.lu_fallback_groups += direct.lu_fallback_groups
        return coef

    def _fit_cg(self, batch: GroupedBatch, groups: slice, penalty: torch.Tensor, stats: FitStats) -> torch.Tensor:
        spans = list(_spans(batch.x.shape[1], self.plan.fit.rows))
        n = self._system_scale(batch, groups).view(-1, 1)
        cached: Optional[List[torch.Tensor]] = None
        if self.plan.cache_design:
            cached = [self._weighted_design(batch, groups, slice(r0, r1))[0] for r0, r1 in spans]

        def weighted_blocks() -> Iterator[torch.Tensor]:
            if cached is not None:
                yield from cached
            else:
                for r0, r1 in spans:
                    yield self._weighted_design(batch, groups, slice(r0, r1))[0]

        g = groups.stop - groups.start
        rhs = torch.zeros(g, self.design.width, dtype=batch.x.dtype, device=self.devices.device)
        diag = torch.zeros_like(rhs)
        for (r0, r1), phi_w in zip(spans, weighted_blocks()):  # rhs and Jacobi diagonal in one pass
            y = batch.y[groups, r0:r1].to(self.devices.device)
            rhs += torch.einsum("gnd,gn->gd", phi_w, y)
            diag += (phi_w * phi_w).sum(dim=1)
        rhs /= n
        diag = diag / n + penalty.diagonal() + self.solver.jitter

        def matvec(v: torch.Tensor) -> torch.Tensor:
            acc = torch.zeros_like(v)
            for phi_w in weighted_blocks():
                acc += torch.einsum("gnd,gn->gd", phi_w, torch.einsum("gnd,gd->gn", phi_w, v))
            return acc / n + v @ penalty + self.solver.jitter * v

        inverse_diagonal = 1.0 / diag if self.solver.preconditioner.value == "jacobi" else None
        tol = self.solver.tol if self.solver.tol is not None else DEFAULT_TOL[rhs.dtype]
        result = conjugate_gradient(matvec, rhs, inverse_diagonal, tol, self.solver.max_iter)
        stats.cg_iterations = max(stats.cg_iterations, int(result.iterations.max()))
        stats.cg_unconverged_groups += int((~result.converged).sum())
        stats.cg_final_residual = max(stats.cg_final_residual, float(result.relative_residual.max()))
        if not stats.cg_history:
            stats.cg_history = result.history
        return result.x

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
                phi = self.design.design(batch.x[groups, r0:r1].to(self.devices.device), groups)
                out[groups, r0:r1] = torch.einsum("gnd,gd->gn", phi, coef_dev[groups]).cpu()
                del phi

        self._guarded(step, n_groups, self.plan.predict.groups, rows, "predict", self.plan.predict_cost)
        return out.mul_(batch.weight)
