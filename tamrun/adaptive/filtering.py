"""The Kalman adaptation of a fitted model over a table's rows: its inputs, and the filters run in
group chunks under the memory budget and the OOM guard.

    FittedModel + rows (date-sorted)  -> FilterInputs: psi (G, T, R, k) on the day grid, theta_0 (G, k)
    FilterInputs + (q, p0) pairs      -> FilterRun: day-ahead forecasts (C, G, T, R), sigma^2 (C, G),
                                         the weights (G, T, k) of a single pair when kept, seconds spent
                                         before (burn-in) and after the split day (adaptation)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.adaptive.kalman import FilterState, kalman_filter
from tamrun.adaptive.state_space import DayGrid, day_grid, effect_contributions, input_scale
from tamrun.adaptive.windows import history_dates
from tamrun.config.schema import KalmanState
from tamrun.data.batch import GroupedBatch
from tamrun.errors import MemoryBudgetError
from tamrun.fit.fitted import FittedModel
from tamrun.memory.footprint import StepCost
from tamrun.memory.guard import ChunkLoop
from tamrun.config.units import format_size
from tamrun.machine.placement import HOST


@dataclass
class FilterInputs:
    """The rows of a table as G series on a day grid: ``inputs`` (G, T, R, k) named ``names``,
    ``target`` (G, T, R), ``observed`` (G, T, R) bool (a real row), ``update`` (G, T, R) bool (a row the
    filter learns from), ``theta0`` (G, k) the static model's weights (``inputs`` . ``theta0`` is its
    forecast); ``batch`` and ``dates`` (G, N) the rows as a batch and their dates."""

    grid: DayGrid
    inputs: torch.Tensor
    target: torch.Tensor
    observed: torch.Tensor
    update: torch.Tensor
    theta0: torch.Tensor
    names: List[str]
    batch: GroupedBatch
    dates: np.ndarray

    @property
    def static(self) -> torch.Tensor:
        """(G, T, R) the static model's forecast of every slot (0 where no row is)."""
        return torch.einsum("gtrk,gk->gtr", self.inputs, self.theta0)

    def day_index(self, day: pd.Timestamp) -> int:
        """The first grid day on or after ``day``."""
        return int(np.searchsorted(self.grid.days, np.datetime64(day.date(), "D")))

    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in (self.inputs, self.target, self.observed, self.update))


def input_bytes(model: FittedModel, n_rows: int, state: KalmanState) -> int:
    """What building the inputs of ``n_rows`` rows holds at its peak: the (G, N, k) inputs, their copy
    on the (G, T, R, k) grid, and the target, masks and dates beside them (about 2 k + 4 values a row)."""
    k = len(model.design.blocks) if state == KalmanState.effects else model.design.width
    return (2 * k + 4) * n_rows * torch.finfo(model.dtype).bits // 8


def check_input_room(needed: int, budget: int, state: KalmanState) -> None:
    """`MemoryBudgetError` when the filters' inputs (``needed`` bytes) exceed the run's ``budget``."""
    if needed > budget:
        fix = ("use adaptive.kalman.state=effects (one input per effect), " if state == KalmanState.coefficients
               else "")
        raise MemoryBudgetError("adaptive.kalman.state", state.value,
                                f"the filters' inputs need about {format_size(needed)}, more than the budget of "
                                f"{format_size(budget)}", f"{fix}raise memory.limit, or filter fewer rows "
                                "(split.train_start later)")


def filter_inputs(model: FittedModel, frame: pd.DataFrame, burn_in_end: pd.Timestamp, state: KalmanState,
                  skip_updates: Sequence[str], device: torch.device, row_chunk: int) -> FilterInputs:
    """The inputs of the filters over the rows of ``frame`` (a table of the model's data): each effect's
    contribution scaled by its standard deviation over the rows before ``burn_in_end`` (state=effects),
    or the design row (state=coefficients); rows where a ``skip_updates`` column is not 0 are not learnt from."""
    date_column = model.recipe.date_column
    frame = frame.sort_values(date_column, kind="stable").reset_index(drop=True)
    batch = model.batch(frame)
    dates = history_dates(batch, frame[date_column].to_numpy())
    real = batch.row_index >= 0
    if state == KalmanState.effects:
        inputs = effect_contributions(model.design, model.coef, batch.x, device, row_chunk)
        scale = input_scale(inputs, torch.as_tensor(real & (dates < np.datetime64(burn_in_end))))
        inputs.div_(scale.unsqueeze(1))
        theta0, names = scale, [block.name for block in model.design.blocks]
    else:
        inputs = model.design.to(device).design(batch.x.to(device)).cpu()
        theta0, names = model.coef.to(inputs.dtype).cpu(), [f"c{j}" for j in range(model.design.width)]
    skipped = np.zeros(real.shape, dtype=bool)
    for column in skip_updates:
        skipped |= frame[column].to_numpy()[np.maximum(batch.row_index, 0)] != 0
    grid = day_grid(dates, real)
    observed = grid.place(torch.as_tensor(real), False)
    update = grid.place(torch.as_tensor(real & ~skipped), False)
    return FilterInputs(grid, grid.place(inputs), grid.place(batch.y), observed, update, theta0, names, batch, dates)


@dataclass
class FilterRun:
    """``forecast`` (C, G, T, R) of the pairs in order; ``sigma2`` (C, G) the noise variance estimated
    from each filter's innovations; ``weights`` (G, T, k) theta after each day (one pair, when kept);
    ``seconds``: wall time before the split day (burn_in) and from it (adaptation); ``groups``: the group
    chunk that was kept."""

    forecast: torch.Tensor
    sigma2: torch.Tensor
    weights: Optional[torch.Tensor]
    seconds: Dict[str, float] = field(default_factory=lambda: {"burn_in": 0.0, "adaptation": 0.0})
    groups: int = 0


def filter_cost(data: FilterInputs, pairs: int, keep_weights: bool) -> StepCost:
    """What the filters of one group hold: its series on the device (T R (k + 2) values), per pair its
    state (theta, covariance, the step's temporaries: about 2 k^2 + 6 k values) and its forecasts, errors
    and variances (3 T R), and the weights kept (T k)."""
    _, n_days, n_rows, k = data.inputs.shape
    size = data.inputs.element_size()
    per_pair = (2 * k * k + 6 * k + 3 * n_days * n_rows) * size
    series = n_days * n_rows * (k + 2) * size
    return StepCost(series + pairs * per_pair + (n_days * k * size if keep_weights else 0), 0)


def run_filters(data: FilterInputs, pairs: Sequence[Tuple[float, float]], split_day: int, loop: ChunkLoop,
                budget: int, overhead: float, keep_weights: bool = False,
                device: torch.device = HOST) -> FilterRun:
    """Filter every group under every (q, p0) pair on ``device``, as many groups at once as ``budget`` bytes
    hold (each chunk under the guard of ``loop``: an OOM retries it with fewer groups); results on the CPU."""
    n_groups, n_days, n_rows, k = data.inputs.shape
    dtype, n_pairs = data.inputs.dtype, len(pairs)
    q = torch.tensor([pair[0] for pair in pairs], dtype=dtype, device=device)
    p0 = torch.tensor([pair[1] for pair in pairs], dtype=dtype, device=device)
    cost = filter_cost(data, n_pairs, keep_weights)
    chunk = min(n_groups, int(budget // max(1, cost.bytes(1, 0, overhead))))
    if chunk < 1:
        raise MemoryBudgetError("adaptive.kalman", f"{n_pairs} pair(s), k={k}",
                                f"the filters of one group need {format_size(cost.bytes(1, 0, overhead))}, more than "
                                f"the budget of {format_size(budget)}",
                                "give fewer (q, p0) pairs, use adaptive.kalman.state=effects, or raise memory.limit")
    weights = data.inputs.new_zeros((n_groups, n_days, k)) if keep_weights and n_pairs == 1 else None
    run = FilterRun(data.target.new_zeros((n_pairs, n_groups, n_days, n_rows)), data.target.new_zeros((n_pairs, n_groups)),
                    weights)

    def step(start: int, size: int) -> None:
        groups = slice(start, start + size)
        inputs, target, update = (t[groups].to(device) for t in (data.inputs, data.target, data.update))
        state = FilterState.initial(data.theta0[groups].to(device).repeat(n_pairs, 1), p0.repeat_interleave(size))
        for segment, days in (("burn_in", slice(0, split_day)), ("adaptation", slice(split_day, n_days))):
            began = time.perf_counter()
            kept = None if weights is None else inputs.new_zeros((1, size, days.stop - days.start, k))
            forecast = kalman_filter(inputs[:, days], target[:, days], update[:, days], q, state, kept)
            run.forecast[:, groups, days] = forecast.cpu()
            if kept is not None:
                weights[groups, days] = kept[0].cpu()
            run.seconds[segment] += time.perf_counter() - began
        run.sigma2[:, groups] = state.sigma2.view(n_pairs, size).cpu()

    run.groups = loop.run(step, n_groups, chunk, "kalman", cost)
    return run


def slot_rmse(forecast: torch.Tensor, target: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """(C,) the RMSE of each pair's forecast (C, G, T, R) over the ``scored`` slots (G, T, R) bool."""
    error = (forecast - target.unsqueeze(0))[:, scored]
    return error.pow(2).mean(dim=1).sqrt()
