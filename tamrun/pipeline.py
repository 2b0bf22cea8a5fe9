"""The fit/predict pipeline as plain functions, shared by the runner and the benchmark.

    load_splits(config, specs)                 -> (train frame, test frame)
    build_features(config, specs, train)       -> Features (training batch + fitted design)
    plan_memory(config, features, devices)     -> Plan (the oracle's route and chunks)
    solve(config, features, plan, devices)     -> FittedModel (the dispatcher's fit)
    FittedModel.predict_frame(frame)           -> predictions table
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import pandas as pd
import torch

from tamrun.config.effects import effect_columns
from tamrun.config.schema import Config, DType, SolverConfig
from tamrun.data.batch import GroupedBatch, build_batch
from tamrun.data.checks import (apply_nan_policy, check_constant_columns, check_duplicate_dates, check_table,
                                 drop_missing_groups, enforce)
from tamrun.data.derive import add_derived_columns
from tamrun.data.load import load_table
from tamrun.data.split import split_by_date
from tamrun.device import DeviceManager
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign, needed_columns
from tamrun.effects.registry import build_effects
from tamrun.errors import ConfigError, DataError
from tamrun.evaluate import predictions_table
from tamrun.memory.footprint import ProblemSize, kernel_build_bytes
from tamrun.memory.guard import OomLog, oom_settings
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.memory.tracker import MemoryTracker
from tamrun.memory.units import parse_size
from tamrun.solve.dispatcher import Dispatcher, FitStats
from tamrun.solve.dual import count_dtype

log = logging.getLogger(__name__)

DTYPES = {DType.float64: torch.float64, DType.float32: torch.float32}


def load_splits(config: Config, specs: Dict[str, Any]) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """Load the table, add derived columns, check the used columns, apply the NaN policy, split."""
    data = config.data
    frame = add_derived_columns(load_table(data), data.derived, data.date_column)
    numeric = {"data.target": data.target}
    numeric.update(effect_columns(specs))
    check_table(frame, numeric, {"data.group": data.group} if data.group else {})
    frame = apply_nan_policy(frame, numeric, data.nan_policy)
    frame = drop_missing_groups(frame, data.group, data.nan_policy)
    check_duplicate_dates(frame, data.date_column, data.group, data.duplicate_dates)
    train, test = split_by_date(frame, config.split, data.date_column)
    check_constant_columns(train, effect_columns(specs), data.constant_features)
    return train, test


def prediction_batch(config: Config, design: AdditiveDesign, groups: list, frame: pd.DataFrame,
                     dtype: torch.dtype) -> GroupedBatch:
    """Rows to predict as a batch of the training groups; a categorical level or a group unseen in
    training raises `DataError`."""
    for effect in design.effects:
        if isinstance(effect, CategoricalEffect):
            unseen = effect.unseen_levels(frame[effect.column].to_numpy())
            if unseen:
                raise DataError(f"model.effects.{effect.name}.column", effect.column,
                                f"level(s) {unseen[:5]} appear in the rows to predict but never in training",
                                "train on a period that contains every level, or merge rare levels")
    data = config.data
    return build_batch(frame, design.columns, data.target, data.group, dtype, groups=groups)


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
        return prediction_batch(self.config, self.design, self.groups, frame, self.train.x.dtype)

    def predict_frame(self, frame: pd.DataFrame, split: str) -> pd.DataFrame:
        """Predictions table (date, group, split, actual, predicted) for the rows of ``frame``."""
        batch = self.batch(frame)
        predicted = self.dispatcher.predict(batch, self.coef)
        data = self.config.data
        return predictions_table(frame, batch, predicted, data.date_column, data.group, split)


@dataclass
class Features:
    """The training batch and the design fitted on it."""

    train: GroupedBatch
    design: AdditiveDesign


def build_features(config: Config, specs: Dict[str, Any], train_frame: pd.DataFrame) -> Features:
    """Batch the training rows and fit the design (per-group ranges, categorical levels)."""
    data = config.data
    effects = build_effects(specs, config.seed)
    columns = needed_columns(effects)
    train = build_batch(train_frame, columns, data.target, data.group, DTYPES[config.dtype])
    design = AdditiveDesign(effects, columns, config.model.intercept, config.model.intercept_ap).fit(train)
    smallest = int(train.counts.min())
    if smallest < design.width:  # solvable (the penalty fixes the directions the data leave free)
        group = train.groups[int(train.counts.argmin())]
        enforce(data.small_groups, DataError(
            "data.group", data.group, f"group {group!r} has {smallest} training row(s) for {design.width} "
            "coefficients: the penalties decide the rest", "train on more rows, group more coarsely, use a smaller "
            "model, or set data.small_groups=warn"))
    return Features(train, design)


def problem_size(features: Features, n_predict_rows: int = 0, config: Optional[Config] = None) -> ProblemSize:
    """The sizes the memory oracle plans with."""
    train, design = features.train, features.design
    itemsize = train.x.element_size()
    blocks = 0
    if config is not None and config.solver.preconditioner.value == "block_jacobi":
        blocks = design.dense_width ** 2 if design.dense_width <= config.solver.block_max_dim else 0
        blocks += sum(e.width * e.grid_q for e in design.indexed_effects if e.grid_q > 1)  # R Q^2
    solver = config.solver if config is not None else SolverConfig()
    counts = getattr(torch, solver.dual_counts_dtype.value)
    forests = [(e.slots, e.width // e.grid_q, count_dtype(e.slots, counts).itemsize,
                e.width // e.grid_q > solver.dual_dense_counts_max) for e in design.indexed_effects]
    kernel_build = kernel_build_bytes(train.x.shape[1], itemsize, solver.dual_tile_rows, forests,
                                      solver.dual_scatter_max_leaf_rows)
    return ProblemSize(n_groups=len(train.groups), n_rows=train.x.shape[1], width=design.width, itemsize=itemsize,
                       row=design.row_bytes(itemsize), n_predict_rows=n_predict_rows, preconditioner_elements=blocks,
                       kernel_row=design.kernel_row_bytes(itemsize), kernel_build=kernel_build)


def plan_memory(config: Config, features: Features, devices: DeviceManager, n_predict_rows: int = 0) -> Plan:
    """The oracle's plan for this problem on this device under the configured limit."""
    oracle = MemoryOracle(config.memory, parse_size(config.memory.limit), on_gpu=devices.kind != "cpu")
    return oracle.plan(problem_size(features, n_predict_rows, config), devices.memory().free, config.solver.name.value,
                       config.solver.dual)


def warm_start_coefficients(path: str, groups: list, width: int) -> torch.Tensor:
    """(G, D) float64 coefficients from a run's ``model/coefficients.csv`` (column ``group``, then one
    column per coefficient), in the order of ``groups``; `ConfigError` naming solver.warm_start when
    the file is unreadable or does not match this model's groups and width."""
    field = "solver.warm_start"
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise ConfigError(field, path, f"cannot read the coefficients ({error})",
                          "give the path of a coefficients.csv logged by an earlier run (artifact model/)")
    if "group" not in table.columns or table.shape[1] - 1 != width:
        raise ConfigError(field, path, f"the table has {table.shape[1] - 1} coefficient columns, this model has {width}",
                          "warm-start from a run of the same model (same effects and sizes)")
    rows = {str(group): i for i, group in enumerate(table["group"])}
    missing = [g for g in groups if str(g) not in rows]
    if missing:
        raise ConfigError(field, path, f"group(s) {missing[:5]} are not in the table",
                          "warm-start from a run on the same data and groups")
    values = table.drop(columns="group").to_numpy(dtype="float64")
    return torch.as_tensor(values[[rows[str(g)] for g in groups]])


def solve(config: Config, features: Features, plan: Plan, devices: DeviceManager, oom_log: Optional[OomLog] = None,
          tracker: Optional[MemoryTracker] = None, snapshot: Callable[[str], None] = lambda label: None) -> FittedModel:
    """Fit every group's coefficients along the plan."""
    design = features.design.to(devices.device)
    initial = (warm_start_coefficients(config.solver.warm_start, features.train.groups, design.width)
               if config.solver.warm_start else None)
    dispatcher = Dispatcher(design, devices, plan, config.solver, oom_settings(config.memory.oom),
                            oom_log if oom_log is not None else OomLog(), tracker, snapshot, initial)
    log.info("fitting %d groups, D=%d, route=%s", len(features.train.groups), design.width, plan.route)
    coef, stats = dispatcher.fit(features.train)
    return FittedModel(config, design, dispatcher, features.train.groups, coef, plan, stats, features.train)


def fit_model(config: Config, specs: Dict[str, Any], train_frame: pd.DataFrame, devices: DeviceManager,
              n_predict_rows: int = 0) -> FittedModel:
    """build_features, plan_memory and solve in one call."""
    features = build_features(config, specs, train_frame)
    return solve(config, features, plan_memory(config, features, devices, n_predict_rows), devices)


def max_group_rows(frame: pd.DataFrame, group: Optional[str]) -> int:
    """The largest group's row count in ``frame``."""
    return int(frame.groupby(group).size().max()) if group else len(frame)
