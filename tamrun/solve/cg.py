"""Batched preconditioned conjugate gradient with a per-group convergence mask.

Solves A_g x_g = b_g for every group g at once; A is given only through ``matvec`` (G, D) -> (G, D).
Group g stops when ||r_g|| <= tol * ||b_g||; converged groups are frozen (their step is zero).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch

log = logging.getLogger(__name__)

# Default relative-residual tolerance per dtype (solver.tol=null).
DEFAULT_TOL = {torch.float64: 1e-6, torch.float32: 1e-4}


@dataclass
class CGResult:
    x: torch.Tensor  # (G, D)
    iterations: torch.Tensor  # (G,) iterations until convergence (max_iter if not converged)
    converged: torch.Tensor  # (G,) bool
    relative_residual: torch.Tensor  # (G,) final ||r|| / ||b||
    history: List[float] = field(default_factory=list)  # max over groups of ||r||/||b|| per iteration


def conjugate_gradient(matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor,
                       precondition: Optional[Callable[[torch.Tensor], torch.Tensor]], tol: float, max_iter: int,
                       x0: Optional[torch.Tensor] = None,
                       on_iteration: Optional[Callable[[int, float], None]] = None) -> CGResult:
    """Preconditioned CG: ``precondition`` applies M^-1 to residuals (G, D) (None: plain CG);
    ``on_iteration(i, worst relative residual)`` after each iteration (progress).

    Logs a warning naming ``solver.max_iter`` / ``solver.tol`` if some group has not converged.
    """
    precondition = precondition or (lambda r: r)
    x = torch.zeros_like(b) if x0 is None else x0.clone()
    r = b - matvec(x) if x0 is not None else b.clone()
    b_norm = torch.linalg.vector_norm(b, dim=-1).clamp_min(torch.finfo(b.dtype).tiny)
    rel = torch.linalg.vector_norm(r, dim=-1) / b_norm
    active = rel > tol
    iterations = torch.zeros(b.shape[0], dtype=torch.long, device=b.device)
    z = precondition(r)
    p = z.clone()
    rz = (r * z).sum(-1)
    history = [float(rel.max())]
    for step in range(max_iter):
        if not bool(active.any()):
            break
        ap = matvec(p)
        curvature = (p * ap).sum(-1)
        alpha = torch.where(active, rz / torch.where(curvature > 0, curvature, torch.ones_like(curvature)),
                            torch.zeros_like(rz))
        x = x + alpha.unsqueeze(-1) * p
        r = r - alpha.unsqueeze(-1) * ap
        iterations += active.long()
        rel = torch.linalg.vector_norm(r, dim=-1) / b_norm
        history.append(float(rel.max()))
        if on_iteration is not None:
            on_iteration(step + 1, history[-1])
        active = active & (rel > tol)
        z = precondition(r)
        rz_new = (r * z).sum(-1)
        beta = torch.where(active, rz_new / torch.where(rz != 0, rz, torch.ones_like(rz)), torch.zeros_like(rz))
        p = z + beta.unsqueeze(-1) * p
        rz = rz_new
    converged = rel <= tol
    if not bool(converged.all()):
        log.warning("CG stopped after solver.max_iter=%d iterations with %d of %d group(s) unconverged "
                    "(worst relative residual %.3g > solver.tol=%.3g): raise solver.max_iter or solver.tol",
                    max_iter, int((~converged).sum()), b.shape[0], float(rel.max()), tol)
    return CGResult(x=x, iterations=iterations, converged=converged, relative_residual=rel, history=history)
