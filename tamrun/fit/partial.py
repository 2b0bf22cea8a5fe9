"""Partial effects: each effect's contribution Phi_j(x) beta_j along a grid of its first column."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from tamrun.data.batch import GroupedBatch
from tamrun.fit.fitted import FittedModel, predict_rows
from tamrun.machine.placement import HOST

# The most groups whose curves a partial-effects plot draws its mean and spread from: evenly spaced over
# the groups' order beyond it (a million groups' curves of 100 points each are 100 M predictions, minutes,
# for a figure that shows a mean and two quantiles).
PLOTTED_GROUPS = 2000


def plotted_groups(n_groups: int, most: int = PLOTTED_GROUPS) -> torch.Tensor:
    """The indices (k,) of the groups a plot draws: all of them up to ``most``, else ``most`` evenly
    spaced ones (the first and the last among them)."""
    if n_groups <= most:
        return torch.arange(n_groups)
    return torch.linspace(0, n_groups - 1, most, dtype=torch.float64).round().long().unique()


def partial_effect_curves(model: FittedModel, train: GroupedBatch, device: torch.device = HOST,
                          points: int = 100, max_levels: int = 30, most_groups: int = PLOTTED_GROUPS) -> List[dict]:
    """For every effect, its contribution (G', n) along ``points`` values spanning the training range of
    its first column (or along the column's levels when it has at most ``max_levels`` values), the
    other columns held at their training median; predicted on ``device`` in the model's chunks (which
    fitted in memory). G' = G groups up to ``most_groups``, else that many evenly spaced (`plotted_groups`).

    Returns dicts with ``name``, ``column``, ``grid``, ``values`` (G', n), ``data`` (the column's
    training values), ``discrete`` and ``groups`` (G': the groups the curves are of).
    """
    real = train.weight > 0
    values = train.x[real]  # (rows, F)
    median = values.median(dim=0).values
    n_features = train.x.shape[2]
    shown = plotted_groups(train.x.shape[0], most_groups)
    n_groups = len(shown)
    design, coef = model.design.of_groups(shown), model.coef[shown]
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
                       "data": data, "discrete": discrete, "groups": n_groups})
    return curves
