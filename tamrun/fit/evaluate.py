"""Forecast metrics: RMSE and MAPE per split, overall and per group, and the predictions table."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.data.batch import GroupedBatch
from tamrun.errors import NumericalError
from tamrun.fit.intervals import GroupBands

log = logging.getLogger(__name__)


def predictions_table(frame: pd.DataFrame, batch: GroupedBatch, predicted: torch.Tensor, date_column: str,
                      group: str | None, split: str, bands: Optional[GroupBands] = None) -> pd.DataFrame:
    """One row per real row of the split: date, group, split, actual, predicted and, with ``bands``, each
    level's interval (lower_80, upper_80, ...), sorted by date and group."""
    real = batch.row_index >= 0
    rows = batch.row_index[real]
    actual, predicted_rows = scored(batch, predicted)
    table = pd.DataFrame({
        "date": frame[date_column].to_numpy()[rows],
        "group": frame[group].to_numpy()[rows] if group else 0,
        "split": split,
        "actual": actual,
        "predicted": predicted_rows,
        **(bands.columns(predicted_rows, np.nonzero(real)[0]) if bands is not None else {}),
    })
    return table.sort_values(["date", "group"], kind="stable").reset_index(drop=True)


def rmse(actual: np.ndarray, predicted: np.ndarray) -> float:
    """sqrt(mean((y - yhat)^2)), computed as s sqrt(mean(((y - yhat) / s)^2)) with s = max |y - yhat|
    so that no square overflows (a target near 1e200 has a finite RMSE)."""
    error = np.asarray(actual, dtype=np.float64) - np.asarray(predicted, dtype=np.float64)
    scale = float(np.max(np.abs(error))) if error.size else 0.0
    if scale == 0.0 or not np.isfinite(scale):
        return scale if error.size else float("nan")
    return float(scale * np.sqrt(np.mean((error / scale) ** 2)))


def mape(actual: np.ndarray, predicted: np.ndarray) -> float:
    """100 * mean(|y - yhat| / |y|) over rows with y != 0 (percent); undefined (NaN) when every y is 0:
    MAPE divides by the target (the RMSE is the measure there)."""
    nonzero = actual != 0
    if not np.any(nonzero):
        return float("nan")
    return float(100.0 * np.mean(np.abs((actual[nonzero] - predicted[nonzero]) / actual[nonzero])))


def undefined_mape(name: str, values: Dict[str, float]) -> bool:
    """Whether ``values[name]`` is a MAPE that is undefined (NaN: every target of its split is 0) rather
    than wrong: its RMSE (``rmse`` + the same suffix) is finite, so the predictions are."""
    rmse_name = "rmse" + name[len("mape"):]
    return name.startswith("mape") and np.isnan(values[name]) and np.isfinite(values.get(rmse_name, np.nan))


def require_finite(values: Dict[str, float], what: str, cause: str) -> None:
    """`NumericalError` naming the first of ``values`` that is not finite (a run that produced one
    never ends FINISHED); an undefined MAPE (`undefined_mape`) is not an error: it is logged as NaN, with a
    warning."""
    undefined = [name for name in values if undefined_mape(name, values)]
    if undefined:
        log.warning("%s undefined (every target of the split is 0, and MAPE divides by it): logged as NaN; the "
                    "RMSE measures the error there", ", ".join(undefined))
    bad = [name for name, value in values.items() if not np.isfinite(value) and name not in undefined]
    if bad:
        raise NumericalError(bad[0], values[bad[0]], f"{what} is not finite ({len(bad)} value(s): "
                             f"{', '.join(bad[:5])})", cause)


# A prediction, or an RMSE, this many times the training target's scale (`target_scale`) is not a forecast:
# six orders of magnitude, far beyond any extrapolation of a fit to that target (a run that makes one fails).
ABSURD_FACTOR = 1e6
TRAINING_BAND = (0.01, 0.99)  # the quantiles of the training target that give its scale (a few absurd values aside)


def target_scale(train_target: np.ndarray) -> float:
    """The size of the training target's values: the larger magnitude of its 1st and 99th percentiles
    (its largest magnitude when both are 0; 1 for a target that is 0 throughout)."""
    values = np.asarray(train_target, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return 1.0
    scale = float(np.max(np.abs(np.quantile(values, TRAINING_BAND))))
    return scale or float(np.max(np.abs(values))) or 1.0


def require_plausible(predictions: Dict[str, np.ndarray], metrics: Dict[str, float], train_target: np.ndarray,
                      cause: str) -> None:
    """`NumericalError` naming the first split whose largest prediction, or the first RMSE, exceeds
    `ABSURD_FACTOR` times the training target's scale: finite, but meaningless (a run that produced one
    never ends FINISHED)."""
    scale = target_scale(train_target)
    found = [("predictions", f"the largest {split} prediction", float(np.max(np.abs(values))))
             for split, values in predictions.items() if np.size(values)]
    found += [(name, "it", value) for name, value in metrics.items() if name.startswith("rmse")]
    for field, what, value in found:
        if value > ABSURD_FACTOR * scale:
            raise NumericalError(field, float(f"{value:.6g}"), f"{what} is more than {ABSURD_FACTOR:g} times the "
                                 f"training target's scale ({scale:.6g}, the larger of its 1st and 99th percentiles): "
                                 "not a forecast", f"look for absurd target values (data.target_outliers=error names "
                                 f"them); {cause}")


# A forecast farther from the training target's median than this many times its spread (`support`) is not
# supported by the training data: no fit of that target extrapolates so far (the issue-44 case, 2 training rows
# per group for 14 coefficients, forecast 1,000 for a target between 19 and 21). A run withholds such groups
# from its forecast and metrics, up to evaluate.max_unsupported_share of them (`tamrun.fit.unsupported`).
SUPPORT_FACTOR = 10.0
SPREAD_FLOOR = 0.1  # of the target's scale: the spread of a target that barely varies


def support(train_target: np.ndarray) -> Tuple[float, float]:
    """(center, spread) of the training target: its median, and the width of its 1st-99th percentile band
    (at least `SPREAD_FLOOR` times its scale, `target_scale`)."""
    values = np.asarray(train_target, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return 0.0, 1.0
    low, high = np.quantile(values, TRAINING_BAND)
    return float(np.median(values)), max(float(high - low), SPREAD_FLOOR * target_scale(values))


def scored(batch: GroupedBatch, predicted: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
    """(actual, predicted) of a split's real rows (N_real,) in batch order: what its metrics need,
    without the predictions table."""
    real = batch.row_index >= 0
    return batch.y.cpu().numpy()[real], predicted.cpu().numpy()[real]


def split_scores(split: str, actual: np.ndarray, predicted: np.ndarray) -> Dict[str, float]:
    """``rmse_<split>``, ``mape_<split>`` of one split."""
    return {f"rmse_{split}": rmse(actual, predicted), f"mape_{split}": mape(actual, predicted)}


@dataclass
class ScoreSums:
    """A split's scores summed over chunks of its rows (a streamed run, `tamrun.jobs.stream`): rows n,
    sum (y - yhat)^2, the rows with y != 0 and their sum |y - yhat| / |y|; `scores` gives `split_scores`'
    rmse = sqrt(sum / n) and mape = 100 sum / rows (equal to the whole split's to rounding)."""

    rows: int = 0
    squares: float = 0.0
    nonzero: int = 0
    relative: float = 0.0

    def add(self, actual: np.ndarray, predicted: np.ndarray) -> None:
        error = np.asarray(actual, dtype=np.float64) - np.asarray(predicted, dtype=np.float64)
        kept = actual != 0
        self.rows += int(error.size)
        self.squares += float(np.sum(error * error))
        self.nonzero += int(np.count_nonzero(kept))
        self.relative += float(np.sum(np.abs(error[kept] / actual[kept])))

    def merge(self, other: "ScoreSums") -> None:
        """Add the rows ``other`` summed (a chunk fitted elsewhere: `tamrun.jobs.shard`)."""
        self.rows += other.rows
        self.squares += other.squares
        self.nonzero += other.nonzero
        self.relative += other.relative

    def scores(self, split: str) -> Dict[str, float]:
        """``rmse_<split>``, ``mape_<split>`` of every row added (NaN: none, or no y != 0 for the MAPE)."""
        rmse_value = float(np.sqrt(self.squares / self.rows)) if self.rows else float("nan")
        mape_value = 100.0 * self.relative / self.nonzero if self.nonzero else float("nan")
        return {f"rmse_{split}": rmse_value, f"mape_{split}": mape_value}


def group_metrics(table: pd.DataFrame) -> pd.DataFrame:
    """RMSE and MAPE per (split, group), sorted by both, as `rmse` and `mape` compute them per part
    (the same scaled RMSE, NaN propagated, MAPE over the non-zero targets), in a few array reductions
    over the rows sorted by part: no Python step per group (a million groups take seconds)."""
    keys = table.groupby(["split", "group"], sort=True)
    part = keys.ngroup().to_numpy()
    order = np.argsort(part, kind="stable")
    part = part[order]
    starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]]) if part.size else np.zeros(0, dtype=np.int64)
    actual = table["actual"].to_numpy(dtype=np.float64)[order]
    error = actual - table["predicted"].to_numpy(dtype=np.float64)[order]
    n = np.diff(np.r_[starts, part.size])
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.maximum.reduceat(np.abs(error), starts) if part.size else np.zeros(0)
        usable = (scale > 0) & np.isfinite(scale)
        ratio = error / np.where(usable, scale, 1.0)[part]
        root = np.sqrt(np.add.reduceat(ratio * ratio, starts) / n) if part.size else np.zeros(0)
        nonzero = actual != 0
        relative = np.where(nonzero, np.abs(error) / np.where(nonzero, np.abs(actual), 1.0), 0.0)
        counted = np.add.reduceat(nonzero.astype(np.int64), starts) if part.size else np.zeros(0)
        summed = np.add.reduceat(relative, starts) if part.size else np.zeros(0)
        mapes = np.where(counted > 0, 100.0 * summed / np.maximum(counted, 1), np.nan)
    index = keys.size().index
    return pd.DataFrame({"split": index.get_level_values("split"), "group": index.get_level_values("group"),
                         "n": n, "rmse": np.where(usable, scale * root, scale), "mape": mapes})
