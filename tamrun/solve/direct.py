"""Batched Cholesky solve of SPD systems with bounded jitter escalation and an explicit LU fallback."""

from __future__ import annotations

import logging

import torch

from tamrun.solve.stats import SolveStats

log = logging.getLogger(__name__)


def triangular_pair_solve(factor: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(L L')^-1 b by two triangular solves (several times faster than torch.cholesky_solve on the CPU
    for a few right-hand sides): factor (..., D, D) lower, b (..., D, k)."""
    return torch.linalg.solve_triangular(factor.mT, torch.linalg.solve_triangular(factor, b, upper=False), upper=True)


def cholesky_factor(a: torch.Tensor, jitter: float, growth: float, max_tries: int) -> tuple:
    """Lower Cholesky factors of a batch of SPD matrices a (G, D, D) (jitter already included); a group
    whose factorisation fails gets jitter * growth^t added (t = 1..max_tries, logged; jitter 0 starts
    from the dtype's eps). Returns (factor (G, D, D), failed (G,) bool: still not factored, SolveStats)."""
    stats = SolveStats()
    factor, info = torch.linalg.cholesky_ex(a)
    failed = info > 0
    base = jitter if jitter > 0 else torch.finfo(a.dtype).eps
    tries = 0
    while bool(failed.any()) and tries < max_tries:
        tries += 1
        stats.jitter_escalations = tries
        extra = base * growth ** tries
        idx = failed.nonzero().squeeze(-1)
        log.warning("Cholesky failed for %d group(s); adding jitter %.3g (try %d/%d, solver.jitter_max_tries)",
                    idx.numel(), extra, tries, max_tries)
        retry, retry_info = torch.linalg.cholesky_ex(a[idx] + extra * torch.eye(a.shape[-1], dtype=a.dtype,
                                                                                 device=a.device))
        factor[idx] = retry
        failed[idx] = retry_info > 0
    return factor, failed, stats


def cholesky_solve(a: torch.Tensor, b: torch.Tensor, jitter: float, growth: float, max_tries: int,
                   lower_only: bool = False) -> tuple:
    """Solve a x = b for a batch of SPD matrices.

    Args:
        a: (G, D, D) symmetric positive (semi-)definite systems (jitter already included).
        b: (G, D) right-hand sides.
        jitter: the jitter already on the diagonal; a group whose factorisation fails gets
            jitter * growth^t added (t = 1..max_tries), then LU (logged) as the last resort
            (solver.jitter_growth, solver.jitter_max_tries; `cholesky_factor`).
        lower_only: only the lower triangle of ``a`` is set (the Cholesky reads nothing else; LU
            gets the matrix symmetrised from it).

    Returns:
        (x (G, D), SolveStats with the jitter escalations and LU fallbacks)
    """
    factor, failed, stats = cholesky_factor(a, jitter, growth, max_tries)
    x = triangular_pair_solve(factor, b.unsqueeze(-1)).squeeze(-1)
    if bool(failed.any()):
        idx = failed.nonzero().squeeze(-1)
        stats.lu_fallback_groups = int(idx.numel())
        log.warning("Cholesky still failed for %d group(s) after %d jitter escalations: solving them by LU",
                    idx.numel(), max_tries)
        failing = a[idx]
        if lower_only:
            failing = failing.tril() + failing.tril(-1).mT
        x[idx] = torch.linalg.solve(failing, b[idx])
    return x, stats
