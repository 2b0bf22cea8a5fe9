"""The adaptive forecast against the static one on the test period, and the Kalman filter's drifting
weights (matplotlib's object API)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch


def adaptive_figure(table: pd.DataFrame, title: str = "", smooth_days: int = 7,
                    label: str = "adaptive (sliding-window refits)"):
    """Top: the daily mean of the actual, static and adaptive series; bottom: each forecast's daily
    RMSE (over the day's rows of every group), averaged over ``smooth_days`` days. ``table`` has
    date, actual, static, adaptive (drawn as ``label``)."""
    from matplotlib.figure import Figure

    day = pd.to_datetime(table["date"]).dt.normalize()
    daily = table.groupby(day)[["actual", "static", "adaptive"]].mean()
    squared = pd.DataFrame({name: (table[name] - table["actual"]) ** 2 for name in ("static", "adaptive")})
    daily_rmse = np.sqrt(squared.groupby(day).mean()).rolling(smooth_days, min_periods=1).mean()
    figure = Figure(figsize=(12, 6.5), layout="constrained")
    series, errors = figure.subplots(2, 1, sharex=True)
    series.plot(daily.index, daily["actual"], lw=0.8, color="black", label="actual")
    for axis, data in ((series, daily), (errors, daily_rmse)):
        axis.plot(data.index, data["static"], lw=0.8, color="tab:blue", label="static (fitted on the training split)")
        axis.plot(data.index, data["adaptive"], lw=0.8, color="tab:orange", label=label)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right")
    series.set_title(title or "Adaptive vs static forecast")
    series.set_ylabel("daily mean")
    errors.set_title(f"Daily RMSE ({smooth_days}-day mean)")
    return figure


def backtest_figure(windows: pd.DataFrame, table: pd.DataFrame, title: str = ""):
    """Top: each window's RMSE at its cut-off, and their mean (rmse_backtest); bottom: the daily mean of the
    actual series and of each window's forecast over its horizon (``windows``: window, cutoff, rmse; ``table``:
    window, date, actual, predicted)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 6.5), layout="constrained")
    scores, series = figure.subplots(2, 1)
    cutoffs = pd.to_datetime(windows["cutoff"])
    scores.plot(cutoffs, windows["rmse"], marker="o", lw=0.8, color="tab:orange", label="window RMSE")
    scores.axhline(float(windows["rmse"].mean()), color="black", lw=0.8, ls="--", label="mean (rmse_backtest)")
    scores.set_title(title or "Backtest")
    scores.set_ylabel("RMSE")
    day = pd.to_datetime(table["date"]).dt.normalize()
    actual = table.groupby(day)["actual"].mean() if table["window"].nunique() < 2 else \
        table.drop_duplicates(["date", "group"]).groupby(day)["actual"].mean()
    series.plot(actual.index, actual.to_numpy(), lw=0.8, color="black", label="actual")
    for k, part in table.groupby("window", sort=True):
        daily = part.groupby(pd.to_datetime(part["date"]).dt.normalize())["predicted"].mean()
        series.plot(daily.index, daily.to_numpy(), lw=0.9, color="tab:orange" if k % 2 == 0 else "tab:blue",
                    label="forecast (each window's horizon)" if k == 0 else None)
    series.set_ylabel("daily mean")
    for axis in (scores, series):
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right")
    return figure


def weights_figure(weights: torch.Tensor, theta0: torch.Tensor, days: np.ndarray, names: Sequence[str]):
    """Each input's weight relative to the static model's, theta_t / theta_0, averaged over the groups,
    day by day (``weights`` (G, T, k), ``theta0`` (G, k), ``days`` (T,)): 1 is the static model."""
    from matplotlib.figure import Figure

    relative = (weights / theta0.unsqueeze(1)).mean(dim=0).numpy()
    figure = Figure(figsize=(12, 5), layout="constrained")
    axis = figure.subplots()
    for j, name in enumerate(names):
        axis.plot(pd.to_datetime(days), relative[:, j], lw=0.8, label=name)
    axis.axhline(1.0, color="black", lw=0.6)
    axis.set_title("Kalman weights relative to the static model (mean over groups)")
    axis.set_ylabel("theta_t / theta_0")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", ncol=4, fontsize="small")
    return figure
