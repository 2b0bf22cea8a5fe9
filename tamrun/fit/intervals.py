"""Prediction intervals from the quantiles of out-of-sample residuals, fixed or updated day by day.

A forecast ``f`` gets, for each level ``p`` (``intervals.levels``, e.g. 0.8 and 0.95), the interval
``[f + q_lo, f + q_hi]`` with ``q_lo``, ``q_hi`` the ``(1 - p) / 2`` and ``(1 + p) / 2`` quantiles of the
residuals ``y - f`` of calibration rows that precede the rows it covers (split conformal prediction, on
signed residuals: a biased forecast gets an asymmetric interval).

- ``fixed`` (`GroupBands`, `calibrate`): one (q_lo, q_hi) per group and level from the calibration rows;
  a group with fewer than ``min_group_rows`` of them takes the quantiles of every group's rows.
- ``online`` (`online_bands`, day-ahead forecasts): day d's quantiles come from the residuals of the
  ``window_days`` days before d (the calibration period's, then each forecast day's once its truth is
  known), at a level adapted by adaptive conformal inference (Gibbs and Candes, 2021):
  ``a_{d+1} = a_d + gamma (1 - p - miss_d)``, ``miss_d`` the share of day d's rows outside its interval,
  ``a_1 = 1 - p``; the quantiles are taken at ``a_d / 2`` and ``1 - a_d / 2`` (``a_d`` clipped to [0, 1]).
  Over T days the share of misses is within ``(1 + gamma) / (gamma T)`` of ``1 - p`` whatever the drift.

Scores (`interval_metrics`), for level p (label ``80`` for 0.8) and split s: ``coverage_80_s``, the
percentage of rows inside; ``width_80_s``, the mean of ``q_hi - q_lo``; ``pinball_s``, the mean pinball
loss over every bound's quantile level tau, ``L_tau(y, q) = max(tau (y - q), (tau - 1) (y - q))``
(a proper score of the quantiles: lower is better).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pandas as pd
import torch


def level_label(level: float) -> str:
    """``80`` for 0.8, ``97.5`` for 0.975: the level in percent, as metric names and columns carry it."""
    return f"{100 * level:.10g}"


def band_columns(level: float) -> Tuple[str, str]:
    """The predictions table's columns of a level's interval: ``lower_80``, ``upper_80``."""
    label = level_label(level)
    return f"lower_{label}", f"upper_{label}"


def quantile_levels(levels: Sequence[float]) -> np.ndarray:
    """(L, 2): the residual quantiles ``(1 - p) / 2`` and ``(1 + p) / 2`` of each level p."""
    p = np.asarray(levels, dtype=np.float64)[:, None]
    return np.concatenate([(1 - p) / 2, (1 + p) / 2], axis=1)


def grouped_quantiles(values: np.ndarray, codes: np.ndarray, n_groups: int, taus: np.ndarray
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """(quantiles (n_groups, *taus.shape), counts (n_groups,)): each group's quantiles of ``values`` (n,)
    at ``taus`` (numpy's default, linear interpolation between order statistics); NaN for an empty group.
    One sort for every group: ``values`` ordered by (code, value), a group's order statistic k at
    ``start_g + k``."""
    order = np.lexsort((values, codes))
    ordered = values[order]
    counts = np.bincount(codes, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = (np.maximum(counts, 1) - 1).reshape(-1, *([1] * taus.ndim)) * taus  # (G, *taus.shape)
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, np.maximum(counts - 1, 0).reshape(below.shape[:1] + (1,) * taus.ndim))
    base = starts.reshape(-1, *([1] * taus.ndim))
    if not ordered.size:
        return np.full((n_groups, *taus.shape), np.nan), counts
    low = ordered[np.minimum(base + below, ordered.size - 1)]
    high = ordered[np.minimum(base + above, ordered.size - 1)]
    out = low + (position - below) * (high - low)
    out[counts == 0] = np.nan
    return out, counts


@dataclass
class GroupBands:
    """Fixed intervals of a fitted model: ``lower`` and ``upper`` (G, L) added to a forecast of group g
    give its interval at ``levels[l]`` (the groups in the fitted model's order; on the host)."""

    levels: List[float]
    lower: torch.Tensor
    upper: torch.Tensor

    def columns(self, predicted: np.ndarray, codes: np.ndarray) -> Dict[str, np.ndarray]:
        """``lower_<p>`` and ``upper_<p>`` of forecasts ``predicted`` (n,) of groups ``codes`` (n,)."""
        lower, upper = self.lower.numpy(), self.upper.numpy()
        out: Dict[str, np.ndarray] = {}
        for index, level in enumerate(self.levels):
            low_name, high_name = band_columns(level)
            out[low_name] = predicted + lower[codes, index]
            out[high_name] = predicted + upper[codes, index]
        return out


def calibrate(residuals: np.ndarray, codes: np.ndarray, n_groups: int, levels: Sequence[float],
              min_group_rows: int) -> GroupBands:
    """`GroupBands` from calibration residuals ``y - f`` (n,) of groups ``codes`` (n,): each group's
    residual quantiles, those of every row for a group with fewer than ``min_group_rows`` of them."""
    residuals = np.asarray(residuals, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    taus = quantile_levels(levels)
    per_group, counts = grouped_quantiles(residuals, codes, n_groups, taus)
    pooled = np.quantile(residuals, taus) if residuals.size else np.zeros_like(taus)
    quantiles = np.where((counts >= min_group_rows)[:, None, None], per_group, pooled[None])
    return GroupBands(list(levels), torch.from_numpy(np.ascontiguousarray(quantiles[..., 0])),
                      torch.from_numpy(np.ascontiguousarray(quantiles[..., 1])))


def online_bands(history: pd.DataFrame, table: pd.DataFrame, forecast: str, levels: Sequence[float],
                 window_days: int, gamma: float) -> Dict[str, np.ndarray]:
    """Intervals of ``table``'s ``forecast`` column, day by day (module doc, ``online``): ``history``
    (date, group, residual) holds the calibration residuals, before the table's first day; ``table``
    (date, group, actual, ``forecast``) the forecasts scored, each day's truth joining the window after
    that day. Returns ``lower_<p>`` / ``upper_<p>`` (n,) aligned with ``table``'s rows."""
    taus = quantile_levels(levels)
    target = 1.0 - np.asarray(levels, dtype=np.float64)
    out = {name: np.full(len(table), np.nan) for level in levels for name in band_columns(level)}
    days = pd.to_datetime(table["date"]).dt.normalize().to_numpy()
    for group, rows in table.groupby("group", sort=False).indices.items():
        past = history[history["group"] == group]
        rows = rows[np.argsort(days[rows], kind="stable")]
        forecasts = table[forecast].to_numpy(dtype=np.float64)[rows]
        actual = table["actual"].to_numpy(dtype=np.float64)[rows]
        stamps = np.concatenate([pd.to_datetime(past["date"]).dt.normalize().to_numpy(), days[rows]])
        residuals = np.concatenate([past["residual"].to_numpy(dtype=np.float64), actual - forecasts])
        order = np.argsort(stamps, kind="stable")
        stamps, residuals = stamps[order], residuals[order]
        alpha = target.copy()
        day_of = days[rows]
        bounds = np.flatnonzero(np.r_[True, day_of[1:] != day_of[:-1], True])
        for start, stop in zip(bounds[:-1], bounds[1:]):
            day = day_of[start]
            low = np.searchsorted(stamps, day - np.timedelta64(window_days, "D"))
            window = residuals[low:np.searchsorted(stamps, day)]
            clipped = np.clip(alpha, 0.0, 1.0)[:, None]
            at = np.concatenate([clipped / 2, 1 - clipped / 2], axis=1) if window.size else taus
            q = np.quantile(window, at) if window.size else np.zeros_like(taus)
            f, y = forecasts[start:stop], actual[start:stop]
            for index, level in enumerate(levels):
                low_name, high_name = band_columns(level)
                lower, upper = f + q[index, 0], f + q[index, 1]
                out[low_name][rows[start:stop]], out[high_name][rows[start:stop]] = lower, upper
                alpha[index] += gamma * (target[index] - np.mean((y < lower) | (y > upper)))
    return out


def interval_metrics(actual: np.ndarray, bands: Dict[str, np.ndarray], levels: Sequence[float], suffix: str
                     ) -> Dict[str, float]:
    """``coverage_<p>_<suffix>`` (% of rows inside), ``width_<p>_<suffix>`` (mean width) per level and
    ``pinball_<suffix>`` (mean pinball loss over the 2L bounds; module doc) of ``bands`` (`band_columns`)
    over the rows ``actual`` (n,)."""
    actual = np.asarray(actual, dtype=np.float64)
    metrics: Dict[str, float] = {}
    losses = []
    for level, (lo_tau, hi_tau) in zip(levels, quantile_levels(levels)):
        low_name, high_name = band_columns(level)
        lower, upper = np.asarray(bands[low_name], dtype=np.float64), np.asarray(bands[high_name], dtype=np.float64)
        label = level_label(level)
        metrics[f"coverage_{label}_{suffix}"] = float(100.0 * np.mean((actual >= lower) & (actual <= upper)))
        metrics[f"width_{label}_{suffix}"] = float(np.mean(upper - lower))
        losses += [pinball(actual, lower, lo_tau), pinball(actual, upper, hi_tau)]
    metrics[f"pinball_{suffix}"] = float(np.mean(losses))
    return metrics


def pinball(actual: np.ndarray, quantile: np.ndarray, tau: float) -> float:
    """Mean pinball loss of the quantile forecasts ``quantile`` at level ``tau`` (module doc)."""
    error = actual - quantile
    return float(np.mean(np.maximum(tau * error, (tau - 1) * error)))
