"""The aggregation's choice on the validation period, then its one run through the test period.

    candidates: aggregate.rules x (EWA: aggregate.eta; ML-Poly: none) x aggregate.gradient x aggregate.per_group
    each candidate runs over the validation days only (the experts' validation forecasts; every eta of one
    (rule, gradient, per_group) in one batched recursion) -> its validation RMSE -> the lowest is chosen
    -> the chosen candidate runs over the validation days and on through the test days (its validation days
       are those of its selection run: no day's weights read a later day)
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pandas as pd
import torch

from tamrun.aggregate.grid import SeriesGrid, series_grid
from tamrun.aggregate.rules import Aggregation, aggregate
from tamrun.config.schema import AggregateConfig, AggregationRule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One setting of the aggregation: its rule, EWA's learning rate (None for ML-Poly), whether it learns
    from linearised losses, and whether each group has its own weights."""

    rule: AggregationRule
    eta: Optional[float]
    gradient: bool
    per_group: bool

    @property
    def label(self) -> str:
        eta = f" eta={self.eta:g}" if self.eta is not None else ""
        return (f"{self.rule.value}{eta}, {'gradient' if self.gradient else 'squared'} losses, "
                f"{'per group' if self.per_group else 'shared'} weights")

    def as_dict(self) -> Dict[str, object]:
        return {"rule": self.rule.value, "eta": self.eta, "gradient": self.gradient, "per_group": self.per_group}


def candidates(settings: AggregateConfig) -> List[List[Candidate]]:
    """The candidates in batches: one batch per (rule, gradient, per_group), EWA's etas together."""
    batches = []
    for rule, gradient, per_group in itertools.product(settings.rules, settings.gradient, settings.per_group):
        etas = [float(eta) for eta in settings.eta] if rule == AggregationRule.ewa else [None]
        batches.append([Candidate(rule, eta, gradient, per_group) for eta in etas])
    return batches


def run_batch(grid: SeriesGrid, batch: List[Candidate], days: int, scale: float, device: torch.device) -> Aggregation:
    """The batch's candidates over the first ``days`` days of ``grid`` on ``device``; results on the host.
    Run under `DeviceManager.serial` (a recursion of small operations)."""
    first = batch[0]
    parameters = torch.tensor([c.eta if c.eta is not None else 0.0 for c in batch], dtype=grid.forecasts.dtype,
                              device=device)
    forecasts, target, observed = (t[:, :days].to(device) for t in (grid.forecasts, grid.target, grid.observed))
    out = aggregate(forecasts, target, observed, first.rule, parameters, first.gradient, scale)
    return Aggregation(out.weights.cpu(), out.forecast.cpu(), out.regret.cpu(), out.squares.cpu())


def slot_scores(grid: SeriesGrid, forecast: torch.Tensor, days: int) -> List[float]:
    """(C,) RMSE of each candidate's forecast (C, B, T', R) over the observed slots of the first ``days`` days."""
    observed = grid.observed[:, :days]
    error = (forecast[:, :, :days] - grid.target[:, :days].unsqueeze(0))[:, observed]
    return error.square().mean(dim=1).sqrt().tolist()


@dataclass
class Selection:
    """Every candidate's validation RMSE and the chosen one."""

    scores: Dict[Candidate, float]
    chosen: Candidate

    @property
    def score(self) -> float:
        """The chosen candidate's validation RMSE."""
        return self.scores[self.chosen]

    def as_dict(self) -> Dict[str, object]:
        return {"candidates": [{**c.as_dict(), "rmse_validation": s} for c, s in self.scores.items()],
                "chosen": self.chosen.as_dict(), "rmse_validation": self.scores[self.chosen]}


def select(table: pd.DataFrame, experts: List[str], settings: AggregateConfig, test_start: pd.Timestamp, scale: float,
           device: torch.device, dtype: torch.dtype) -> Selection:
    """Every candidate over the validation days of ``table`` (the rows before ``test_start``); the lowest RMSE wins."""
    validation = table[table["date"] < test_start]
    scores: Dict[Candidate, float] = {}
    grids = {per_group: series_grid(validation, experts, per_group, dtype) for per_group in set(settings.per_group)}
    for batch in candidates(settings):
        grid = grids[batch[0].per_group]
        out = run_batch(grid, batch, len(grid.days), scale, device)
        scores.update(zip(batch, slot_scores(grid, out.forecast, len(grid.days))))
    chosen = min(scores, key=lambda c: scores[c])
    log.debug("aggregate: experts %s, validation RMSE %s: %s chosen (%.5g)", ", ".join(experts),
              ", ".join(f"{s:.5g}" for s in scores.values()), chosen.label, scores[chosen])
    return Selection(scores, chosen)


@dataclass
class Combined:
    """The chosen candidate over every day: ``forecast`` (n,) and ``weights`` (n, K) of each table row,
    ``daily`` (T, K) the weights of each day averaged over the series, ``days`` (T,)."""

    forecast: np.ndarray
    weights: np.ndarray
    daily: np.ndarray
    days: np.ndarray
    aggregation: Aggregation


def combine(table: pd.DataFrame, experts: List[str], chosen: Candidate, scale: float, device: torch.device,
            dtype: torch.dtype) -> Combined:
    """The chosen candidate over every row of ``table`` (validation, then test)."""
    grid = series_grid(table, experts, chosen.per_group, dtype)
    out = run_batch(grid, [chosen], len(grid.days), scale, device)
    return Combined(grid.rows(out.forecast[0]), out.weights[0][grid.series, grid.day].numpy(),
                    out.weights[0].mean(dim=0).numpy(), grid.days, out)
