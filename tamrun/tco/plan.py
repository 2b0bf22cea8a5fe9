"""The plan per machine class: does the run fit a class's memory unchunked, chunked (the oracle's chunks
in that memory) or not at all (and how much memory it lacks); its predicted time on the class
(`tamrun.tco.time`) and its cost; the cheapest class that fits and by how much it beats the next.

    fits_of(tco, problem)           -> [ClassFit]        memory only (the oracle, `MemoryOracle.plan`)
    priced(fits, work)              -> TcoPlan           times and costs from a measured work

What a class can plan in: its memory less what the process holds before the plan (on a CPU class: this
run's resident set at planning, the safety margin and the recording's reserve; on a GPU class: a CUDA
context, `CUDA_CONTEXT_ESTIMATE`, and the safety margin), read as a `Limit` named after the class.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import List, Optional

from tamrun.config.schema import MachineClass, MemoryConfig, TcoConfig
from tamrun.errors import MemoryBudgetError
from tamrun.memory.footprint import ProblemSize
from tamrun.machine.gpu import CUDA_CONTEXT_ESTIMATE
from tamrun.machine.limits import Limit
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.config.units import format_size
from tamrun.tco.time import chunk_overhead, group_steps

GIB = 2**30
SECONDS_PER_HOUR = 3600.0
UNLIMITED = 1 << 62  # the free memory of the reference plan: the chunks the run takes with no cap at all

FITS_UNCHUNKED = "fits unchunked"
FITS_CHUNKED = "fits chunked"
DOES_NOT_FIT = "does not fit"


@dataclass(frozen=True)
class Problem:
    """What the plan per class needs of a run: its size, the solver's asks, the memory settings, and what
    the process holds before the plan (``host_used``: its resident set; ``reserve``: the recording's)."""

    size: ProblemSize
    memory: MemoryConfig
    requested: str  # solver.name
    dual: bool  # solver.dual
    direct_max_dim: int
    select: bool  # model.penalties=gcv
    host_used: int
    reserve: int


@dataclass(frozen=True)
class Work:
    """A measured work: ``fixed`` seconds the chunks do not change and ``chunked`` seconds they do
    (`tamrun.tco.time`), measured on class ``on`` with ``overhead`` = O of the plan it ran."""

    fixed: float
    chunked: float
    on: str
    overhead: float


@dataclass(frozen=True)
class ClassFit:
    """One class: how the run fits it, and (once priced) its predicted seconds and cost."""

    name: str
    kind: str
    memory_bytes: int
    price_per_hour: float
    bandwidth_gbs: float
    fit: str  # FITS_UNCHUNKED | FITS_CHUNKED | DOES_NOT_FIT
    free_bytes: int = 0  # what the run can plan in on it (memory.limit=free_bytes gives its chunks here)
    cores: Optional[int] = None
    route: str = ""
    chunk_groups: int = 0
    chunk_rows: int = 0
    design_kept: bool = True  # CG keeps W Phi between its products
    steps: int = 0  # group steps of one pass (`group_steps`)
    lacking_bytes: int = 0  # does not fit: the memory it lacks (the smallest chunks)
    seconds: Optional[float] = None
    cost_usd: Optional[float] = None

    @property
    def fits(self) -> bool:
        return self.fit != DOES_NOT_FIT

    @property
    def overhead(self) -> float:
        """O of this class's plan (`chunk_overhead`)."""
        return chunk_overhead(self.route, self.steps, self.design_kept)

    def cell(self) -> str:
        """The fit in words: "fits chunked (4 groups x 1024 rows, W Phi rebuilt)", "does not fit (lacks 1.2 GiB)"."""
        if not self.fits:
            return f"{self.fit} (lacks {format_size(self.lacking_bytes)})"
        rebuilt = ", W Phi rebuilt" if self.route == "cg" and not self.design_kept else ""
        return f"{self.fit} ({self.route}, {self.chunk_groups} groups x {self.chunk_rows} rows{rebuilt})"


@dataclass(frozen=True)
class TcoPlan:
    """Every class's fit, time and cost; the cheapest class that fits and how much it beats the next by."""

    classes: List[ClassFit]
    measured_on: Optional[str]
    cheapest: Optional[str] = None
    next_cheapest: Optional[str] = None
    beats_next_usd: Optional[float] = None  # cost of the next cheapest - cost of the cheapest
    work: Optional[Work] = None
    notes: List[str] = field(default_factory=list)

    def by_name(self, name: Optional[str]) -> Optional[ClassFit]:
        return next((c for c in self.classes if c.name == name), None)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """The plan per class as a text table, the cheapest class last."""
        lines = ["machine classes (tco.classes; time and cost of the features, solve and predict phases):",
                 f"  {'class':<12} {'memory':>10} {'$/h':>6}  {'time s':>8} {'cost $':>10}  fit"]
        for c in self.classes:
            seconds = "-" if c.seconds is None else f"{c.seconds:.3g}"
            cost = "-" if c.cost_usd is None else f"{c.cost_usd:.3g}"
            mark = " (measured on)" if c.name == self.measured_on else ""
            lines.append(f"  {c.name:<12} {format_size(c.memory_bytes):>10} {c.price_per_hour:>6.3g}  {seconds:>8} "
                         f"{cost:>10}  {c.cell()}{mark}")
        if self.cheapest is not None:
            best = self.by_name(self.cheapest)
            runner_up = self.by_name(self.next_cheapest)
            after = (f"; it beats {self.next_cheapest} by ${self.beats_next_usd:.3g} per run "
                     f"({100 * self.beats_next_usd / runner_up.cost_usd:.0f} % cheaper)" if runner_up is not None else "")
            lines.append(f"cheapest class that fits: {self.cheapest} (${best.cost_usd:.3g} per run){after}")
        lines += self.notes
        return "\n".join(lines)


def class_limit(name: str, machine: MachineClass, problem: Problem) -> Limit:
    """What the run can plan in on ``machine``: its memory less what is held before the plan."""
    on_gpu = machine.kind.value == "gpu"
    return Limit(f"class {name}", int(machine.memory_gib * GIB), CUDA_CONTEXT_ESTIMATE if on_gpu else problem.host_used,
                 margin=problem.memory.safety_margin_bytes, reserve=0 if on_gpu else problem.reserve)


def oracle_plan(problem: Problem, on_gpu: bool, free: int, bound: Optional[Limit] = None) -> Plan:
    """The oracle's plan of ``problem`` in ``free`` bytes (MemoryBudgetError when it does not fit)."""
    oracle = MemoryOracle(problem.memory, None, on_gpu=on_gpu, direct_max_dim=problem.direct_max_dim)
    return oracle.plan(problem.size, free, problem.requested, problem.dual, 0, bound, select=problem.select,
                       announce=False)


def lacking(problem: Problem, on_gpu: bool, limit: Limit) -> int:
    """The memory ``limit`` lacks for the smallest chunks (the oracle's minimal limit, GCV's included)."""
    oracle = MemoryOracle(problem.memory, None, on_gpu=on_gpu, direct_max_dim=problem.direct_max_dim)
    forced = problem.requested if problem.requested in ("direct", "cg") else None
    minimal = oracle.minimal_limit(problem.size, problem.dual, forced)
    minimal = max(minimal, oracle.select_minimal(problem.size)) if problem.select else minimal
    return max(1, limit.need(minimal) - limit.size)


def class_fit(name: str, machine: MachineClass, problem: Problem) -> ClassFit:
    """How the run fits one class: the oracle's plan in its memory against the plan with no cap."""
    on_gpu = machine.kind.value == "gpu"
    limit = class_limit(name, machine, problem)
    base = ClassFit(name, machine.kind.value, limit.size, machine.price_per_hour, machine.bandwidth_gbs, DOES_NOT_FIT,
                    limit.left, machine.cores)
    try:
        plan = oracle_plan(problem, on_gpu, limit.left, limit)
    except MemoryBudgetError:
        return replace(base, lacking_bytes=lacking(problem, on_gpu, limit))
    free = oracle_plan(problem, on_gpu, UNLIMITED)
    same = (plan.route, plan.fit.groups, plan.fit.rows, plan.cache_design) == (
        free.route, free.fit.groups, free.fit.rows, free.cache_design)
    return replace(base, fit=FITS_UNCHUNKED if same else FITS_CHUNKED, route=plan.route, chunk_groups=plan.fit.groups,
                   chunk_rows=plan.fit.rows, design_kept=plan.route != "cg" or plan.cache_design,
                   steps=group_steps(problem.size.n_groups, plan.fit.groups))


def fits_of(tco: TcoConfig, problem: Problem) -> List[ClassFit]:
    """Every class of ``tco.classes``, in their order, fitted (no time or cost yet)."""
    return [class_fit(name, machine, problem) for name, machine in tco.classes.items()]


def priced(fits: List[ClassFit], measured_on: Optional[str], work: Optional[Work], notes: List[str]) -> TcoPlan:
    """The classes with their predicted seconds and cost from ``work`` (None: memory only)::

        t_c = (fixed + chunked * O_c / O_ref) * B_ref / B_c,   cost_c = t_c * price_c / 3600

    (`tamrun.tco.time`), then the cheapest class that fits and its lead over the next."""
    reference = next((c for c in fits if c.name == (work.on if work else None)), None)
    if work is None or reference is None:
        return TcoPlan(fits, measured_on, notes=notes)
    out = []
    for c in fits:
        if not c.fits:
            out.append(c)
            continue
        seconds = (work.fixed + work.chunked * c.overhead / work.overhead) * reference.bandwidth_gbs / c.bandwidth_gbs
        out.append(replace(c, seconds=seconds, cost_usd=seconds * c.price_per_hour / SECONDS_PER_HOUR))
    ranked = sorted((c for c in out if c.cost_usd is not None), key=lambda c: c.cost_usd)
    cheapest = ranked[0] if ranked else None
    runner_up = ranked[1] if len(ranked) > 1 else None
    return TcoPlan(out, measured_on, cheapest.name if cheapest else None, runner_up.name if runner_up else None,
                   runner_up.cost_usd - cheapest.cost_usd if runner_up else None, work, notes)

