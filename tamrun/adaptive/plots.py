"""The adaptive forecast against the static one on the test period (matplotlib's object API)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def adaptive_figure(table: pd.DataFrame, title: str = "", smooth_days: int = 7):
    """Top: the daily mean of the actual, static and adaptive series; bottom: each forecast's daily
    RMSE (over the day's rows of every group), averaged over ``smooth_days`` days. ``table`` has
    date, actual, static, adaptive."""
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
        axis.plot(data.index, data["adaptive"], lw=0.8, color="tab:orange", label="adaptive (sliding-window refits)")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right")
    series.set_title(title or "Adaptive vs static forecast")
    series.set_ylabel("daily mean")
    errors.set_title(f"Daily RMSE ({smooth_days}-day mean)")
    return figure
