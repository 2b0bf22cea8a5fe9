"""Each mode's prediction intervals (`tamrun.fit.intervals`): which residuals calibrate them, and their scores.

    mode=run: fixed bands from the validation split's residuals (else the training rows'), scored on
              every split and stored with the logged model (its served output carries them)
    day-ahead modes (adaptive, aggregate): the calibration period's day-ahead residuals, then online
              (or fixed) over the test days; scored beside a naive baseline: the static model's
              training-residual quantiles around the same forecast (``*_naive`` metrics)
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.config.schema import Config, IntervalMethod, ModeName
from tamrun.data.batch import GroupedBatch
from tamrun.fit.intervals import GroupBands, calibrate, interval_metrics, online_bands
from tamrun.pipeline import Fit

log = logging.getLogger(__name__)


def method_of(config: Config) -> IntervalMethod:
    """intervals.method, ``auto`` resolved: online for the day-ahead modes, fixed for a run."""
    method = config.intervals.method
    if method != IntervalMethod.auto:
        return method
    return IntervalMethod.online if config.mode.name in (ModeName.adaptive, ModeName.aggregate) else IntervalMethod.fixed


def row_groups(batch: GroupedBatch) -> np.ndarray:
    """The group index (n,) of each real row of ``batch``, in the order `tamrun.fit.evaluate.scored` gives them."""
    return np.nonzero(batch.row_index >= 0)[0]


def batch_bands(config: Config, batch: GroupedBatch, predicted: torch.Tensor) -> Optional[GroupBands]:
    """Fixed bands calibrated on the residuals of ``batch``'s real rows (``predicted``: (G, N)); None
    without intervals.levels."""
    levels = list(config.intervals.levels)
    if not levels:
        return None
    residuals, codes = batch_residuals(batch, predicted)
    return calibrate(residuals, codes, len(batch.groups), levels, config.intervals.min_group_rows)


def batch_residuals(batch: GroupedBatch, predicted: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
    """(residuals ``y - f``, group index) (n,) of ``batch``'s real rows (``predicted``: (G, N))."""
    real = batch.row_index >= 0
    return batch.y.cpu().numpy()[real] - predicted.cpu().numpy()[real], row_groups(batch)


def residual_bands(config: Config, residuals: np.ndarray, labels: np.ndarray, groups: list) -> Optional[GroupBands]:
    """Fixed bands of a model whose groups are ``groups`` (in its order), calibrated on ``residuals`` (n,) of
    the groups ``labels`` (n,) (another fit's held-out rows: `tamrun.jobs.refit`); a group without rows there
    takes every row's quantiles. None without intervals.levels."""
    levels = list(config.intervals.levels)
    if not levels:
        return None
    codes = pd.Index(groups).get_indexer(labels)
    known = codes >= 0  # every held-out group is the model's (its rows are among the model's)
    return calibrate(residuals[known], codes[known], len(groups), levels, config.intervals.min_group_rows)


def naive_bands(config: Config, static: Fit) -> Optional[GroupBands]:
    """The naive baseline: the static model's training-residual quantiles (`batch_bands` of its fit's rows)."""
    return batch_bands(config, static.train, static.predict(static.train, "train"))


def day_ahead_bands(config: Config, table: pd.DataFrame, forecast: str, history: pd.DataFrame,
                    naive: Optional[GroupBands], groups: list, suffix: str = "test"
                    ) -> Tuple[pd.DataFrame, Dict[str, float]]:
    """``table`` (date, group, actual, ``forecast``: a day-ahead mode's test forecasts) with its intervals'
    columns, and their metrics beside the naive baseline's (``*_<suffix>_naive``). ``history`` (date, group,
    residual): the calibration period's day-ahead residuals; ``groups``: the static model's, in its order."""
    levels = list(config.intervals.levels)
    if not levels:
        return table, {}
    settings, actual = config.intervals, table["actual"].to_numpy(dtype=np.float64)
    predicted = table[forecast].to_numpy(dtype=np.float64)
    codes = pd.Index(groups).get_indexer(table["group"])
    if history.empty and naive is not None:  # no day-ahead forecast before the test days: the naive baseline
        log.info("intervals: no day-ahead forecast before the test period to calibrate on (a validation period "
                 "gives one): the static model's training-residual quantiles")
        bands = naive.columns(predicted, codes)
    elif method_of(config) == IntervalMethod.online:
        bands = online_bands(history, table, forecast, levels, settings.window_days, settings.gamma)
    else:
        history_codes = pd.Index(groups).get_indexer(history["group"])
        fixed = calibrate(history["residual"].to_numpy(dtype=np.float64), history_codes, len(groups), levels,
                          settings.min_group_rows)
        bands = fixed.columns(predicted, codes)
    metrics = interval_metrics(actual, bands, levels, suffix)
    if naive is not None:
        metrics.update({f"{name}_naive": value for name, value in
                        interval_metrics(actual, naive.columns(predicted, codes), levels, suffix).items()})
    return table.assign(**bands), metrics


def residual_history(table: pd.DataFrame, forecast: str) -> pd.DataFrame:
    """(date, group, residual) of ``table``'s rows: ``actual - forecast``."""
    return pd.DataFrame({"date": table["date"].to_numpy(), "group": table["group"].to_numpy(),
                         "residual": table["actual"].to_numpy(dtype=np.float64) - table[forecast].to_numpy(dtype=np.float64)})
