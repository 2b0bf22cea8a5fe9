"""The dispatcher: builds each group chunk's normal equations (or CG operator) chunk by chunk, under
the OOM guard, and hands them to the solver the oracle chose.

Per group g with n_g real rows, weights w in {0, 1} (padding has w = 0):
    A_g = Phi_g' W Phi_g / n_g + P + jitter I,     b_g = Phi_g' W y_g / n_g
direct: A_g accumulated over row chunks, then batched Cholesky.
cg:     A_g v = Phi_g' W (Phi_g v) / n_g + P v + jitter v, with Phi_g kept (if the plan allows) or
        rebuilt chunk by chunk at each product; Jacobi preconditioner diag(A_g).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import torch

from tamrun.config.schema import OomConfig, SolverConfig
from tamrun.data.batch import GroupedBatch
from tamrun.device import DeviceManager
from tamrun.effects.design import AdditiveDesign
from tamrun.memory.guard import OomLog, retry_on_oom
from tamrun.memory.oracle import Plan
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
        plan: the oracle's `Plan` (route, chunk sizes, whether CG keeps Phi).
        solver: solver settings (tolerance, iterations, preconditioner, jitter).
        oom_policy, oom_log: the retry settings and the run's OOM event log.
    """

    def __init__(self, design: AdditiveDesign, devices: DeviceManager, plan: Plan, solver: SolverConfig,
                 oom_policy: OomConfig, oom_log: OomLog) -> None:
        self.design = design
        self.devices = devices
        self.plan = plan
        self.solver = solver
        self.oom_policy = oom_policy
        self.oom_log = oom_log

    # ---- fit -------------------------------------------------------------------------------------
    def fit(self, batch: GroupedBatch) -> Tuple[torch.Tensor, FitStats]:
        """Coefficients (G, D) in the batch's dtype, on the CPU, and the fit statistics."""
        stats = FitStats(route=self.plan.route, group_chunk=self.plan.fit.groups, row_chunk=self.plan.fit.rows)
        coef = torch.empty(len(batch.groups), self.design.width, dtype=batch.x.dtype)
        penalty = self.design.penalty().to(device=self.devices.device, dtype=batch.x.dtype)
        start = 0
        n_groups = len(batch.groups)
        chunk = self.plan.fit.groups
        while start < n_groups:
            def solve_chunk(size: int, start: int = start) -> Tuple[torch.Tensor, int]:
                groups = slice(start, min(start + size, n_groups))
                if self.plan.route == "direct":
                    return self._fit_direct(batch, groups, penalty, stats), size
                return self._fit_cg(batch, groups, penalty, stats), size

            solved, chunk = retry_on_oom(solve_chunk, chunk, self.oom_policy, f"fit/{self.plan.route}",
                                         self.oom_log, free_memory=self.devices.empty_cache)
            coef[start:start + solved.shape[0]] = solved.cpu()  # a shrunk chunk size is kept for the rest
            start += solved.shape[0]
        stats.group_chunk = min(stats.group_chunk, chunk)
        return coef, stats

    def _chunk_tensors(self, batch: GroupedBatch, groups: slice, rows: slice):
        device = self.devices.device
        return (batch.x[groups, rows].to(device), batch.y[groups, rows].to(device),
                batch.weight[groups, rows].to(device))

    def _weighted_design(self, batch: GroupedBatch, groups: slice, rows: slice):
        """(W Phi, W y) of a chunk: padded rows zeroed in place (no second copy of Phi)."""
        x, y, w = self._chunk_tensors(batch, groups, rows)
        return self.design.design(x, groups).mul_(w.unsqueeze(-1)), y * w

    def _system_scale(self, batch: GroupedBatch, groups: slice) -> torch.Tensor:
        return batch.counts[groups].to(self.devices.device).clamp_min(1.0)

    def _fit_direct(self, batch: GroupedBatch, groups: slice, penalty: torch.Tensor, stats: FitStats) -> torch.Tensor:
        n_rows = batch.x.shape[1]
        g = len(range(*groups.indices(len(batch.groups))))
        dim = self.design.width
        dtype, device = batch.x.dtype, self.devices.device
        gram = torch.zeros(g, dim, dim, dtype=dtype, device=device)
        rhs = torch.zeros(g, dim, dtype=dtype, device=device)
        for r0, r1 in _spans(n_rows, self.plan.fit.rows):
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
        n_rows = batch.x.shape[1]
        spans = list(_spans(n_rows, self.plan.fit.rows))
        n = self._system_scale(batch, groups)
        cached: Optional[List[torch.Tensor]] = None
        if self.plan.cache_design:
            cached = [self._weighted_design(batch, groups, slice(r0, r1))[0] for r0, r1 in spans]

        def weighted_blocks() -> Iterator[torch.Tensor]:
            if cached is not None:
                yield from cached
            else:
                for r0, r1 in spans:
                    yield self._weighted_design(batch, groups, slice(r0, r1))[0]

        # rhs and Jacobi diagonal in one pass
        g = len(range(*groups.indices(len(batch.groups))))
        rhs = torch.zeros(g, self.design.width, dtype=batch.x.dtype, device=self.devices.device)
        diag = torch.zeros_like(rhs)
        for (r0, r1), phi_w in zip(spans, weighted_blocks()):
            y = batch.y[groups, r0:r1].to(self.devices.device)
            rhs += torch.einsum("gnd,gn->gd", phi_w, y)
            diag += (phi_w * phi_w).sum(dim=1)
        rhs /= n.view(-1, 1)
        diag = diag / n.view(-1, 1) + penalty.diagonal() + self.solver.jitter

        def matvec(v: torch.Tensor) -> torch.Tensor:
            out = v @ penalty + self.solver.jitter * v
            acc = torch.zeros_like(v)
            for phi_w in weighted_blocks():
                acc += torch.einsum("gnd,gn->gd", phi_w, torch.einsum("gnd,gd->gn", phi_w, v))
            return out + acc / n.view(-1, 1)

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
        rows = min(self.plan.predict.rows, n_rows) or 1
        coef_dev = coef.to(device=self.devices.device, dtype=batch.x.dtype)

        def predict_chunk(size: int, start: int) -> Tuple[int, int]:
            groups = slice(start, min(start + size, n_groups))
            for r0, r1 in _spans(n_rows, rows):
                x = batch.x[groups, r0:r1].to(self.devices.device)
                phi = self.design.design(x, groups)
                out[groups, r0:r1] = torch.einsum("gnd,gd->gn", phi, coef_dev[groups]).cpu()
            return groups.stop - groups.start, size

        start, chunk = 0, self.plan.predict.groups
        while start < n_groups:
            done, chunk = retry_on_oom(lambda size, s=start: predict_chunk(size, s), chunk, self.oom_policy,
                                       "predict", self.oom_log, free_memory=self.devices.empty_cache)
            start += done
        return out * batch.weight
