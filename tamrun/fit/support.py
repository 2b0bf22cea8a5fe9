"""What a fitted model's training data supports, kept with the model as data (its state's tensors and JSON).

    TrainingSupport = the feature columns checked + per group and column the lowest and highest training
                      value (G, C) + the training target's median and spread (`tamrun.fit.evaluate.support`)

A served forecast (`tamrun.tracking.serve_inputs`) is held to a run's standard with it: a row whose feature
lies beyond its group's training range by more than `SUPPORT_MARGIN` times that range's span is refused,
and so is a forecast farther from the training target's median than a run accepts (`SUPPORT_FACTOR`
spreads: `tamrun.fit.evaluate.unsupported_groups`). In the design's own coordinates (`RangeScaler`: -1 .. 1
over a group's training range) the accepted rows are those within -2 .. 2. A feature a group saw constant
in training accepts that value only: the model never saw it vary there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

from tamrun.data.batch import GroupedBatch, feature_ranges
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign
from tamrun.fit.evaluate import SUPPORT_FACTOR, support

# How far beyond either end of a group's training range of a feature a served row may lie, as a fraction of
# that range's span (0.5: trained on 0 .. 6, a row accepts -3 .. 9; a time index trained on 10 years reaches
# 5 years ahead).
SUPPORT_MARGIN = 0.5


def numeric_columns(design: AdditiveDesign, group: Optional[str]) -> List[str]:
    """The design's columns read as numbers: all but the group column and the categorical effects' columns
    (their levels are checked as levels: an unseen one is refused by name)."""
    levels = {effect.column for effect in design.effects if isinstance(effect, CategoricalEffect)}
    return [column for column in design.columns if column != group and column not in levels]


@dataclass
class TrainingSupport:
    """The training data's support (module doc): ``low`` and ``high`` (G, C) float64 on the host, the
    groups in the model's order, the columns ``columns``."""

    columns: List[str]
    low: torch.Tensor
    high: torch.Tensor
    target_center: float
    target_spread: float

    def accepted(self, codes: np.ndarray, column: str) -> Tuple[np.ndarray, np.ndarray]:
        """(lowest, highest) value accepted (n,) in ``column`` for rows of the groups ``codes`` (n,): the
        group's training range widened by `SUPPORT_MARGIN` of its span each side."""
        j = self.columns.index(column)
        low, high = self.low[:, j].numpy()[codes], self.high[:, j].numpy()[codes]
        margin = SUPPORT_MARGIN * (high - low)
        return low - margin, high + margin

    def far_forecasts(self, predicted: np.ndarray) -> np.ndarray:
        """Where ``predicted`` (n,) lies farther than `SUPPORT_FACTOR` spreads from the training target's
        median, or is not finite (n,) bool: forecasts a run does not accept."""
        distance = np.abs(np.asarray(predicted, dtype=np.float64) - self.target_center)
        return ~(distance <= SUPPORT_FACTOR * self.target_spread)


def training_support(design: AdditiveDesign, train: GroupedBatch, group: Optional[str]) -> TrainingSupport:
    """The support of the training batch ``train`` (its columns the design's) for the model of ``design``."""
    columns = numeric_columns(design, group)
    index = [train.columns.index(column) for column in columns]
    low, high = feature_ranges(train)
    real = (train.weight > 0).cpu().numpy()
    center, spread = support(train.y.cpu().numpy()[real])
    return TrainingSupport(columns, low[:, index].cpu().double(), high[:, index].cpu().double(), center, spread)
