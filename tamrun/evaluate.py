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
