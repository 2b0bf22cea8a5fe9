"""The fit pipeline as plain functions, shared by the jobs and the benchmark.

    load_splits(config, specs, table)                   -> Splits (train, test, validation frames, recipe;
                                                           the table the job opened, `tamrun.data.table`)
    build_features(config, specs, train)                -> Features (training batch + fitted design)
    plan_memory(config, features, devices)              -> Plan (the oracle's route and chunks)
    solve(config, features, plan, devices, loop, recipe) -> Fit (the fitted model, its plan and statistics;
                                                           with model.penalties=gcv the penalties are
                                                           chosen first, `tamrun.fit.gcv`)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional, Set, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.config.effects import effect_columns
from tamrun.config.schema import (HISTORY_KINDS, AdaptiveMethod, CheckPolicy, Config, DataConfig, DType, ModeName,
                                  PenaltyMode, TrackingConfig)
from tamrun.data.batch import GroupedBatch, build_batch
from tamrun.data.cells import check_magnitudes
from tamrun.data.chunks import GroupChunk
from tamrun.data.checks import (apply_nan_policy, check_constant_columns, check_constant_in_groups,
                                 check_duplicate_dates, check_table, check_target_leakage, check_target_outliers,
                                 drop_missing_groups, enforce)
from tamrun.data.calendar import Calendar
from tamrun.data.derive import DataRecipe, add_derived_columns, derived_sources
from tamrun.data.history import HistoryTail, reads_history, smooth_ends
from tamrun.data.load import frame_bytes
from tamrun.data.table import Table
from tamrun.data.split import carve_validation, in_periods, split_by_date
from tamrun.device.manager import DeviceManager
from tamrun.effects.crossing import ForestCrossingEffect
from tamrun.effects.design import AdditiveDesign, needed_columns
from tamrun.effects.registry import build_effects
from tamrun.errors import ConfigError, DataError, NumericalError
from tamrun.fit.evaluate import predictions_table
from tamrun.fit.fitted import FittedModel, predict_rows
from tamrun.fit.support import training_support
from tamrun.memory.footprint import ProblemSize, derive_bytes, problem_size, recording_bytes
from tamrun.memory.guard import ChunkLoop, RoomCheck, no_room_check
from tamrun.memory.oracle import MemoryOracle, Plan
from tamrun.machine.placement import HOST
from tamrun.solve.cg import CgCallback, no_cg_progress
from tamrun.fit.dispatcher import Dispatcher
from tamrun.fit.gcv import GcvSelection, select_penalties
from tamrun.solve.stats import FitStats

log = logging.getLogger(__name__)

DTYPES = {DType.float64: torch.float64, DType.float32: torch.float32}


@dataclass
class Splits:
    """The loaded table's splits (validation None without a validation period), its recipe and the table
    they were read from."""

    train: pd.DataFrame
    test: pd.DataFrame
    validation: Optional[pd.DataFrame]
    recipe: DataRecipe
    table: Optional[Table] = None

    def joined(self, rows: pd.DataFrame) -> "Splits":
        """These splits with ``rows`` (training and validation together) as training: a refit's."""
        return Splits(rows, self.test, None, self.recipe, self.table)

    @property
    def n_scored(self) -> int:
        """Rows the run predicts and scores: train, validation and test."""
        return len(self.train) + len(self.test) + (0 if self.validation is None else len(self.validation))


def load_splits(config: Config, specs: Dict[str, Any], room: RoomCheck = no_room_check,
                chunk: Optional[GroupChunk] = None, table: Optional[Table] = None) -> Splits:
    """Read ``table`` (the job's, `tamrun.data.table.Table`; None: opened here), add derived columns, check
    the used columns, apply the NaN policy, split. ``room`` is called before each block of the read and
    each later step (`HostRoomWatch`); ``chunk``: only its groups (a streamed run, `tamrun.jobs.stream`)."""
    data = config.data
    numeric = model_columns(config, specs)
    table = Table.open(data) if table is None else table
    loaded = table.read(*file_columns(data, numeric), room=room, window=table.window(config.split), chunk=chunk)
    frame = loaded.frame
    room("deriving the data", "derive", derive_bytes(len(frame), len(data.derived)))
    calendar = Calendar.of(data, frame[data.date_column])
    origin = loaded.origin if loaded.origin is not None else frame[data.date_column].min()  # before any row is dropped
    frame = add_derived_columns(frame, data.derived, data.date_column, origin, calendar, data.group)
    room("checking the data", "check", frame_bytes(frame))
    if reads_history(data.derived):  # the rows outside the periods were read as history only
        frame = frame[in_periods(frame, config.split, data.date_column, data.timezone).to_numpy()]
    check_table(frame, numeric, data.group, data.date_column)
    frame = apply_nan_policy(frame, numeric, data.nan_policy, history_hints(data))
    check_magnitudes(frame, {f: c for f, c in numeric.items() if f != "data.target"}, data.date_column, data.group)
    frame = drop_missing_groups(frame, data.group, data.nan_policy)
    check_duplicate_dates(frame, data.date_column, data.group, data.duplicate_dates, data.timezone)
    frame = check_target_outliers(frame, data.target, data.date_column, data.group, data.target_outliers)
    check_target_leakage(frame, effect_columns(specs), data.target)
    recipe = DataRecipe(dict(data.derived), data.date_column, data.target, data.group, origin, data.date_format,
                        data.dayfirst, calendar, HistoryTail.of(frame, data.derived, data.date_column, data.group),
                        smooth_ends(frame, data.derived, data.date_column, data.group, calendar.timezone))
    room("splitting the data", "split", frame_bytes(frame))
    train, test = split_by_date(frame, config.split, data.date_column, data.timezone)
    check_constant_columns(train, effect_columns(specs), data.constant_features)
    check_constant_in_groups(train, effect_columns(specs), data.group, data.constant_in_group)
    train, validation = carve_validation(train, config.split, data.date_column, data.timezone)
    return Splits(train, test, validation, recipe, table)


def history_hints(data: DataConfig) -> Dict[str, str]:
    """The fix a NaN of each history column calls for: its rows before the reach of the first one have none."""
    return {name: f"data.derived.{name} reads earlier rows, and these rows have none (the first rows of a group, "
                  "a gap, the hour after a skipped one): set data.nan_policy=drop to drop them, or start "
                  "split.train_start later"
            for name, spec in data.derived.items() if spec.kind in HISTORY_KINDS}


def model_columns(config: Config, specs: Dict[str, Any]) -> Dict[str, str]:
    """The numeric columns a run reads (config field -> column): the target, the effects' columns, the
    columns adaptive.kalman.skip_updates reads."""
    return {"data.target": config.data.target, **effect_columns(specs), **skip_update_columns(config)}


def read_columns(config: Config, specs: Dict[str, Any]) -> Set[str]:
    """The columns a run reads from the file for sure: the date and `file_columns`' required ones."""
    required, _ = file_columns(config.data, model_columns(config, specs))
    return {config.data.date_column, *required.values()}


def skip_update_columns(config: Config) -> Dict[str, str]:
    """The columns adaptive.kalman.skip_updates reads (config field -> column), when the run filters."""
    if config.mode.name != ModeName.adaptive or config.adaptive.method != AdaptiveMethod.kalman:
        return {}
    return {f"adaptive.kalman.skip_updates[{i}]": column for i, column in enumerate(config.adaptive.kalman.skip_updates)}


def file_columns(data: DataConfig, numeric: Dict[str, str]) -> Tuple[Dict[str, str], Set[str]]:
    """The columns a run reads from the file: (config field -> column that must exist: the target, the
    group unless it is derived, the effects' columns that are not derived, the derived columns' sources; the
    names a derived expression mentions, read when present)."""
    sources, mentioned = derived_sources(data.derived)
    required = {field: column for field, column in numeric.items() if column not in data.derived}
    if data.group and data.group not in data.derived:  # a derived group is read from the date (data.derived)
        required["data.group"] = data.group
    return {**required, **sources}, mentioned


@dataclass
class Features:
    """The training batch and the design fitted on it."""

    train: GroupedBatch
    design: AdditiveDesign


def build_features(config: Config, specs: Dict[str, Any], train_frame: pd.DataFrame,
                   room: RoomCheck = no_room_check) -> Features:
    """Batch the training rows and fit the design (per-group ranges, categorical levels)."""
    data = config.data
    effects = build_effects(specs, config.seed)
    columns = needed_columns(effects)
    train = build_batch(train_frame, columns, data.target, data.group, DTYPES[config.dtype])
    widest = max((len(effect.columns) for effect in effects), default=0)  # the design is fitted one effect at a time
    room("fitting the design", "design", train.x.nbytes * (widest + 1) // max(1, train.x.shape[-1]))
    design = AdditiveDesign(effects, columns, config.model.intercept, config.model.intercept_ap).fit(train)
    smallest = int(train.counts.min())
    if smallest < design.width:  # solvable (the penalty fixes the directions the data leave free)
        group = train.groups[int(train.counts.argmin())]
        which = f"group {data.group}={group!r}" if data.group else "the table"
        problem = (f"{which} has {smallest} training row(s) for {design.width} coefficients: the penalties decide "
                   "the rest")
        if any(isinstance(effect, ForestCrossingEffect) for effect in effects) and \
                data.small_groups == CheckPolicy.warn:  # a forest crossing's design: nothing is wrong, nothing to warn of
            log.info("%s (by design: a forest crossing has more coefficients than rows)", problem)
        else:
            enforce(data.small_groups, "data.small_groups", DataError(
                "data.group", data.group, problem, "train on more rows, group more coarsely, use a smaller model"))
    return Features(train, design)


def plan_memory(config: Config, features: Features, devices: DeviceManager, n_predict_rows: int = 0,
                n_scored_rows: int = 0) -> Plan:
    """The oracle's plan for this problem on this device under memory.limit. On the CPU what the
    recording will add after the fit (`recording_reserve`) is kept free beside the safety margin."""
    oracle = MemoryOracle(config.memory, config.memory.limit_bytes, on_gpu=devices.kind != "cpu",
                          direct_max_dim=config.solver.direct_max_dim)
    size = run_problem_size(config, features, n_predict_rows)
    view = devices.memory(config.memory.safety_margin_bytes,
                          recording_reserve(config.tracking, n_scored_rows, len(config.intervals.levels)))
    return oracle.plan(size, view.free, config.solver.name.value, config.solver.dual, view.held, view.bound,
                       select=config.model.penalties == PenaltyMode.gcv)


def run_problem_size(config: Config, features: Features, n_predict_rows: int = 0) -> ProblemSize:
    """The problem the oracle plans: the training batch's groups and rows, the design, the dtype's bytes."""
    train = features.train
    return problem_size(len(train.groups), train.x.shape[1], features.design, train.x.element_size(), config.solver,
                        n_predict_rows)


def recording_reserve(tracking: TrackingConfig, n_scored_rows: int, levels: int = 0) -> int:
    """Bytes a fitted run's recording adds (`recording_bytes`): the predictions table of ``n_scored_rows``
    rows (with ``levels`` intervals) when its CSV or the plots are logged, the plots, the model; nothing
    when tracking is off."""
    on = tracking.enabled
    return recording_bytes(n_scored_rows, on and (tracking.log_predictions or tracking.log_plots),
                           on and tracking.log_plots, on and tracking.log_model, levels)


def warm_start_coefficients(path: str, groups: list, width: int) -> torch.Tensor:
    """(G, D) float64 coefficients from a run's ``fit/coefficients.csv`` (column ``group``, then one
    column per coefficient), in the order of ``groups``; `ConfigError` naming solver.warm_start when
    the file is unreadable or does not match this model's groups and width."""
    field = "solver.warm_start"
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise ConfigError(field, path, f"cannot read the coefficients ({error})",
                          "give the path of a coefficients.csv logged by an earlier run (artifact fit/)")
    if "group" not in table.columns or table.shape[1] - 1 != width:
        raise ConfigError(field, path, f"the table has {table.shape[1] - 1} coefficient columns, this model has {width}",
                          "warm-start from a run of the same model (same effects and sizes)")
    rows = {str(group): i for i, group in enumerate(table["group"])}
    missing = [g for g in groups if str(g) not in rows]
    if missing:
        raise ConfigError(field, path, f"group(s) {missing[:5]} are not in the table",
                          "warm-start from a run on the same data and groups")
    try:
        values = table.drop(columns="group").to_numpy(dtype="float64")[[rows[str(g)] for g in groups]]
    except ValueError:
        raise ConfigError(field, path, "the coefficient columns hold values that are not numbers",
                          "warm-start from a coefficients.csv logged by an earlier run") from None
    if not np.isfinite(values).all():
        raise ConfigError(field, path, "the coefficients hold NaN or infinite values",
                          "warm-start from a run that finished, or set solver.warm_start=null")
    return torch.as_tensor(values)


@dataclass
class Fit:
    """A fit: the model, the plan it followed, its statistics, the training batch, and the device and
    guarded loop its predictions run through."""

    model: FittedModel
    plan: Plan
    stats: FitStats
    train: GroupedBatch
    device: torch.device
    loop: ChunkLoop
    selection: Optional[GcvSelection] = None  # the GCV search that chose the penalties (model.penalties=gcv)

    def predict(self, batch: GroupedBatch, split: str = "") -> torch.Tensor:
        """Predictions (G, N) on the CPU in the plan's predict chunks, under the fit's guard; their
        progress is named after ``split`` ("predict test")."""
        model, chunk = self.model, self.plan.predict
        return predict_rows(model.design, model.coef, batch.x, self.device, chunk.groups, chunk.rows, batch.weight,
                            self.loop, self.plan.predict_cost, f"predict {split}".strip())

    def predict_split(self, frame: pd.DataFrame, split: str = "") -> Tuple[GroupedBatch, torch.Tensor]:
        """The rows of ``frame`` (the split named ``split``) as a batch and their predictions (G, N)."""
        batch = self.model.batch(frame)
        return batch, self.predict(batch, split)

    def predict_frame(self, frame: pd.DataFrame, split: str) -> pd.DataFrame:
        """Predictions table (date, group, split, actual, predicted) for the rows of ``frame``."""
        recipe = self.model.recipe
        return predictions_table(frame, *self.predict_split(frame, split), recipe.date_column, recipe.group, split)


def numerical_fix(config: Config) -> str:
    """What to change when a fit's numbers are not finite, for this config."""
    if config.dtype == DType.float32:
        return "use dtype=float64 (float32 holds about 7 digits and values up to 3.4e38), or rescale the data"
    return ("raise the penalties that are very small (model.intercept_ap, an effect's ap: a near-singular "
            "system), or rescale the data")


def support_fix(config: Config) -> str:
    """What to change when forecasts lie far outside what the training data supports, for this config."""
    effect = next(iter(config.model.effects), "<name>")
    return (f"raise the penalties (an effect's ap, e.g. model.effects.{effect}.ap, or model.penalties=gcv), use "
            "fewer coefficients (a smaller k or m), or give those groups more training rows (group more coarsely; "
            "data.small_groups=error refuses groups with fewer rows than coefficients)")


def check_coefficients(coef: torch.Tensor, groups: list, config: Config) -> None:
    """`NumericalError` when a group's coefficients (G, D) are not all finite."""
    finite = torch.isfinite(coef).all(dim=1)
    if bool(finite.all()):
        return
    bad = [groups[i] for i in (~finite).nonzero().flatten().tolist()]
    raise NumericalError("model", config.model.name, f"the fit's coefficients are not finite for {len(bad)} of "
                         f"{len(groups)} group(s) (e.g. {bad[:5]})", numerical_fix(config))


def solve(config: Config, features: Features, plan: Plan, devices: DeviceManager, loop: ChunkLoop,
          recipe: DataRecipe, on_iteration: CgCallback = no_cg_progress) -> Fit:
    """Fit every group's coefficients along the plan, each chunk through ``loop`` (``on_iteration``:
    CG progress); with model.penalties=gcv the tuned effects' penalties are chosen first and set on the
    design (`select_penalties`, in the plan's `SelectPlan` chunks)."""
    design = features.design.to(devices.device)
    train = features.train
    selection = None
    if config.model.penalties == PenaltyMode.gcv:
        selection = select_penalties(design, train, devices.device, config.solver, config.model.gcv, loop,
                                     plan.select)
    initial = (warm_start_coefficients(config.solver.warm_start, train.groups, design.width)
               if config.solver.warm_start else None)
    dispatcher = Dispatcher(design, devices, plan, config.solver, loop, initial, on_iteration)
    log.info("fitting %d groups, D=%d, route=%s", len(train.groups), design.width, plan.route)
    coef, stats = dispatcher.fit(train)
    check_coefficients(coef, train.groups, config)
    # standalone predictions (the MLflow model, plots) in the group chunk the fit kept: it fitted in memory
    model = FittedModel(design, coef, train.groups, recipe, train.x.dtype, stats.group_chunk, plan.predict.rows,
                        support=training_support(design, train, recipe.group)).to(HOST)
    return Fit(model, plan, stats, train, devices.device, loop, selection)


def fit_model(config: Config, specs: Dict[str, Any], splits: Splits, devices: DeviceManager, loop: ChunkLoop,
              n_predict_rows: int = 0) -> Fit:
    """build_features, plan_memory and solve in one call (the benchmark's fit)."""
    features = build_features(config, specs, splits.train)
    return solve(config, features, plan_memory(config, features, devices, n_predict_rows), devices, loop,
                 splits.recipe)

