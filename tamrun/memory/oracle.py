"""The memory oracle: applies the waterfall (DESIGN.md section 4) to the byte footprints.

Step 1 picks the route: dense direct if D <= max_dense_dim and one group's dense system (plus a
one-row chunk) fits in dense_fraction of the free memory, else matrix-free CG.
Step 2 picks the chunks: the largest (groups, rows) whose footprint fits in chunk_fraction of the
free memory (GPU 0.9, CPU 0.7). A user limit caps the free memory in both steps.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Optional

from tamrun.config.schema import MemoryConfig
from tamrun.errors import MemoryBudgetError
from tamrun.memory.footprint import (ProblemSize, cg_cache_bytes, cg_system_bytes, dense_system_bytes,
                                     predict_row_bytes, row_bytes)
from tamrun.memory.units import format_size

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkPlan:
    """How many groups and rows one step handles at once, and the bytes it is predicted to use."""

    groups: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class Plan:
    """The oracle's answer for one fit."""

    route: str  # "direct" or "cg"
    reason: str
    fit: ChunkPlan
    predict: ChunkPlan
    cache_design: bool  # CG keeps Phi between iterations
    budget: int
    free: int
    predicted_peak: int

    def as_dict(self) -> dict:
        return asdict(self)


def pick_chunk(n_groups: int, n_rows: int, per_group_fixed: int, per_group_row: int, budget: int,
               overhead: float, max_rows: Optional[int] = None, what: str = "fit") -> ChunkPlan:
    """Largest (groups, rows) with overhead * groups * (fixed + rows * row) <= budget.

    Rows are kept whole when possible; otherwise all groups are kept if at least one row chunk of
    ``min(n_rows, 1024)`` rows fits, else fewer groups. Pure function: no device is touched.

    Raises:
        MemoryBudgetError: not even one group with one row fits (the message gives the minimum).
    """
    rows_cap = n_rows if max_rows is None else max(1, min(n_rows, max_rows))

    def cost(g: int, r: int) -> int:
        return int(overhead * g * (per_group_fixed + r * per_group_row))

    smallest = cost(1, 1)
    if smallest > budget:
        raise MemoryBudgetError("memory.limit", format_size(budget),
                                f"the {what} step needs at least {format_size(smallest)} "
                                f"(one group, one row) but the budget is {format_size(budget)}",
                                f"raise memory.limit to at least {format_size(smallest / 0.7 + 1)} or free memory")
    if cost(n_groups, rows_cap) <= budget:
        return ChunkPlan(n_groups, rows_cap, cost(n_groups, rows_cap))
    floor_rows = min(rows_cap, 1024)
    groups = n_groups if cost(n_groups, floor_rows) <= budget else max(
        1, budget // max(1, cost(1, floor_rows)))
    groups = int(min(groups, n_groups))
    rows = int(((budget / overhead) / groups - per_group_fixed) // per_group_row)
    rows = max(1, min(rows, rows_cap))
    return ChunkPlan(groups, rows, cost(groups, rows))


class MemoryOracle:
    """Answers "dense or CG?" and "how many groups / rows per chunk?" for a problem size.

    Args:
        cfg: the memory config (waterfall fractions, D threshold, limit, overhead factor).
        limit: the user's limit in bytes (parsed ``cfg.limit``), or None.
        on_gpu: selects the GPU or CPU chunk fraction.
    """

    def __init__(self, cfg: MemoryConfig, limit: Optional[int], on_gpu: bool) -> None:
        self.cfg = cfg
        self.limit = limit
        self.chunk_fraction = cfg.chunk_fraction_gpu if on_gpu else cfg.chunk_fraction_cpu

    def capped_free(self, free: int) -> int:
        """Free memory seen through the user's limit."""
        return free if self.limit is None else min(free, self.limit)

    def route(self, size: ProblemSize, free: int, requested: str = "auto") -> tuple:
        """(route, reason) per waterfall step 1, unless ``requested`` forces one."""
        if requested in ("direct", "cg"):
            return requested, f"solver.name={requested}"
        dense = int(self.cfg.overhead_factor * (dense_system_bytes(size) + row_bytes(size)))
        room = self.cfg.dense_fraction * self.capped_free(free)
        if size.width > self.cfg.max_dense_dim:
            return "cg", f"D={size.width} > memory.max_dense_dim={self.cfg.max_dense_dim}"
        if dense >= room:
            return "cg", (f"one dense system needs {format_size(dense)} >= memory.dense_fraction x free "
                          f"= {format_size(room)}")
        return "direct", f"D={size.width} <= {self.cfg.max_dense_dim} and one dense system needs {format_size(dense)}"

    def plan(self, size: ProblemSize, free: int, requested: str = "auto", n_predict_rows: Optional[int] = None) -> Plan:
        """The whole plan: route, fit chunks, predict chunks and the predicted peak."""
        route, reason = self.route(size, free, requested)
        budget = int(self.chunk_fraction * self.capped_free(free))
        overhead = self.cfg.overhead_factor
        cache = False
        if route == "direct":
            fit = pick_chunk(size.n_groups, size.n_rows, dense_system_bytes(size), row_bytes(size), budget,
                             overhead, self.cfg.max_chunk_rows)
        else:
            try:  # keep Phi between CG iterations when a whole group's design fits
                fit = pick_chunk(size.n_groups, size.n_rows, cg_system_bytes(size) + cg_cache_bytes(size),
                                 row_bytes(size), budget, overhead, self.cfg.max_chunk_rows)
                cache = True
            except MemoryBudgetError:
                fit = pick_chunk(size.n_groups, size.n_rows, cg_system_bytes(size), row_bytes(size), budget,
                                 overhead, self.cfg.max_chunk_rows)
        pred_rows = n_predict_rows or size.n_rows
        predict = pick_chunk(size.n_groups, pred_rows, size.width * size.itemsize, predict_row_bytes(size), budget,
                             overhead, self.cfg.max_chunk_rows, what="predict")
        plan = Plan(route=route, reason=reason, fit=fit, predict=predict, cache_design=cache, budget=budget,
                    free=free, predicted_peak=max(fit.bytes, predict.bytes))
        log.info("memory plan: route=%s (%s); fit chunk %d groups x %d rows; predict chunk %d x %d; "
                 "predicted peak %s of budget %s", route, reason, fit.groups, fit.rows, predict.groups,
                 predict.rows, format_size(plan.predicted_peak), format_size(budget))
        return plan
