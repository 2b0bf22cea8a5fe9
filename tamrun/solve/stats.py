"""What a solve reports besides its coefficients, and the one rule that merges reports.

`SolveStats` is one solver call's report (a Cholesky batch, a CG batch); `FitStats` is a whole fit's
(a route, its chunk sizes, and the merged reports of every chunk). Merging takes the worst of the
per-group maxima, sums the group counts and keeps the first CG residual history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class SolveStats:
    jitter_escalations: int = 0  # extra jitter steps taken by any group
    lu_fallback_groups: int = 0  # groups solved by LU after Cholesky kept failing
    cg_iterations: int = 0  # max over groups and chunks
    cg_unconverged_groups: int = 0
    cg_final_residual: float = 0.0  # worst final ||r|| / ||b||
    cg_history: List[float] = field(default_factory=list)  # worst residual per iteration (first CG solve)
    # wall seconds, summed over chunks: building the system (the Gram, CG's operator and
    # preconditioner, the dual form's kernel) and solving it (factorisations, CG's iterations)
    setup_seconds: float = 0.0
    solve_seconds: float = 0.0

    def merge(self, other: "SolveStats") -> None:
        """Fold ``other`` into this report: maxima of the per-group maxima, sums of the counts and
        seconds, the first non-empty CG history."""
        self.jitter_escalations = max(self.jitter_escalations, other.jitter_escalations)
        self.lu_fallback_groups += other.lu_fallback_groups
        self.cg_iterations = max(self.cg_iterations, other.cg_iterations)
        self.cg_unconverged_groups += other.cg_unconverged_groups
        self.cg_final_residual = max(self.cg_final_residual, other.cg_final_residual)
        self.setup_seconds += other.setup_seconds
        self.solve_seconds += other.solve_seconds
        if not self.cg_history:
            self.cg_history = list(other.cg_history)


@dataclass
class FitStats(SolveStats):
    """A fit's report: its route and the (group, row) chunk sizes it kept, with the merged solves."""

    route: str = "direct"
    group_chunk: int = 0
    row_chunk: int = 0
