"""P-spline effect: B-splines of degree ``deg`` on ``k`` equal intervals of [-1, 1].

Knots t: deg+1 copies of -1, the k-1 interior breaks, deg+1 copies of 1 (clamped); D = k + deg.
Cox-de Boor: B_{i,0}(z) = 1[t_i <= z < t_{i+1}] (the last interval is closed),
    B_{i,d} = (z - t_i)/(t_{i+d} - t_i) B_{i,d-1} + (t_{i+d+1} - z)/(t_{i+d+1} - t_{i+1}) B_{i+1,d-1}.
Outside [-1, 1] each basis function continues along its tangent at the nearer edge:
    B(z) = B(e) + B'(e) (z - e), e = clamp(z, -1, 1).
Penalty lambda D_p' D_p, D_p the order-p difference matrix (D - p, D).
"""

from __future__ import annotations

from typing import List

import torch

from tamrun.config.effects import SplineSpec
from tamrun.effects.base import ColumnEffect


def clamped_knots(k: int, deg: int) -> torch.Tensor:
    """(k + 2 deg + 1,) float64 knot vector on [-1, 1]."""
    breaks = torch.linspace(-1.0, 1.0, k + 1, dtype=torch.float64)
    return torch.cat([breaks[:1].repeat(deg), breaks, breaks[-1:].repeat(deg)])


def bspline_levels(z: torch.Tensor, knots: torch.Tensor, k: int, deg: int) -> List[torch.Tensor]:
    """Bases of every degree 0..deg at z in [-1, 1]; element d has shape (..., n, len(knots) - 1 - d)."""
    t = knots.to(dtype=z.dtype, device=z.device)
    interval = torch.clamp(((z + 1.0) * (k / 2.0)).floor().long(), 0, k - 1) + deg
    basis = torch.nn.functional.one_hot(interval, t.numel() - 1).to(z.dtype)
    levels = [basis]
    zz = z.unsqueeze(-1)
    for d in range(1, deg + 1):
        n_b = t.numel() - 1 - d
        left_den = t[d:d + n_b] - t[:n_b]
        right_den = t[d + 1:d + 1 + n_b] - t[1:1 + n_b]
        left = torch.where(left_den > 0, (zz - t[:n_b]) / torch.where(left_den > 0, left_den, 1.0), 0.0)
        right = torch.where(right_den > 0, (t[d + 1:d + 1 + n_b] - zz) / torch.where(right_den > 0, right_den, 1.0), 0.0)
        basis = left * basis[..., :-1] + right * basis[..., 1:]
        levels.append(basis)
    return levels


def local_basis(z: torch.Tensor, knots: torch.Tensor, k: int, deg: int) -> tuple:
    """The deg + 1 non-zero basis values at each z in [-1, 1] (de Boor's local recursion).

    Returns (values (..., n, deg + 1), first (..., n)): values[..., r] = B_{first + r, deg}(z).
    """
    t = knots.to(dtype=z.dtype, device=z.device)
    i = torch.clamp(((z + 1.0) * (k / 2.0)).floor().long(), 0, k - 1) + deg  # t[i] <= z < t[i+1]
    values = [torch.ones_like(z)]
    left, right = [None], [None]
    for j in range(1, deg + 1):
        left.append(z - t[i + 1 - j])
        right.append(t[i + j] - z)
        saved = torch.zeros_like(z)
        nxt = []
        for r in range(j):
            temp = values[r] / (right[r + 1] + left[j - r])
            nxt.append(saved + right[r + 1] * temp)
            saved = left[j - r] * temp
        nxt.append(saved)
        values = nxt
    return torch.stack(values, dim=-1), i - deg


def bspline_design(z: torch.Tensor, k: int, deg: int) -> torch.Tensor:
    """z (..., n) -> (..., n, k + deg) B-spline basis, continued linearly outside [-1, 1]."""
    knots = clamped_knots(k, deg)
    edge = z.clamp(-1.0, 1.0)
    values, first = local_basis(edge, knots, k, deg)
    columns = first.unsqueeze(-1) + torch.arange(deg + 1, device=z.device)
    basis = torch.zeros(z.shape + (k + deg,), dtype=z.dtype, device=z.device).scatter_(-1, columns, values)
    outside = z != edge
    if deg == 0 or not bool(outside.any()):
        return basis
    # Tangent continuation, on the (few) rows outside [-1, 1]:
    # dB_{i,deg}/dz = deg/(t_{i+deg} - t_i) B_{i,deg-1} - deg/(t_{i+deg+1} - t_{i+1}) B_{i+1,deg-1}
    t = knots.to(dtype=z.dtype, device=z.device)
    lower = bspline_levels(edge[outside], knots, k, deg)[deg - 1]
    n_b = k + deg
    left_den, right_den = t[deg:deg + n_b] - t[:n_b], t[deg + 1:deg + 1 + n_b] - t[1:1 + n_b]
    left = torch.where(left_den > 0, deg / torch.where(left_den > 0, left_den, 1.0), 0.0)
    right = torch.where(right_den > 0, deg / torch.where(right_den > 0, right_den, 1.0), 0.0)
    slope = left * lower[..., :-1] - right * lower[..., 1:]
    basis[outside] += slope * (z - edge)[outside].unsqueeze(-1)
    return basis


def difference_penalty(width: int, order: int) -> torch.Tensor:
    """D_p' D_p (width, width) float64; order 0 gives the identity."""
    diff = torch.eye(width, dtype=torch.float64)
    for _ in range(order):
        diff = torch.diff(diff, dim=0)
    return diff.T @ diff


class SplineEffect(ColumnEffect):
    def __init__(self, name: str, spec: SplineSpec) -> None:
        super().__init__(name, spec.column, spec.ap)
        self.k, self.deg, self.p = spec.k, spec.deg, spec.p

    @property
    def width(self) -> int:
        return self.k + self.deg

    @property
    def work_width(self) -> int:
        return 6 * (self.deg + 1)  # de Boor's running values, knot distances, column indices

    def design(self, x: torch.Tensor) -> torch.Tensor:
        return bspline_design(x, self.k, self.deg)

    def structure(self) -> torch.Tensor:
        return difference_penalty(self.width, self.p)
