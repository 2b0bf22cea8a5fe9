"""The dispatcher: routes a fit to the solver the oracle chose, one chunk of groups at a time.

    route "direct"           `normal_equations` + `solve_normal_equations` (batched Cholesky)
    route "direct", dual     `tamrun.solve.dual.fit_dual` (one N x N kernel system per group, N < D)
    route "cg"               `CgSystem` + `conjugate_gradient` (matrix-free, preconditioned)

Every chunk runs through the `ChunkLoop` (charged to the tracker, retried with fewer groups on OOM);
the chunk's report merges into the fit's `FitStats`.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Tuple

import torch

from tamrun.config.schema import SolverConfig
from tamrun.data.batch import GroupedBatch
from tamrun.device.manager import DeviceManager
from tamrun.effects.chunk import BlockPenalty
from tamrun.effects.design import AdditiveDesign
from tamrun.memory.guard import ChunkLoop
from tamrun.memory.oracle import Plan
from tamrun.machine.sampling import repeating
from tamrun.solve.assembly import CgSystem, normal_equations, solve_normal_equations, system_scale
from tamrun.solve.cg import DEFAULT_TOL, CgCallback, CgProgress, conjugate_gradient, no_cg_progress
from tamrun.solve.dual import fit_dual
from tamrun.solve.stats import FitStats, SolveStats

log = logging.getLogger(__name__)


class Dispatcher:
    """Fits one additive design over a batch of groups along the plan.

    Args:
        design: the fitted `AdditiveDesign` (width D).
        devices: the run's `DeviceManager`.
        plan: the oracle's `Plan` (route, chunk sizes and their per-group costs).
        solver: solver settings (tolerance, iterations, preconditioner, jitter).
        loop: the guarded chunk loop (tracker, OOM guard, timeline, progress).
        initial: (G, D) coefficients CG starts from (solver.warm_start), None for zeros.
        on_iteration: CG's progress (`tamrun.solve.cg.CgProgress`: start, each iteration, end).
    """

    def __init__(self, design: AdditiveDesign, devices: DeviceManager, plan: Plan, solver: SolverConfig,
                 loop: ChunkLoop, initial: Optional[torch.Tensor] = None,
                 on_iteration: CgCallback = no_cg_progress) -> None:
        self.design, self.devices, self.plan, self.solver, self.loop = design, devices, plan, solver, loop
        self.initial = initial
        self.on_iteration = on_iteration

    def fit(self, batch: GroupedBatch) -> Tuple[torch.Tensor, FitStats]:
        """Coefficients (G, D) in the batch's dtype, on the CPU, and the fit statistics."""
        plan = self.plan
        stats = FitStats(route=plan.route, group_chunk=plan.fit.groups, row_chunk=plan.fit.rows)
        coef = torch.empty(len(batch.groups), self.design.width, dtype=batch.x.dtype)
        penalty = self.design.penalty_operator().to(self.devices.device, batch.x.dtype)
        route = self._cg if plan.route == "cg" else self._dual if plan.dual else self._direct

        def step(start: int, size: int) -> None:
            groups = slice(start, start + size)
            with repeating(self.chunk_key(batch, start, size)):
                beta, report = route(batch, groups, penalty)
                coef[groups] = beta.cpu()
            stats.merge(report)

        stats.group_chunk = self.loop.run(step, len(batch.groups), plan.fit.groups, self.phase, plan.fit_cost,
                                          rows=plan.fit.rows)
        return coef, stats

    def chunk_key(self, batch: GroupedBatch, start: int, size: int) -> tuple:
        """What fixes a chunk's allocations (`tamrun.machine.sampling`): its route, groups, rows and
        width. The dual route's leaf pairs depend on the data: each of its chunks is a key of its own."""
        key = (self.phase, size, tuple(batch.x.shape[1:]), self.design.width, batch.x.dtype)
        return (*key, start) if self.plan.route == "direct" and self.plan.dual else key

    @property
    def phase(self) -> str:
        """The fit's phase in the chunk loop (its progress: ``fit/cg``, ``fit/direct``)."""
        return f"fit/{self.plan.route}"

    def _direct(self, batch: GroupedBatch, groups: slice, penalty: BlockPenalty) -> Tuple[torch.Tensor, SolveStats]:
        device = self.devices.device
        began = time.perf_counter()
        gram, rhs = normal_equations(self.design, batch, groups, device, self.plan.fit.rows)
        built = time.perf_counter()
        beta, stats = solve_normal_equations(gram, rhs, system_scale(batch, groups, device), penalty, self.solver)
        stats.setup_seconds, stats.solve_seconds = built - began, time.perf_counter() - built
        return beta, stats

    def _dual(self, batch: GroupedBatch, groups: slice, penalty: BlockPenalty) -> Tuple[torch.Tensor, SolveStats]:
        return fit_dual(self.design, batch, groups, penalty, self.devices.device, self.plan.fit.rows, self.solver)

    def _cg(self, batch: GroupedBatch, groups: slice, penalty: BlockPenalty) -> Tuple[torch.Tensor, SolveStats]:
        began = time.perf_counter()
        system = CgSystem(self.design, batch, groups, self.devices.device, self.plan.fit.rows, self.plan.cache_design,
                          penalty, self.solver)
        rhs = system.rhs
        tol = self.solver.tol if self.solver.tol is not None else DEFAULT_TOL[rhs.dtype]
        x0 = system.start(None if self.initial is None else self.initial[groups].to(device=rhs.device, dtype=rhs.dtype))
        total = len(batch.groups)

        def progress(state: CgProgress) -> None:  # the group bar counts the chunk's converged groups
            self.on_iteration(state)
            if state.converged and not state.final:
                self.loop.report_within(self.phase, groups.start + state.converged, total)

        built = time.perf_counter()
        result = conjugate_gradient(system.matvec, rhs, system.preconditioner, tol, self.solver.max_iter, x0,
                                    progress)
        return result.x, SolveStats(cg_iterations=int(result.iterations.max()),
                                    cg_unconverged_groups=int((~result.converged).sum()),
                                    cg_final_residual=float(result.relative_residual.max()), cg_history=result.history,
                                    setup_seconds=built - began, solve_seconds=time.perf_counter() - built)
