"""Fit every window of a schedule in batches of windows x groups, and forecast each refit's horizon.

Direct route (primal), per group, with phi_i the row i of Phi (D,):
    G_k = sum_{i in window k} phi_i phi_i',   b_k = sum_{i in window k} phi_i y_i
    G_k = (G_{k-1} + sum_{i added} phi_i phi_i') - sum_{i removed} phi_i phi_i'      (b_k likewise)
    beta_k = (G_k / n_k + P + jitter I)^-1 b_k / n_k
The added and removed rows of all (window, group) systems of a batch are two batches of systems whose
Grams come from `tamrun.solve.assembly.normal_equations` at once; the running sum then goes through the
windows in order, in place in the added rows' Grams, so window k's Gram is the same whatever the
batch sizes (a memory cap changes nothing). The first window, and every window k with k % adaptive.refresh == 0, gets its Gram
from its rows (bounding the rounding drift of the running sums). All systems of a batch are solved
by one batched Cholesky (`tamrun.solve.assembly.solve_normal_equations`).

CG route and the direct route's dual form: the windows' rows are gathered as one batch of systems
and fitted by the dispatcher; CG starts every window of a batch from the previous batch's last
window (one window per batch: warm starts between consecutive windows).

Every batch runs through the window loop (`ChunkLoop`): charged to the tracker, retried with fewer
windows on OOM. Forecasts go through `tamrun.fit.fitted.predict_rows`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

import numpy as np
import torch

from tamrun.adaptive.budget import WindowPlan
from tamrun.adaptive.windows import WindowSchedule, gather_systems, system_design, systems_of
from tamrun.config.schema import Config
from tamrun.data.batch import GroupedBatch
from tamrun.device.manager import DeviceManager
from tamrun.device.profiler import PhaseRecorder
from tamrun.effects.design import AdditiveDesign
from tamrun.fit.fitted import predict_rows
from tamrun.memory.guard import ChunkLoop
from tamrun.solve.assembly import normal_equations, solve_normal_equations
from tamrun.fit.dispatcher import Dispatcher
from tamrun.solve.stats import FitStats

log = logging.getLogger(__name__)


@dataclass
class WindowFit:
    """``forecast`` (K, G, H): refit k's forecast of rows [hi[k, g], end[k, g]) of group g (0 beyond);
    ``coef`` (K, G, D) when kept; ``batch_seconds`` the wall time of each batch."""

    forecast: torch.Tensor
    coef: Optional[torch.Tensor]
    stats: FitStats
    windows_per_batch: int
    batch_seconds: List[float] = field(default_factory=list)


def solver_and_phase_metrics(metrics: Dict[str, float], route: str, stats: FitStats, recorder: PhaseRecorder,
                             phase: str) -> Dict[str, float]:
    """``metrics`` with a window fit's CG counts (route cg), the recorder's phases and the working peak of
    ``phase``, the phase the window budget governs."""
    if route == "cg":
        metrics.update({"cg_iterations": stats.cg_iterations, "cg_unconverged_groups": stats.cg_unconverged_groups})
    metrics.update(recorder.metrics())
    metrics["working_peak_bytes"] = recorder.working_peak((phase,))
    return metrics


class WindowFitter:
    """Fits the schedule's windows on the rows of ``history`` (G, N, F), date-sorted per group."""

    def __init__(self, config: Config, design: AdditiveDesign, devices: DeviceManager, history: GroupedBatch,
                 schedule: WindowSchedule, window_plan: WindowPlan, loop: ChunkLoop) -> None:
        self.config, self.design, self.devices = config, design.to(devices.device), devices
        self.history, self.schedule, self.wplan = history, schedule, window_plan
        self.loop = loop  # runs the batches of windows
        self.penalty = design.penalty_operator().to(devices.device, history.x.dtype)
        self.stats = FitStats(route=window_plan.plan.route, group_chunk=window_plan.groups,
                              row_chunk=window_plan.plan.fit.rows)
        self.refresh, self.keep = config.adaptive.refresh, config.adaptive.keep_coefficients
        self.label = "adaptive"  # names the window loop's chunks

    def system_design(self, k: np.ndarray, g: np.ndarray) -> AdditiveDesign:
        """The design systems (k, g) are read through: group g's feature ranges, whatever the window."""
        return system_design(self.design, g)

    def _dispatcher(self, k: np.ndarray, g: np.ndarray, plan, initial: Optional[torch.Tensor] = None) -> Dispatcher:
        """A dispatcher over the systems (k, g), with a loop of its own under the same tracker and OOM log
        (no timeline, no progress)."""
        loop = ChunkLoop(self.loop.policy, self.loop.oom_log, self.loop.tracker, self.loop.free_memory)
        return Dispatcher(self.system_design(k, g), self.devices, plan, self.config.solver, loop, initial)

    def fit(self) -> WindowFit:
        s, dtype = self.schedule, self.history.x.dtype
        width = self.design.width
        forecast = torch.zeros(s.n_windows, s.n_groups, self.horizon_rows(), dtype=dtype)
        coef = (torch.zeros(s.n_windows, s.n_groups, width, dtype=dtype)
                if self.keep else None)
        result = WindowFit(forecast, coef, self.stats, self.wplan.windows)
        fit_batch = self._updating_batch if self.wplan.updating else self._systems_batch
        for g0 in range(0, s.n_groups, self.wplan.groups):
            groups = range(g0, min(g0 + self.wplan.groups, s.n_groups))
            carry: dict = {}

            def step(start: int, take: int) -> None:
                began = time.perf_counter()
                windows = range(start, start + take)
                k, g = systems_of(windows, groups)
                beta, state = fit_batch(windows, groups, k, g, carry)  # (take * len(groups), D) on the device
                pred = self._forecast(k, g, beta)
                forecast[k, g, :pred.shape[1]] = pred
                if coef is not None:
                    coef[k, g] = beta.cpu()
                carry.update(state)  # only once the batch has succeeded (an OOM retries it from the same start)
                result.batch_seconds.append(time.perf_counter() - began)

            cost = replace(self.wplan.cost, groups=len(groups))
            result.windows_per_batch = self.loop.run(step, s.n_windows, self.wplan.windows,
                                                     f"{self.label}/{self.wplan.plan.route}", cost, unit="windows")
        return result

    # ---- direct route: up/down-dated Grams -------------------------------------------------------
    def _fresh(self, k: int) -> bool:
        return k == 0 or (self.refresh > 0 and k % self.refresh == 0)

    def fresh_systems(self, k: np.ndarray, g: np.ndarray) -> np.ndarray:
        """(S,) whether each system's Gram comes from its rows rather than from the previous window's."""
        return np.array([self._fresh(int(i)) for i in k], dtype=bool)

    def _normal_equations(self, k: np.ndarray, g: np.ndarray, start: np.ndarray, stop: np.ndarray):
        """Unnormalised (S, D, D) Grams and (S, D) Phi'y of rows [start, stop) of each system's group."""
        batch = gather_systems(self.history, g, start, stop)
        return normal_equations(self.system_design(k, g), batch, slice(0, len(g)), self.devices.device,
                                self.wplan.plan.fit.rows)

    def _updating_batch(self, windows: range, groups: range, k: np.ndarray, g: np.ndarray, carry: dict):
        """Each system's Gram and Phi'y: the rows it gains and loses since the previous window (none
        for a system whose Gram comes from its rows), summed in place window by window."""
        s, n_groups = self.schedule, len(groups)
        fresh = self.fresh_systems(k, g)
        before = np.maximum(k - 1, 0)
        grams, rhs = self._normal_equations(k, g, np.where(fresh, 0, s.hi[before, g]), np.where(fresh, 0, s.hi[k, g]))
        removed, removed_rhs = self._normal_equations(k, g, np.where(fresh, 0, s.lo[before, g]),
                                                      np.where(fresh, 0, s.lo[k, g]))
        gram, vector = carry.get("gram"), carry.get("rhs")  # the previous window's (committed on success)
        for i, window in enumerate(windows):
            rows = slice(i * n_groups, (i + 1) * n_groups)
            new = fresh[rows]
            if not new.any():  # (G_{k-1} + added) - removed
                grams[rows].add_(gram).sub_(removed[rows])
                rhs[rows].add_(vector).sub_(removed_rhs[rows])
            else:
                kept, at = np.nonzero(~new)[0], np.nonzero(new)[0] + rows.start
                if len(kept):
                    grams[kept + rows.start] = grams[kept + rows.start] + gram[kept] - removed[kept + rows.start]
                    rhs[kept + rows.start] = rhs[kept + rows.start] + vector[kept] - removed_rhs[kept + rows.start]
                grams[at], rhs[at] = self._normal_equations(k[at], g[at], s.lo[window, g[at]], s.hi[window, g[at]])
            gram, vector = grams[rows], rhs[rows]
        del removed, removed_rhs
        last = {"gram": gram.clone(), "rhs": vector.clone()}  # the next batch's start
        count = torch.as_tensor(s.hi[k, g] - s.lo[k, g], dtype=grams.dtype, device=grams.device).clamp_min(1.0)
        beta, report = solve_normal_equations(grams, rhs, count, self.penalty, self.config.solver)
        self.stats.merge(report)
        return beta, last

    # ---- cg route and the dual form: systems through the dispatcher -------------------------------
    def _systems_batch(self, windows: range, groups: range, k: np.ndarray, g: np.ndarray, carry: dict):
        s, plan = self.schedule, self.wplan.plan
        batch = gather_systems(self.history, g, s.lo[k, g], s.hi[k, g])
        initial = carry["coef"].repeat(len(windows), 1) if "coef" in carry and plan.route == "cg" else None
        inner = replace(plan, fit=replace(plan.fit, groups=1 if plan.dual else max(plan.fit.groups, len(g))))
        beta, stats = self._dispatcher(k, g, inner, initial).fit(batch)
        self.stats.merge(stats)
        return beta.to(self.devices.device), {"coef": beta[-len(groups):].clone()}

    # ---- forecast ---------------------------------------------------------------------------------
    def _forecast(self, k: np.ndarray, g: np.ndarray, beta: torch.Tensor) -> torch.Tensor:
        """(S, H) forecasts of each system's horizon rows by its coefficients (0 on padding), on the host."""
        s = self.schedule
        batch = gather_systems(self.history, g, self.forecast_start(k, g), s.end[k, g])
        return predict_rows(self.system_design(k, g), beta, batch.x, self.devices.device, weight=batch.weight)

    def horizon_rows(self) -> int:
        """The longest forecast (rows of one system), at least 1."""
        k, g = np.indices((self.schedule.n_windows, self.schedule.n_groups))
        return max(1, int((self.schedule.end - self.forecast_start(k, g)).max()))

    def forecast_start(self, k: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The first forecast row of each system: its window's end."""
        return self.schedule.hi[k, g]
