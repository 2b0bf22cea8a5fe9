"""The fit/predict pipeline as plain functions, shared by the runner and the benchmark.

    load_splits(config, specs)            -> (train frame, test frame)
    fit_model(config, specs, train, dev)  -> FittedModel   (batch, design, oracle plan, dispatcher fit)
    FittedModel.predict_frame(frame)      -> predictions table
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import pandas as pd
import torch

from tamrun.config.schema import Config, DType
from tamrun.data.batch import GroupedBatch, build_batch
from tamrun.data.checks import apply_nan_policy, check_table
from tamrun.data.derive import add_derived_columns
from tamrun.data.load import load_table
from tamrun.data.split import split_by_date
from tamrun.device import DeviceManager
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign, needed_columns
from tamrun.effects.registry import build_effects
from tamrun.errors import DataError
from tamrun.evaluate import predictions_table
from tamrun.memory.footprint import ProblemSize
from tamrun.memory.guard import OomLog, oom_settings
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.memory.units import parse_size
from tamrun.solve.dispatcher import Dispatcher, FitStats

log = logging.getLogger(__name__)

DTYPES = {DType.float64: torch.float64, DType.float32: torch.float32}


def load_splits(config: Config, specs: Dict[str, Any]) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Load the table, add derived columns, check the used columns, apply the NaN policy, split."""
    data = config.data
    frame = add_derived_columns(load_table(data), data.derived, data.date_column)
    numeric = {"data.target": data.target}
    numeric.update({f"model.effects.{name}.column": spec.column for name, spec in specs.items()})
    check_table(frame, numeric, {"data.group": data.group} if data.group else {})
    frame = apply_nan_policy(frame, numeric, data.nan_policy)
    return split_by_date(frame, config.split, data.date_column)


@dataclass
class FittedModel:
    """Coefficients ``coef`` (G, D) of the groups ``groups`` and what is needed to predict."""

    config: Config
    design: AdditiveDesign
    dispatcher: Dispatcher
    groups: list
    coef: torch.Tensor
    plan: Plan
    stats: FitStats
    train: GroupedBatch

    def batch(self, frame: pd.DataFrame) -> GroupedBatch:
        """Arrange new rows as a batch of the fitted groups (unseen levels or groups: DataError)."""
        for effect in self.design.effects:
            if isinstance(effect, CategoricalEffect):
                unseen = effect.unseen_levels(frame[effect.column].to_numpy())
                if unseen:
                    raise DataError(f"model.effects.{effect.name}.column", effect.column,
                                    f"level(s) {unseen[:5]} appear in the rows to predict but never in training",
                                    "train on a period that contains every level, or merge rare levels")
        data = self.config.data
        return build_batch(frame, self.design.columns, data.target, data.group, self.train.x.dtype, groups=self.groups)

    def predict_frame(self, frame: pd.DataFrame, split: str) -> pd.DataFrame:
        """Predictions table (date, group, split, actual, predicted) for the rows of ``frame``."""
        batch = self.batch(frame)
        predicted = self.dispatcher.predict(batch, self.coef)
        data = self.config.data
        return predictions_table(frame, batch, predicted, data.date_column, data.group, split)


def fit_model(config: Config, specs: Dict[str, Any], train_frame: pd.DataFrame, devices: DeviceManager,
              oom_log: Optional[OomLog] = None, n_predict_rows: Optional[int] = None) -> FittedModel:
    """Batch the training rows, fit the design, plan the memory and solve every group."""
    dtype = DTYPES[config.dtype]
    data = config.data
    effects = build_effects(specs)
    columns = needed_columns(effects)
    train = build_batch(train_frame, columns, data.target, data.group, dtype)
    design = AdditiveDesign(effects, columns, config.model.intercept, config.model.intercept_ap).fit(train)
    smallest = int(train.counts.min())
    if smallest < design.width:
        group = train.groups[int(train.counts.argmin())]
        raise DataError("data.group", data.group, f"group {group!r} has {smallest} training rows, fewer than the "
                        f"model's {design.width} coefficients", "train on a longer period, or use fewer/smaller effects")
    design.to(devices.device)
    size = ProblemSize(n_groups=len(train.groups), n_rows=train.x.shape[1], width=design.width,
                       n_features=len(columns), itemsize=torch.finfo(dtype).bits // 8)
    oracle = MemoryOracle(config.memory, parse_size(config.memory.limit), on_gpu=devices.kind != "cpu")
    plan = oracle.plan(size, devices.memory().free, config.solver.name.value,
                       n_predict_rows=max(size.n_rows, n_predict_rows or 0))
    dispatcher = Dispatcher(design, devices, plan, config.solver, oom_settings(config.memory.oom),
                            oom_log if oom_log is not None else OomLog())
    log.info("fitting %d groups, D=%d, route=%s", size.n_groups, size.width, plan.route)
    coef, stats = dispatcher.fit(train)
    return FittedModel(config, design, dispatcher, train.groups, coef, plan, stats, train)
