"""Forecast metrics: RMSE and MAPE per split, overall and per group, and the predictions table."""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.data.batch import GroupedBatch
from tamrun.errors import NumericalError


def predictions_table(frame: pd.DataFrame, batch: GroupedBatch, predicted: torch.Tensor, date_column: str,
                      group: str | None, split: str) -> pd.DataFrame:
    """One row per real row of the split: date, group, split, actual, predicted (frame order)."""
    rows = batch.row_index[batch.row_index >= 0]
    actual, predicted_rows = scored(batch, predicted)
    table = pd.DataFrame({
        "date": frame[date_column].to_numpy()[rows],
        "group": frame[group].to_numpy()[rows] if group else 0,
        "split": split,
        "actual": actual,
        "predicted": predicted_rows,
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
    """100 * mean(|y - yhat| / |y|) over rows with y != 0 (percent)."""
    nonzero = actual != 0
    return float(100.0 * np.mean(np.abs((actual[nonzero] - predicted[nonzero]) / actual[nonzero])))


def require_finite(values: Dict[str, float], what: str, cause: str) -> None:
    """`NumericalError` naming the first of ``values`` that is not finite (a run that produced one
    never ends FINISHED)."""
    bad = [name for name, value in values.items() if not np.isfinite(value)]
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


def scored(batch: GroupedBatch, predicted: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
    """(actual, predicted) of a split's real rows (N_real,) in batch order: what its metrics need,
    without the predictions table."""
    real = batch.row_index >= 0
    return batch.y.cpu().numpy()[real], predicted.cpu().numpy()[real]


def split_scores(split: str, actual: np.ndarray, predicted: np.ndarray) -> Dict[str, float]:
    """``rmse_<split>``, ``mape_<split>`` of one split."""
    return {f"rmse_{split}": rmse(actual, predicted), f"mape_{split}": mape(actual, predicted)}


def group_metrics(table: pd.DataFrame) -> pd.DataFrame:
    """RMSE and MAPE per (split, group)."""
    rows = [{"split": split, "group": group, "n": len(part),
             "rmse": rmse(part["actual"].to_numpy(), part["predicted"].to_numpy()),
             "mape": mape(part["actual"].to_numpy(), part["predicted"].to_numpy())}
            for (split, group), part in table.groupby(["split", "group"], sort=True)]
    return pd.DataFrame(rows)
