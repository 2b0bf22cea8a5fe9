"""Batched preconditioned conjugate gradient with a per-group convergence mask.

Solves A_g x_g = b_g for every group g at once; A is given only through ``matvec`` (G, D) -> (G, D).
Group g stops when ||r_g|| <= tol * ||b_g||; converged groups are frozen (their step is zero).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch

from tamrun.machine.sampling import steady

log = logging.getLogger(__name__)

# Default relative-residual tolerance per dtype (solver.tol=null).
DEFAULT_TOL = {torch.float64: 1e-6, torch.float32: 1e-5}


@dataclass(frozen=True)
class CgProgress:
    """A CG solve's state after ``iteration`` iterations (0: its start): the worst relative residual
    over its ``groups`` against ``tol``, how many groups have converged, and whether the solve ended."""

    iteration: int
    residual: float
    tol: float
    converged: int
    groups: int
    final: bool = False


CgCallback = Callable[[CgProgress], None]


def no_cg_progress(state: CgProgress) -> None:
    """A CG progress callback that reports nothing."""


def residual_summary(rel: torch.Tensor, active: torch.Tensor, tol: float) -> Tuple[float, int, int]:
    """(worst relative residual, groups still running, groups converged) in one device sync."""
    worst, running, converged = torch.stack([rel.max(), active.sum().to(rel.dtype),
                                             (rel <= tol).sum().to(rel.dtype)]).tolist()
    return worst, int(running), int(converged)


@dataclass
class CGResult:
    x: torch.Tensor  # (G, D)
    iterations: torch.Tensor  # (G,) iterations until convergence (max_iter if not converged)
    converged: torch.Tensor  # (G,) bool
    relative_residual: torch.Tensor  # (G,) final ||r|| / ||b||
    history: List[float] = field(default_factory=list)  # max over groups of ||r||/||b|| per iteration


def conjugate_gradient(matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor,
                       precondition: Optional[Callable[[torch.Tensor], torch.Tensor]], tol: float, max_iter: int,
                       x0: Optional[torch.Tensor] = None, on_iteration: CgCallback = no_cg_progress) -> CGResult:
    """Preconditioned CG: ``precondition`` applies M^-1 to residuals (G, D) (None: plain CG);
    ``on_iteration`` gets a `CgProgress` at the start, after each iteration and at the end (``final``).

    Logs a warning naming ``solver.max_iter`` / ``solver.tol`` if some group has not converged.
    """
    precondition = precondition or (lambda r: r)
    groups = b.shape[0]
    x = torch.zeros_like(b) if x0 is None else x0.clone()
    r = b - matvec(x) if x0 is not None else b.clone()
    b_norm = torch.linalg.vector_norm(b, dim=-1).clamp_min(torch.finfo(b.dtype).tiny)
    rel = torch.linalg.vector_norm(r, dim=-1) / b_norm
    active = rel > tol
    iterations = torch.zeros(groups, dtype=torch.long, device=b.device)
    z = precondition(r)
    p = z.clone()
    rz = (r * z).sum(-1)
    worst, running, done = residual_summary(rel, active, tol)
    history = [worst]
    on_iteration(CgProgress(0, worst, tol, done, groups))
    for step in range(max_iter):
        if running == 0:
            break
        ap = matvec(p)
        curvature = (p * ap).sum(-1)
        alpha = torch.where(active, rz / torch.where(curvature > 0, curvature, torch.ones_like(curvature)),
                            torch.zeros_like(rz))
        x = x + alpha.unsqueeze(-1) * p
        r = r - alpha.unsqueeze(-1) * ap
        iterations += active.long()
        rel = torch.linalg.vector_norm(r, dim=-1) / b_norm
        active = active & (rel > tol)
        worst, running, done = residual_summary(rel, active, tol)
        history.append(worst)
        on_iteration(CgProgress(step + 1, worst, tol, done, groups))
        z = precondition(r)
        rz_new = (r * z).sum(-1)
        beta = torch.where(active, rz_new / torch.where(rz != 0, rz, torch.ones_like(rz)), torch.zeros_like(rz))
        p = z + beta.unsqueeze(-1) * p
        rz = rz_new
        if step == 0:
            steady()  # the later iterations allocate as the first did (`tamrun.machine.sampling`)
    on_iteration(CgProgress(len(history) - 1, worst, tol, done, groups, final=True))
    if done < groups:
        log.warning("CG stopped after solver.max_iter=%d iterations with %d of %d group(s) unconverged "
                    "(worst relative residual %.3g > solver.tol=%.3g): raise solver.max_iter or solver.tol",
                    max_iter, groups - done, groups, worst, tol)
    return CGResult(x=x, iterations=iterations, converged=rel <= tol, relative_residual=rel, history=history)
