"""Automatic penalties: generalised cross-validation (GCV) over the effects' log10 penalties.

Per group g with n_g real rows (0/1 row weights W), the statistics are built once, by the direct
route's own `normal_equations`:

    G_g = Phi_g' W Phi_g (D, D),   b_g = Phi_g' W y_g (D,),   yy_g = y_g' W y_g,   n_g

For a penalty vector lambda (one per effect; P(lambda) = blockdiag lambda_j P_j, shared by all groups)
each candidate costs one batched Cholesky (`cholesky_factor`, the direct route's, with its jitter
escalation) and one batched Cholesky solve with D + 1 right-hand sides (`gcv_terms`):

    A_g = G_g / n_g + P(lambda) + jitter I = L_g L_g'
    [X_g | beta_g] = A_g^-1 [G_g / n_g | b_g / n_g]                  (D, D + 1)
    tr H_g = tr X_g        (H_g = W Phi_g A_g^-1 Phi_g' W / n_g, the hat matrix)
    RSS_g = yy_g - 2 beta_g' b_g + beta_g' G_g beta_g
    GCV_g = n_g RSS_g / (n_g - tr H_g)^2

GCV_g is the mean squared leave-one-out error of group g with each row's leverage h_ii replaced by the
group's mean tr H_g / n_g (e_(i) = e_i / (1 - h_ii) exactly for a linear smoother, LOO dropping row i
with the penalty n_g lambda kept). The penalties are shared, so the criterion is the pooled

    V(lambda) = sum_g n_g GCV_g / sum_g n_g

the GCV estimate of the mean squared leave-one-out error over all training rows, the quantity the
pooled leave-one-out score estimates; averaging leverages within each group (not over all groups, as
the stacked model's N RSS / (N - tr H)^2 would) stays closer to the true ones when groups differ.

Search (`GcvSearch`): coordinate descent over the tuned effects (model.gcv), effect j's grid
ap_j + offsets around its configured ap with the others held, at most model.gcv.sweeps passes (fewer
once a pass changes nothing); on exact ties the current value is kept, then the lowest grid point.
The statistics of every group are held through the search (the plan's `SelectPlan`); they are built
and scored in group chunks through the run's `ChunkLoop` (its tracker and OOM guard): a chunk that
runs out of memory is retried smaller, and the choice does not depend on the chunks.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from tamrun.config.schema import GcvConfig, SolverConfig
from tamrun.data.batch import GroupedBatch
from tamrun.effects.chunk import BlockPenalty
from tamrun.effects.design import AdditiveDesign
from tamrun.memory.guard import ChunkLoop
from tamrun.memory.oracle import SelectPlan
from tamrun.solve.assembly import normal_equations, system_scale
from tamrun.solve.direct import cholesky_factor

log = logging.getLogger(__name__)

CRITERION = "sum_g n_g GCV_g / sum_g n_g, GCV_g = n_g RSS_g / (n_g - tr H_g)^2"


@dataclass
class GroupStatistics:
    """G (g, D, D), b (g, D), y'y (g,) and n (g,) of a set of groups (unnormalised)."""

    gram: torch.Tensor
    rhs: torch.Tensor
    yy: torch.Tensor
    n: torch.Tensor

    def __getitem__(self, groups: slice) -> "GroupStatistics":
        return GroupStatistics(self.gram[groups], self.rhs[groups], self.yy[groups], self.n[groups])


def group_statistics(design: AdditiveDesign, batch: GroupedBatch, groups: slice, device: torch.device,
                     row_chunk: int) -> GroupStatistics:
    """The statistics of ``groups``, accumulated over chunks of ``row_chunk`` rows (`normal_equations`)."""
    gram, rhs = normal_equations(design, batch, groups, device, row_chunk)
    y, w = batch.y[groups].to(device), batch.weight[groups].to(device)
    return GroupStatistics(gram, rhs, (w * y * y).sum(dim=1), system_scale(batch, groups, device))


def gcv_terms(stats: GroupStatistics, penalty: BlockPenalty, solver: SolverConfig) -> Tuple[torch.Tensor, torch.Tensor]:
    """(RSS_g, tr H_g), each (g,), at penalty P (see the module docstring); a group whose Cholesky fails
    even after the jitter escalation (solver.jitter_growth, solver.jitter_max_tries) gets RSS NaN."""
    n = stats.n.view(-1, 1, 1)
    scaled = stats.gram / n
    system = scaled.clone()
    penalty.add_to(system)
    system.diagonal(dim1=-2, dim2=-1).add_(solver.jitter)
    factor, failed, _ = cholesky_factor(system, solver.jitter, solver.jitter_growth, solver.jitter_max_tries)
    del system
    # one LAPACK potrs per group for the D + 1 right-hand sides (measured no slower than two triangular
    # solves at g = 48, D = 61; both ran ~100x slower with 2 threads on a loaded 2-core CPU than with 1)
    solved = torch.cholesky_solve(torch.cat([scaled, (stats.rhs / stats.n.view(-1, 1)).unsqueeze(-1)], -1), factor)
    del scaled, factor
    trace = solved[..., :-1].diagonal(dim1=-2, dim2=-1).sum(dim=-1)
    beta = solved[..., -1]
    fitted = (stats.gram * beta.unsqueeze(-2)).sum(dim=-1)  # G beta, elementwise (batch-invariant)
    rss = stats.yy - 2 * (beta * stats.rhs).sum(dim=-1) + (beta * fitted).sum(dim=-1)
    return rss.masked_fill(failed, math.nan), trace


def gcv_scores(rss: torch.Tensor, trace: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """GCV_g = n_g RSS_g / (n_g - tr H_g)^2, (g,); +inf where tr H_g >= n_g or RSS is NaN."""
    score = n * rss / (n - trace) ** 2
    return torch.where((trace < n) & ~torch.isnan(rss), score, torch.full_like(score, math.inf))


@dataclass
class GcvStep:
    """One coordinate step: ``effect``'s grid of log10 penalties, the pooled score at each, the choice."""

    sweep: int
    effect: str
    aps: List[float]
    scores: List[float]
    chosen: float


@dataclass
class GcvSelection:
    """The search's result: the chosen and configured log10 penalties of the tuned effects, the pooled
    scores at both, the path, the candidates scored and the seconds it took."""

    chosen: Dict[str, float]
    configured: Dict[str, float]
    score: float
    configured_score: float
    steps: List[GcvStep] = field(default_factory=list)
    candidates: int = 0
    seconds: float = 0.0

    def params(self) -> Dict[str, float]:
        """``gcv_ap.<effect>``: the chosen log10 penalty of every tuned effect."""
        return {f"gcv_ap.{name}": ap for name, ap in self.chosen.items()}

    def metrics(self) -> Dict[str, float]:
        return {"gcv_score": self.score, "gcv_score_configured": self.configured_score,
                "gcv_candidates": float(self.candidates), "gcv_seconds": self.seconds}

    def path(self, offsets: Sequence[float]) -> dict:
        """The search as JSON (the run's ``gcv/path.json``)."""
        return {"criterion": CRITERION, "offsets": list(offsets), "configured": self.configured,
                "chosen": self.chosen, "score": self.score, "configured_score": self.configured_score,
                "candidates": self.candidates, "seconds": self.seconds, "steps": [asdict(s) for s in self.steps]}


def tuned_effects(design: AdditiveDesign, gcv: GcvConfig) -> List[str]:
    """The effects the search tunes: model.gcv.effects, else every effect whose configured log10
    penalty is >= model.gcv.min_ap (never the intercept), in the design's order."""
    names = [effect.name for effect in design.effects]
    if gcv.effects is not None:
        return [name for name in names if name in set(gcv.effects)]
    return [effect.name for effect in design.effects if math.log10(effect.lam) >= gcv.min_ap]


def apply_penalties(design: AdditiveDesign, aps: Dict[str, float]) -> None:
    """Set the effects named in ``aps`` to lambda = 10^ap (the design's penalty follows)."""
    for effect in design.effects:
        if effect.name in aps:
            effect.lam = 10.0 ** aps[effect.name]


class GcvSearch:
    """Coordinate descent of the pooled GCV score over the tuned effects' grids (module docstring).

    Args:
        design: the fitted design, its effects at their configured penalties (never changed here).
        batch: the training batch; device: where the statistics live and are scored.
        solver: jitter and its escalation; gcv: the grid, the sweeps and the tuned effects.
        loop: the run's guarded chunk loop; plan: the selection's chunks and costs (`SelectPlan`).
    """

    def __init__(self, design: AdditiveDesign, batch: GroupedBatch, device: torch.device, solver: SolverConfig,
                 gcv: GcvConfig, loop: ChunkLoop, plan: SelectPlan) -> None:
        self.design, self.batch, self.device, self.solver, self.gcv = design, batch, device, solver, gcv
        self.loop, self.plan = loop, plan
        self.names = tuned_effects(design, gcv)
        self.configured = {e.name: math.log10(e.lam) for e in design.effects if e.name in self.names}
        self.penalty = design.penalty_operator().to(device, batch.x.dtype)
        self.block = {b.name: i for i, b in enumerate(design.blocks)}  # the penalty's blocks, in this order
        self.stats: Optional[GroupStatistics] = None
        self.candidates = 0

    def build(self) -> GroupStatistics:
        """Every group's statistics, built in the plan's chunks (phase select/gram)."""
        groups, width, dtype = len(self.batch.groups), self.design.width, self.batch.x.dtype
        stats = GroupStatistics(torch.empty(groups, width, width, dtype=dtype, device=self.device),
                                torch.empty(groups, width, dtype=dtype, device=self.device),
                                torch.empty(groups, dtype=dtype, device=self.device),
                                torch.empty(groups, dtype=dtype, device=self.device))
        build = self.plan.build

        def step(start: int, size: int) -> None:
            part = group_statistics(self.design, self.batch, slice(start, start + size), self.device, build.rows)
            for name in ("gram", "rhs", "yy", "n"):
                getattr(stats, name)[start:start + size] = getattr(part, name)

        self.loop.run(step, groups, build.groups, "select/gram", self.plan.build_cost, rows=build.rows)
        return stats

    def candidate_penalty(self, aps: Dict[str, float]) -> BlockPenalty:
        """P at the log10 penalties ``aps`` (tuned effects; the others at their configured ones)."""
        factors = [1.0] * len(self.penalty.blocks)
        for name, ap in aps.items():
            factors[self.block[name]] = 10.0 ** (ap - self.configured[name])
        return self.penalty.scaled(factors)

    def pooled(self, candidates: List[Dict[str, float]]) -> List[float]:
        """V(lambda) of each candidate (log10 penalties of the tuned effects), over every group in the
        plan's score chunks (phase select/gcv); a chunk's sums are added only once it is done."""
        penalties = [self.candidate_penalty(aps) for aps in candidates]
        totals = [0.0] * len(candidates)
        stats = self.stats

        def step(start: int, size: int) -> None:
            part = stats[start:start + size]
            sums = [float((part.n * gcv_scores(*gcv_terms(part, p, self.solver), part.n)).sum()) for p in penalties]
            for i, value in enumerate(sums):
                totals[i] += value

        self.loop.run(step, len(self.batch.groups), self.plan.score.groups, "select/gcv", self.plan.score_cost)
        self.candidates += len(candidates)
        rows = float(stats.n.sum())
        return [total / rows for total in totals]

    def run(self) -> GcvSelection:
        """The search: the statistics held (charged to the loop's tracker) through the coordinate descent."""
        began = time.perf_counter()
        with self.loop.tracker.hold(self.plan.held, "GCV statistics of every group"):
            self.stats = self.build()
            try:
                selection = self.descend()
            finally:
                self.stats = None
        selection.seconds = time.perf_counter() - began
        log.info("GCV: chose %s (score %.6g; configured %s: %.6g) from %d candidates in %.2f s",
                 {k: round(v, 3) for k, v in selection.chosen.items()}, selection.score, selection.configured,
                 selection.configured_score, selection.candidates, selection.seconds)
        return selection

    def descend(self) -> GcvSelection:
        """Coordinate descent from the configured penalties (see the module docstring for the ties)."""
        offsets = self.gcv.offsets
        index = {name: offsets.index(0.0) for name in self.names}

        def aps(changes: Dict[str, int]) -> Dict[str, float]:
            return {n: self.configured[n] + offsets[changes.get(n, index[n])] for n in self.names}

        configured_score = self.pooled([aps({})])[0]
        best, steps = configured_score, []
        for sweep in range(1, self.gcv.sweeps + 1):
            moved = False
            for name in self.names:
                scores = self.pooled([aps({name: k}) for k in range(len(offsets))])
                chosen = index[name]
                for k, value in enumerate(scores):
                    if value < scores[chosen]:
                        chosen = k
                moved |= chosen != index[name]
                index[name], best = chosen, scores[chosen]
                steps.append(GcvStep(sweep, name, [self.configured[name] + o for o in offsets], scores,
                                     self.configured[name] + offsets[chosen]))
            if not moved:
                break
        return GcvSelection(aps({}), dict(self.configured), best, configured_score, steps, self.candidates)


def select_penalties(design: AdditiveDesign, batch: GroupedBatch, device: torch.device, solver: SolverConfig,
                     gcv: GcvConfig, loop: ChunkLoop, plan: SelectPlan) -> GcvSelection:
    """Choose the tuned effects' penalties by GCV (`GcvSearch`) and set them on ``design``."""
    selection = GcvSearch(design, batch, device, solver, gcv, loop, plan).run()
    apply_penalties(design, selection.chosen)
    return selection
