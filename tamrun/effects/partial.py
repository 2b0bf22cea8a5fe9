"""Partial effects: each effect's contribution Phi_j(x) beta_j along a grid of its first column."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from tamrun.data.batch import GroupedBatch
from tamrun.fitted import FittedModel, predict_rows
from tamrun.placement import HOST


def partial_effect_curves(model: FittedModel, train: GroupedBatch, device: torch.device = HOST,
                          points: int = 100, max_levels: int = 30) -> List[dict]:
    """For every effect, its contribution (G, n) along ``points`` values spanning the training range of
    its first column (or along the column's levels when it has at most ``max_levels`` values), the
    other columns held at their training median; predicted on ``device`` in the model's chunks (which
    fitted in memory).

    Returns dicts with ``name``, ``column``, ``grid``, ``values`` (G, n), ``data`` (the column's
    training values) and ``discrete``.
    """
    real = train.weight > 0
    values = train.x[real]  # (rows, F)
    median = values.median(dim=0).values
    n_groups, n_features = train.x.shape[0], train.x.shape[2]
    design, coef = model.design, model.coef
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
        contribution = predict_rows(design, only, x, device, model.group_chunk, model.row_chunk)
        curves.append({"name": effect.name, "column": column, "grid": grid, "values": contribution.numpy(),
                       "data": data, "discrete": discrete})
    return curves
