"""Partial effects: each effect's contribution Phi_j(x) beta_j along a grid of its first column."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from tamrun.data.batch import GroupedBatch
from tamrun.effects.design import AdditiveDesign


def partial_effect_curves(design: AdditiveDesign, coef: torch.Tensor, train: GroupedBatch, points: int = 100,
                          max_levels: int = 30, group_chunk: int = 0) -> List[dict]:
    """For every effect, its contribution (G, n) along ``points`` values spanning the training range of
    its first column (or along the column's levels when it has at most ``max_levels`` values), the
    other columns held at their training median; ``group_chunk`` groups at a time (0: all; the
    runner passes the fit's chunk, which fitted in memory).

    Returns dicts with ``name``, ``column``, ``grid``, ``values`` (G, n), ``data`` (the column's
    training values) and ``discrete``.
    """
    real = train.weight > 0
    values = train.x[real]  # (rows, F)
    median = values.median(dim=0).values
    n_groups, n_features = train.x.shape[0], train.x.shape[2]
    device = design.scaler.center.device
    slices = dict(design.block_slices())
    curves = []
    for effect in design.effects:
        column = effect.columns[0]
        index = design.columns.index(column)
        data = values[:, index].cpu().numpy()
        levels = np.unique(data)
        discrete = len(levels) <= max_levels
        grid = levels if discrete else np.linspace(data.min(), data.max(), points)
        x = median.expand(n_groups, len(grid), n_features).clone()
        x[..., index] = torch.as_tensor(grid, dtype=x.dtype)
        only = torch.zeros_like(coef)
        only[:, slices[effect.name]] = coef[:, slices[effect.name]]
        only = only.to(device=device, dtype=x.dtype)
        step = group_chunk if group_chunk > 0 else n_groups
        contribution = torch.cat([design.chunk(x[g0:g0 + step].to(device), slice(g0, g0 + step))
                                  .matvec(only[g0:g0 + step]).cpu() for g0 in range(0, n_groups, step)])
        curves.append({"name": effect.name, "column": column, "grid": grid, "values": contribution.numpy(),
                       "data": data, "discrete": discrete})
    return curves
