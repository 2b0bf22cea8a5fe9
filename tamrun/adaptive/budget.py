"""The window budget (waterfall step 3): how many windows x groups one batch holds.

The oracle plans one window's problem (G groups of the longest window's rows) with the window
fraction in place of the chunk fraction, which gives the route (direct or CG, primal or dual) and
the budget B = memory.window_fraction_* x free memory (capped by memory.limit). A batch of w windows
of g groups is charged overhead x g x (fixed + w x per window) (`tamrun.memory.footprint.window_costs`;
CG and the dual form add their fit chunk per window, charged by their own dispatcher). The chunk
selector keeps all G groups in a batch when one window of them fits, with as many windows as fit
(at most adaptive.max_batch_windows); otherwise one window of as many groups as fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tamrun.config.schema import Config
from tamrun.device.manager import DeviceManager
from tamrun.errors import MemoryBudgetError
from tamrun.memory.footprint import ProblemSize, StepCost, WindowCost, select_chunk, window_costs
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.config.units import format_size


@dataclass(frozen=True)
class WindowPlan:
    """One window's plan (route, chunks) and the batches: ``groups`` x ``windows`` systems at once."""

    plan: Plan
    updating: bool  # direct primal route: Grams up/down-dated between windows
    groups: int
    windows: int
    budget: int
    cost: WindowCost  # what a batch holds
    fit_per_window: int  # per group: the dispatcher's fit chunk (cg / dual), planned but charged by it

    @property
    def batch_bytes(self) -> int:
        """The predicted bytes of a full batch (held and the fit's chunks)."""
        extra = self.groups * self.windows * self.fit_per_window * self.plan.overhead
        return self.cost.bytes(self.windows, 0, self.plan.overhead) + int(extra)


def window_oracle(config: Config, on_gpu: bool) -> MemoryOracle:
    """The memory oracle with the window fractions in place of the chunk fractions."""
    memory = replace(config.memory, chunk_fraction_cpu=config.memory.window_fraction_cpu,
                     chunk_fraction_gpu=config.memory.window_fraction_gpu)
    return MemoryOracle(memory, config.memory.limit_bytes, on_gpu, config.solver.direct_max_dim)


def plan_windows(config: Config, size: ProblemSize, devices: DeviceManager, n_windows: int, step_rows: int,
                 n_features: int, reserve: int = 0, backtest: bool = False) -> WindowPlan:
    """Route and batch sizes for ``n_windows`` refits of one window's problem ``size`` (n_rows = the
    longest window, n_predict_rows = the longest forecast), ``reserve`` bytes kept for the evaluation
    and the recording; ``backtest``: mode=backtest's windows (backtest.max_batch_windows caps a batch).
    Raises `MemoryBudgetError` when one window of one group does not fit."""
    oracle = window_oracle(config, devices.kind != "cpu")
    view = devices.memory(config.memory.safety_margin_bytes, reserve)
    plan = oracle.plan(size, view.free, config.solver.name.value, config.solver.dual, view.held, view.bound)
    updating = plan.route == "direct" and not plan.dual
    fixed, per_window = window_costs(size, n_features, step_rows, updating, plan.fit.rows)
    fit = 0 if updating else plan.fit_cost.bytes(1, plan.fit.rows, 1.0)
    cost, budget, overhead = StepCost(fixed, per_window + fit), plan.budget, plan.overhead
    settings = config.backtest if backtest else config.adaptive
    cap = min(n_windows, settings.max_batch_windows or n_windows)
    chunk = select_chunk(size.n_groups, cap, cost, budget, overhead, floor_rows=1, regrow_rows=False)
    if chunk is None:
        need = int(cost.bytes(1, 1, overhead) / plan.chunk_fraction) + 1
        bound = oracle.binding(view.free, view.held, view.bound)
        raise MemoryBudgetError(
            bound.name, format_size(bound.size),
            f"one window of one group needs {format_size(cost.bytes(1, 1, overhead))} but the window budget "
            f"(memory.window_fraction_* of the free memory under {bound.describe()}) is {format_size(budget)}",
            f"{bound.fix(need)}, or shorten " + ("the windows (backtest.refit=sliding with a shorter backtest.length)"
                                                 if backtest else "adaptive.window"))
    groups, windows = chunk
    return WindowPlan(plan, updating, groups, windows, budget, WindowCost(groups, fixed, per_window), fit)
