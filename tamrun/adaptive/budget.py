"""The window budget (waterfall step 3): how many windows x groups one batch holds.

The oracle plans one window's problem (G groups of the longest window's rows) with the window
fraction in place of the chunk fraction, which gives the route (direct or CG, primal or dual) and
the budget B = window_fraction x free memory (capped by memory.limit). Per group, with s bytes per
element, F features, D columns, W the longest window, A the most rows added + removed between two
windows, H the longest forecast, r = (F + 2) s the bytes of a gathered row (x, y, weight):

    direct (up/down-dated)  fixed      W r + (2 D^2 + 4 D) s + min(W, rows) direct_row   one window's Gram from its rows
                            per window (2 D^2 + 4 D) s + A (r + direct_row) + H (r + predict_row)
                                       (the added rows' Grams, which become the windows' Grams, and the
                                       removed rows' ones; then the Grams and their Cholesky factors)
    cg / dual               per window W r + H (r + predict_row), held by the batch; the fit's own
                            chunks (the oracle's fit cost) are charged by the dispatcher
A batch of w windows of g groups is charged overhead x g x (fixed + w x per window). All G groups go
in a batch when one window of them fits, with as many windows as fit (at most adaptive.max_batch_windows);
otherwise one window of as many groups as fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from tamrun.config.schema import Config
from tamrun.device import DeviceManager
from tamrun.errors import MemoryBudgetError
from tamrun.memory.footprint import ProblemSize, dense_system_bytes, direct_row_bytes, predict_row_bytes
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.memory.units import format_size, parse_size


@dataclass(frozen=True)
class WindowCost:
    """Bytes a batch holds: overhead x groups x (fixed + windows x per_window); `bytes` has the
    signature of `StepCost.bytes` (the rows argument is unused) for the dispatcher's guard."""

    groups: int
    fixed: int
    per_window: int

    def bytes(self, windows: int, rows: int = 0, overhead: float = 1.0) -> int:
        return int(overhead * self.groups * (self.fixed + windows * self.per_window))


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
    return MemoryOracle(memory, parse_size(config.memory.limit), on_gpu)


def plan_windows(config: Config, size: ProblemSize, devices: DeviceManager, n_windows: int, step_rows: int,
                 n_features: int) -> WindowPlan:
    """Route and batch sizes for ``n_windows`` refits of one window's problem ``size`` (n_rows = the
    longest window, n_predict_rows = the longest forecast). Raises `MemoryBudgetError` when one
    window of one group does not fit."""
    oracle = window_oracle(config, devices.kind != "cpu")
    plan = oracle.plan(size, devices.memory().free, config.solver.name.value, config.solver.dual)
    s, dim, groups = size.itemsize, size.width, size.n_groups
    row = (n_features + 2) * s
    predict = size.n_predict_rows * (row + predict_row_bytes(size))
    updating = plan.route == "direct" and not plan.dual
    if updating:
        fixed = size.n_rows * row + dense_system_bytes(size) + min(size.n_rows, plan.fit.rows) * direct_row_bytes(size)
        per_window, fit = (2 * dim * dim + 4 * dim) * s + step_rows * (row + direct_row_bytes(size)) + predict, 0
    else:
        fixed, per_window = 0, size.n_rows * row + predict
        fit = plan.fit_cost.bytes(1, plan.fit.rows, 1.0)
    cost = WindowCost(1, fixed, per_window + fit)
    budget, overhead = plan.budget, plan.overhead
    cap = min(n_windows, config.adaptive.max_batch_windows or n_windows)
    if cost.bytes(1, 0, overhead) * groups <= budget:
        windows = int((budget / (overhead * groups) - fixed) // (per_window + fit))
        chunk_groups, windows = groups, max(1, min(cap, windows))
    else:
        chunk_groups, windows = int(budget // cost.bytes(1, 0, overhead)), 1
        if chunk_groups < 1:
            need = int(cost.bytes(1, 0, overhead) / plan.chunk_fraction) + 1
            raise MemoryBudgetError(
                "memory.limit", format_size(oracle.limit) if oracle.limit is not None else None,
                f"one window of one group needs {format_size(cost.bytes(1, 0, overhead))} but the window budget "
                f"(memory.window_fraction_* of the free memory under the limit) is {format_size(budget)}",
                f"raise memory.limit to at least {format_size(need)}, or shorten adaptive.window")
    return WindowPlan(plan, updating, chunk_groups, windows, budget, WindowCost(chunk_groups, fixed, per_window), fit)
