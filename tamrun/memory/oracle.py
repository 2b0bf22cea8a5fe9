"""The memory oracle: applies the memory waterfall (docs/architecture.md) to the byte footprints of
`tamrun.memory.footprint`.

Step 1 picks the route: dense direct if the dense system's dimension (D, or N in the dual form when
a group has fewer rows N than columns D and solver.dual is on) is <= memory.max_dense_dim and
solver.direct_max_dim (beyond it two-level CG is the faster exact route) and one
group's dense system (plus a one-row chunk) fits in memory.dense_fraction of the free memory, else
matrix-free CG. Step 2 picks the chunks (`select_chunk`): the largest (groups, rows) whose footprint
fits in memory.chunk_fraction_gpu / _cpu of the free memory. The user's memory.limit caps the free
memory in both steps (here, and only here). The free memory comes with the limit it was read under
(`tamrun.machine.limits.Limit`: on the CPU the tightest of the cgroup, the rlimits and the available
RAM); the plan records which limit binds (`Plan.bound_by`) and a refusal names it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

from tamrun.config.schema import MemoryConfig
from tamrun.errors import ConfigError, MemoryBudgetError
from tamrun.memory.footprint import (ProblemSize, StepCost, cg_cache_bytes, cg_row_bytes, cg_system_bytes,
                                     dense_system_bytes, direct_row_bytes, dual_system_bytes, gcv_build_cost,
                                     gcv_held_bytes, gcv_score_bytes, predict_output_bytes, predict_row_bytes,
                                     select_chunk, step_bytes)
from tamrun.machine.limits import HARD, Limit
from tamrun.config.units import format_size

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkPlan:
    """How many groups and rows one step handles at once, and the bytes it is predicted to use."""

    groups: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class SelectPlan:
    """The penalty selection's memory (model.penalties=gcv, `tamrun.fit.gcv`): ``held`` bytes of every
    group's statistics kept through the search, the chunks that build them (``build``, groups x rows) and
    the chunks of groups scored at once per candidate penalty (``score``, rows unused)."""

    held: int
    build: ChunkPlan
    score: ChunkPlan
    build_cost: StepCost
    score_cost: StepCost

    @property
    def peak(self) -> int:
        return self.held + max(self.build.bytes, self.score.bytes)


@dataclass(frozen=True)
class Plan:
    """The oracle's answer for one fit."""

    route: str  # "direct" or "cg"
    reason: str
    fit: ChunkPlan
    predict: ChunkPlan
    cache_design: bool  # CG keeps W Phi between iterations
    budget: int
    free: int
    predicted_peak: int
    minimal_limit: int  # the smallest memory.limit this run can be planned in (smallest chunks)
    fit_cost: StepCost
    predict_cost: StepCost
    overhead: float  # memory.overhead_factor
    chunk_fraction: float  # memory.chunk_fraction_gpu / _cpu (or window_fraction_* for window batches)
    predict_output: int  # bytes of the (G, N) predictions, held through the predict step
    dual: bool  # direct route in the dual form: one N x N system per group (N < D)
    bound_by: str = "device memory"  # the limit that binds the free memory (a key of tamrun.machine.limits.WHAT)
    bound_detail: str = ""  # that limit in words, with what is in use and left
    select: Optional[SelectPlan] = None  # the penalty selection's (model.penalties=gcv), None without one

    @property
    def hard_bound(self) -> bool:
        """The free memory is bound by a limit the process cannot exceed (memory.limit, cgroup, rlimit)."""
        return self.bound_by in HARD

    @property
    def plan_limit(self) -> int:
        """The smallest memory.limit that keeps this plan's chunk sizes."""
        return int(self.predicted_peak / self.chunk_fraction) + 1

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """The plan as a few human-readable lines."""
        form = ", dual form: one N x N kernel system per group" if self.dual else ""
        return "\n".join([
            f"route: {self.route} ({self.reason}{form})",
            f"fit chunks: {self.fit.groups} groups x {self.fit.rows} rows ({format_size(self.fit.bytes)})"
            + (", W Phi cached between CG iterations" if self.cache_design else ""),
            f"predict chunks: {self.predict.groups} groups x {self.predict.rows} rows ({format_size(self.predict.bytes)})",
            *([f"GCV penalty selection: every group's Gram held ({format_size(self.select.held)}), built "
               f"{self.select.build.groups} groups x {self.select.build.rows} rows at a time, scored "
               f"{self.select.score.groups} groups at a time"] if self.select else []),
            f"predicted working peak: {format_size(self.predicted_peak)} of a budget of {format_size(self.budget)} "
            f"(free memory seen: {format_size(self.free)}, bound by {self.bound_detail or self.bound_by})",
            f"smallest memory.limit this run fits in: {format_size(self.minimal_limit)} (smallest chunks); "
            f"this plan's chunks need memory.limit >= {format_size(self.plan_limit)} (its working peak "
            f"{format_size(self.predicted_peak)} / the {self.chunk_fraction:g} of the limit chunks may use, "
            "memory.chunk_fraction_*)",
        ])


def row_cap(n_rows: int, max_rows: Optional[int]) -> int:
    """The most rows a chunk holds: min(N, memory.max_chunk_rows), at least 1 (None: no cap)."""
    return n_rows if max_rows is None else max(1, min(n_rows, max_rows))


def pick_chunk(n_groups: int, n_rows: int, per_group_fixed: int, per_group_row: int, budget: int,
               overhead: float, min_rows: int, max_rows: Optional[int] = None, what: str = "fit",
               minimal_limit: Optional[int] = None, bound: Optional[Limit] = None,
               least_rows: int = 1) -> ChunkPlan:
    """Largest (groups, rows) with overhead * groups * (fixed + rows * row) <= budget (`select_chunk`,
    all groups kept while ``min(n_rows, max_rows, min_rows)`` rows fit for all of them).

    ``least_rows``: the fewest rows a chunk may hold (1; CG's `MemoryOracle.cg_least_rows`, where every
    product goes over every chunk). It must not exceed ``min(n_rows, max_rows, min_rows)``.

    Raises:
        MemoryBudgetError: not even one group of ``least_rows`` rows fits; the message names ``bound``,
            the limit the budget was read under, and the size it needs (``minimal_limit`` of working memory).
    """
    rows_cap = row_cap(n_rows, max_rows)
    cost = StepCost(per_group_fixed, per_group_row)
    smallest = cost.bytes(1, least_rows, overhead)
    chunk = select_chunk(n_groups, rows_cap, cost, budget, overhead, floor_rows=min(rows_cap, min_rows))
    if chunk is None or smallest > budget:
        bound = bound or Limit("device memory", int(budget), 0)
        fix = bound.fix(minimal_limit) if minimal_limit else f"free more than {format_size(budget)} of memory"
        rows = "one row"
        if least_rows > 1:
            rows = (f"{least_rows} rows, the fewest CG takes as it goes over every chunk at each product: "
                    "memory.min_chunk_rows")
            fix += "; or lower memory.min_chunk_rows (a slower fit)"
        raise MemoryBudgetError(bound.name, format_size(bound.size),
                                f"the {what} step needs {format_size(smallest)} for its smallest chunk (one group, "
                                f"{rows}) but its budget (the chunk fraction of the free memory under "
                                f"{bound.describe()}) is {format_size(budget)}", fix)
    groups, rows = chunk
    return ChunkPlan(groups, rows, cost.bytes(groups, rows, overhead))


class MemoryOracle:
    """Answers "dense or CG?" and "how many groups / rows per chunk?" for a problem size.

    Args:
        cfg: the memory config (waterfall fractions, D threshold, limit, overhead factor).
        limit: the user's limit in bytes (parsed ``cfg.limit``), or None.
        on_gpu: selects the GPU or CPU chunk fraction and row cap (memory.max_chunk_rows_gpu / max_chunk_rows).
        direct_max_dim: solver.direct_max_dim, the largest system solver=auto factors for speed (the
            memory's own threshold is memory.max_dense_dim; the smaller one binds).
    """

    def __init__(self, cfg: MemoryConfig, limit: Optional[int], on_gpu: bool,
                 direct_max_dim: Optional[int] = None) -> None:
        self.cfg = cfg
        self.direct_max_dim = direct_max_dim
        self.limit = limit
        self.chunk_fraction = cfg.chunk_fraction_gpu if on_gpu else cfg.chunk_fraction_cpu
        self.max_chunk_rows = cfg.max_chunk_rows_gpu if on_gpu else cfg.max_chunk_rows

    def capped_free(self, free: int, held: int = 0) -> int:
        """Free memory seen through the user's limit: min(free, limit - held), ``held`` the bytes
        already counted against the limit (tensors on a GPU; 0 on the CPU, where the limit bounds
        the working memory only)."""
        return free if self.limit is None else max(0, min(free, self.limit - held))

    @staticmethod
    def dual_form(size: ProblemSize, dual: bool) -> bool:
        """Whether the direct route solves the N x N dual system (fewer rows than columns)."""
        return dual and size.n_rows < size.width

    def dense_bytes(self, size: ProblemSize, dual: bool = False) -> int:
        """One group's dense system (primal D x D, or dual N x N) plus a one-row chunk, with the overhead."""
        fixed = dual_system_bytes(size) if self.dual_form(size, dual) else dense_system_bytes(size)
        return step_bytes(1, 1, fixed, direct_row_bytes(size), self.cfg.overhead_factor)

    def costs(self, size: ProblemSize, route: str, cache: bool, dual: bool = False) -> Tuple[StepCost, StepCost]:
        """(fit, predict) per-group costs of a route."""
        if route == "direct" and self.dual_form(size, dual):
            fit = StepCost(dual_system_bytes(size), size.row.build)
        elif route == "direct":
            fit = StepCost(dense_system_bytes(size), direct_row_bytes(size))
        else:
            fit = StepCost(cg_system_bytes(size) + (cg_cache_bytes(size) if cache else 0), cg_row_bytes(size, cache))
        return fit, StepCost(size.width * size.itemsize, predict_row_bytes(size))

    def predict_output_bytes(self, size: ProblemSize) -> int:
        """The (G, N) predictions, with the overhead."""
        return int(self.cfg.overhead_factor * predict_output_bytes(size))

    def minimal_limit(self, size: ProblemSize, dual: bool = False, route: Optional[str] = None) -> int:
        """The smallest memory.limit with which ``route`` (None: either route) can plan its smallest chunk:
        one group of one row (direct), of `cg_least_rows` rows (CG, the design kept or not)."""
        overhead = self.cfg.overhead_factor
        _, predict = self.costs(size, "cg", cache=False)
        smallest_predict = (predict.bytes(1, 1, overhead) + self.predict_output_bytes(size)) / self.chunk_fraction
        least = self.cg_least_rows(size)
        cg = min(self.costs(size, "cg", cache)[0].bytes(1, least, overhead) for cache in (True, False))
        cg = cg / self.chunk_fraction
        direct_fit, _ = self.costs(size, "direct", cache=False, dual=dual)
        direct = max(direct_fit.bytes(1, 1, overhead) / self.chunk_fraction,
                     self.dense_bytes(size, dual) / self.cfg.dense_fraction)
        if self.system_dim(size, dual) > self.max_dim[0] and route is None:
            direct = float("inf")
        fit = {"direct": direct, "cg": cg}.get(route, min(cg, direct))
        return int(max(fit, smallest_predict)) + 1

    @property
    def max_dim(self) -> Tuple[int, str]:
        """(the largest dense system solver=auto factors, the setting that says so)."""
        if self.direct_max_dim is not None and self.direct_max_dim < self.cfg.max_dense_dim:
            return self.direct_max_dim, "solver.direct_max_dim"
        return self.cfg.max_dense_dim, "memory.max_dense_dim"

    def system_dim(self, size: ProblemSize, dual: bool) -> int:
        """The dense system's dimension: N in the dual form, else D."""
        return size.n_rows if self.dual_form(size, dual) else size.width

    def route(self, size: ProblemSize, free: int, requested: str = "auto", dual: bool = False,
              held: int = 0) -> Tuple[str, str]:
        """(route, reason) per waterfall step 1, unless ``requested`` forces one (``free``, ``held``:
        as in `capped_free`)."""
        if requested in ("direct", "cg"):
            return requested, f"solver.name={requested}"
        dense = self.dense_bytes(size, dual)
        room = self.cfg.dense_fraction * self.capped_free(free, held)
        dim = self.system_dim(size, dual)
        name = f"N={dim} (dual form, D={size.width})" if self.dual_form(size, dual) else f"D={dim}"
        most, setting = self.max_dim
        if dim > most:
            return "cg", f"{name} > {setting}={most}"
        if dense >= room:
            return "cg", (f"one dense system needs {format_size(dense)} >= memory.dense_fraction x free "
                          f"= {format_size(room)}")
        return "direct", f"{name} <= {most} and one dense system needs {format_size(dense)}"

    def binding(self, free: int, held: int = 0, bound: Optional[Limit] = None) -> Limit:
        """The limit that binds ``free``: memory.limit when it caps it (`capped_free`), else ``bound``
        (the limit ``free`` was read under), else the device's free memory."""
        if self.limit is not None and self.limit - held < free:
            return Limit("memory.limit", self.limit, held)
        return bound if bound is not None else Limit("device memory", free, 0)

    def cg_least_rows(self, size: ProblemSize) -> int:
        """The fewest rows a CG chunk holds: min(N, memory.max_chunk_rows, memory.min_chunk_rows). Each
        product goes over every chunk (rebuilding each one when the design is not kept), so a chunk of a
        few rows multiplies the per-chunk work by thousands: a run planned so was still fitting after 10
        minutes where the uncapped fit takes seconds. Below this, the plan refuses and names the limit."""
        return max(1, min(row_cap(size.n_rows, self.max_chunk_rows), self.cfg.min_chunk_rows))

    def fit_chunk(self, size: ProblemSize, route: str, dual: bool, budget: int, minimal: int,
                  bound: Limit) -> Tuple[ChunkPlan, bool, StepCost, StepCost]:
        """(the fit's chunk, cache_design, fit cost, predict cost) on ``route``: CG keeps W Phi whole when
        it fits with chunks of at least `cg_least_rows` rows, else rebuilds it at every product (with
        chunks that size at least); the dual form batches as many groups as their N x N kernels fit."""
        is_cg = route == "cg"
        least = self.cg_least_rows(size) if is_cg else 1
        try:
            return self._fit_chunk(size, route, is_cg, dual, budget, minimal, bound, least)
        except MemoryBudgetError:
            if not is_cg:  # only CG can go on without keeping the design
                raise
            return self._fit_chunk(size, route, False, dual, budget, minimal, bound, least)

    def _fit_chunk(self, size: ProblemSize, route: str, cache: bool, dual: bool, budget: int, minimal: int,
                   bound: Limit, least: int) -> Tuple[ChunkPlan, bool, StepCost, StepCost]:
        """`fit_chunk` with the design kept (``cache``) or not; ``dual``: the direct route's dual form (its
        per-group cost is one group's kernel system, `dual_system_bytes`)."""
        fit_cost, predict_cost = self.costs(size, route, cache, dual)
        fit = pick_chunk(size.n_groups, size.n_rows,
                         fit_cost.fixed, fit_cost.per_row, budget, self.cfg.overhead_factor, self.cfg.min_chunk_rows,
                         self.max_chunk_rows, "fit", minimal, bound, least)
        return fit, cache, fit_cost, predict_cost

    def stream_chunk(self, n_groups: int, n_rows: int, group_rows: int, row_bytes: int, free: int,
                     bound: Optional[Limit] = None) -> Optional[ChunkPlan]:
        """The chunk of groups a table of ``n_rows`` rows is streamed in when it needs more than ``free``
        (host bytes, capped by memory.limit) at ``row_bytes`` a row (`stream_row_bytes`): as many groups of
        ``group_rows`` rows (the largest group's) as fit in the chunk fraction of it; None when the table
        fits (the run reads it whole). The fit's chunks are planned in what each chunk leaves.

        Raises:
            MemoryBudgetError: one group's rows do not fit; names ``bound`` and the limit they need.
        """
        bound = self.binding(free, 0, bound)
        free = self.capped_free(free)
        budget = int(self.chunk_fraction * free)
        cost, overhead = StepCost(0, row_bytes), self.cfg.overhead_factor
        if cost.bytes(1, n_rows, overhead) <= free:
            return None
        one = cost.bytes(1, group_rows, overhead)
        if one > budget:
            raise MemoryBudgetError(bound.name, format_size(bound.size),
                                    f"one group's {group_rows} rows need {format_size(one)} to stream but the chunk "
                                    f"budget under {bound.describe()} is {format_size(budget)}",
                                    bound.fix(int(one / self.chunk_fraction) + 1))
        groups, _ = select_chunk(n_groups, group_rows, cost, budget, overhead, floor_rows=group_rows, regrow_rows=False)
        return ChunkPlan(groups, group_rows, cost.bytes(groups, group_rows, overhead))

    def select_minimal(self, size: ProblemSize) -> int:
        """The smallest memory.limit GCV's search can run in: every group's statistics, then one group
        of one row or one group's score."""
        overhead = self.cfg.overhead_factor
        build, score = gcv_build_cost(size), StepCost(gcv_score_bytes(size), 0)
        smallest = max(build.bytes(1, 1, overhead), score.bytes(1, 0, overhead))
        return int((step_bytes(size.n_groups, 0, gcv_held_bytes(size), 0, overhead) + smallest)
                   / self.chunk_fraction) + 1

    def select_plan(self, size: ProblemSize, budget: int, minimal: int, bound: Limit) -> SelectPlan:
        """GCV's chunks in ``budget`` (`SelectPlan`): what is left once every group's Gram is held.

        Raises:
            ConfigError: D > memory.max_dense_dim (no dense Gram is built that wide).
            MemoryBudgetError: the held Grams and one group's smallest step do not fit.
        """
        if size.width > self.cfg.max_dense_dim:
            raise ConfigError("model.penalties", "gcv", f"the GCV search holds each group's D x D Gram; D={size.width} "
                              f"> memory.max_dense_dim={self.cfg.max_dense_dim}", "set model.penalties=fixed (tune "
                              "the penalties with the optuna sweep, docs/sweeps.md), or use a smaller model")
        overhead, groups = self.cfg.overhead_factor, size.n_groups
        held = step_bytes(groups, 0, gcv_held_bytes(size), 0, overhead)
        left = budget - held
        build_cost, score_cost = gcv_build_cost(size), StepCost(gcv_score_bytes(size), 0)
        build = pick_chunk(groups, size.n_rows, build_cost.fixed, build_cost.per_row, left, overhead,
                           self.cfg.min_chunk_rows, self.max_chunk_rows, "GCV Gram", minimal, bound)
        # a score has no rows: one "row" of 0 bytes more keeps the one chunk selector
        score = pick_chunk(groups, 1, score_cost.fixed, 1, left, overhead, 1, 1, "GCV score", minimal, bound)
        score = ChunkPlan(score.groups, 0, score_cost.bytes(score.groups, 0, overhead))
        return SelectPlan(held, build, score, build_cost, score_cost)

    def plan(self, size: ProblemSize, free: int, requested: str = "auto", dual: bool = False, held: int = 0,
             bound: Optional[Limit] = None, select: bool = False, announce: bool = True) -> Plan:
        """The whole plan: route, fit chunks, predict chunks, the predicted peak and the minimal limit.
        ``free``: the device's free bytes; ``held``: the bytes already counted against the limit (see
        `capped_free`); ``dual``: the direct route may take the dual form (solver.dual); ``bound``: the
        limit ``free`` was read under (`binding`); ``select``: plan GCV's penalty selection too (`select_plan`);
        ``announce``: log the plan (False for the plans per machine class, `tamrun.tco.plan`).

        Raises:
            MemoryBudgetError: even the smallest chunk does not fit (the message gives the minimal limit).
        """
        route, reason = self.route(size, free, requested, dual, held)
        bound = self.binding(free, held, bound)
        dual = route == "direct" and self.dual_form(size, dual)
        free = self.capped_free(free, held)
        budget = int(self.chunk_fraction * free)
        minimal = self.minimal_limit(size, dual, requested if requested in ("direct", "cg") else None)
        minimal = max(minimal, self.select_minimal(size)) if select else minimal
        chosen = self.select_plan(size, budget, minimal, bound) if select else None
        try:
            fit, cache, fit_cost, predict_cost = self.fit_chunk(size, route, dual, budget, minimal, bound)
        except MemoryBudgetError:
            if requested != "auto" or route != "direct":
                raise
            route, dual = "cg", False  # the dense system fits, but not with its smallest chunk of rows
            reason = f"the direct route's smallest chunk does not fit the budget of {format_size(budget)}"
            fit, cache, fit_cost, predict_cost = self.fit_chunk(size, route, dual, budget, minimal, bound)
        overhead, max_rows, min_rows = self.cfg.overhead_factor, self.max_chunk_rows, self.cfg.min_chunk_rows
        output = self.predict_output_bytes(size)
        chunk = pick_chunk(size.n_groups, max(size.n_rows, size.n_predict_rows), predict_cost.fixed,
                           predict_cost.per_row, max(0, budget - output), overhead, min_rows, max_rows, "predict",
                           minimal, bound)
        predict = ChunkPlan(chunk.groups, chunk.rows, chunk.bytes + output)
        plan = Plan(route=route, reason=reason, fit=fit, predict=predict, cache_design=cache, budget=budget,
                    free=free, predicted_peak=max(fit.bytes, predict.bytes, chosen.peak if chosen else 0),
                    minimal_limit=minimal, select=chosen,
                    fit_cost=fit_cost, predict_cost=predict_cost, overhead=overhead,
                    chunk_fraction=self.chunk_fraction, predict_output=output, dual=dual, bound_by=bound.name,
                    bound_detail=bound.describe())
        if announce:
            log.info("memory plan: route=%s (%s); fit chunk %d groups x %d rows; predict chunk %d x %d; "
                     "predicted peak %s of budget %s, bound by %s", route, reason, fit.groups, fit.rows, predict.groups,
                     predict.rows, format_size(plan.predicted_peak), format_size(budget), plan.bound_detail)
        return plan
