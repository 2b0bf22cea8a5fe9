"""The inputs of the state-space adaptation: a fitted model's effects per row, laid out on a day grid.

    rows of a batch (G, N)  --day_grid-->  (G, T, R): day t of the calendar, the r-th row of that day
    effect_inputs: phi_{i,j} = Phi_j(x_i) beta_j, the contribution of effect j (k = J + 1 with the
    intercept), scaled by its standard deviation s_{g,j} over the group's burn-in rows; theta_0 = s,
    so that psi' theta_0 is the static forecast.  coefficient_inputs: psi_i = Phi(x_i) (k = D),
    theta_0 = beta.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tamrun.effects.design import AdditiveDesign
from tamrun.solve.assembly import row_spans


@dataclass
class DayGrid:
    """Where each row of a (G, N) batch goes on a (G, T, R) grid of days: ``day`` and ``slot`` (G, N)
    (-1 on padding); ``days`` (T,) datetime64[D] from the first row's day to the last's."""

    day: np.ndarray
    slot: np.ndarray
    days: np.ndarray

    @property
    def shape(self) -> tuple:
        """(T, R): days, and the most rows one group has on one day."""
        real = self.day >= 0
        return len(self.days), int(self.slot[real].max()) + 1 if real.any() else 1

    def place(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """values (G, N, ...) on the grid (G, T, R, ...), ``fill`` where no row is."""
        n_days, n_slots = self.shape
        out = values.new_full((values.shape[0], n_days, n_slots) + tuple(values.shape[2:]), fill)
        g, n = np.nonzero(self.day >= 0)
        out[torch.as_tensor(g), torch.as_tensor(self.day[g, n]), torch.as_tensor(self.slot[g, n])] = values[g, n]
        return out


def day_grid(dates: np.ndarray, real: np.ndarray) -> DayGrid:
    """The grid of rows dated ``dates`` (G, N) datetime64, ``real`` (G, N) bool (False: padding);
    rows of one group and day take slots 0, 1, ... in their order."""
    days = dates.astype("datetime64[D]")
    first, last = days[real].min(), days[real].max()
    day = np.where(real, (days - first).astype(np.int64), -1)
    slot = np.full(day.shape, -1, dtype=np.int64)
    for g in range(day.shape[0]):
        rows = np.nonzero(real[g])[0]
        order = rows[np.lexsort((dates[g, rows], day[g, rows]))]
        starts = np.r_[True, np.diff(day[g, order]) != 0]
        run_start = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
        slot[g, order] = np.arange(len(order)) - run_start
    return DayGrid(day, slot, np.arange(first, last + 1))


def effect_contributions(design: AdditiveDesign, coef: torch.Tensor, x: torch.Tensor, device: torch.device,
                         row_chunk: int) -> torch.Tensor:
    """(G, N, J') the contribution Phi_j(x) beta_j of each block j of ``design.blocks`` (the intercept
    first when the model has one) to the forecast Phi(x) beta, for raw features x (G, N, F) of the
    design's groups, ``row_chunk`` rows at a time; their sum over j is the forecast."""
    blocks, design = design.blocks, design.to(device)
    out = torch.zeros(x.shape[:2] + (len(blocks),), dtype=x.dtype)
    coef = coef.to(device=device, dtype=x.dtype)
    dense_width = design.dense_width
    for r0, r1 in row_spans(x.shape[1], max(1, row_chunk)):
        chunk = design.chunk(x[:, r0:r1].to(device))
        terms = chunk.dense * coef[:, None, :dense_width]  # (g, n, Dd): each dense column's part of the forecast
        indexed = dict(chunk.indexed)
        for j, block in enumerate(blocks):
            if block.start < dense_width:
                out[:, r0:r1, j] = terms[..., block.start:block.stop].sum(dim=-1).cpu()
            else:
                out[:, r0:r1, j] = indexed[block.start].matvec(coef[:, block.start:block.stop]).cpu()
        del chunk, terms
    return out


def input_scale(inputs: torch.Tensor, burn_in: torch.Tensor) -> torch.Tensor:
    """(G, k) each input's standard deviation over a group's burn-in rows (``burn_in`` (G, N) bool);
    where it is constant there (the intercept, an effect that does not vary within the group) its
    absolute value (1 if it is 0), so that every scaled input is of order 1."""
    mask = burn_in.unsqueeze(-1).to(inputs.dtype)
    count = mask.sum(1).clamp_min(1.0)
    mean = (inputs * mask).sum(1) / count
    var = (((inputs - mean.unsqueeze(1)) * mask) ** 2).sum(1) / count
    scale = var.sqrt()
    flat = scale <= 1e-12 * mean.abs().clamp_min(1.0)
    level = torch.where(mean.abs() > 0, mean.abs(), torch.ones_like(mean))
    return torch.where(flat, level, scale)
