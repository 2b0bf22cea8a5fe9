"""The adaptive forecast against the static one on the test period (matplotlib's object API)."""

from __future__ import annotations

import pandas as pd


def adaptive_figure(table: pd.DataFrame, title: str = "", smooth_days: int = 7):
    """Top: actual, static and adaptive forecasts summed over groups per date; bottom: the absolute
    error of each, averaged over ``smooth_days`` dates. ``table`` has date, actual, static, adaptive."""
    from matplotlib.figure import Figure

    daily = table.groupby("date")[["actual", "static", "adaptive"]].sum().sort_index()
    figure = Figure(figsize=(12, 6.5), layout="constrained")
    series, errors = figure.subplots(2, 1, sharex=True)
    series.plot(daily.index, daily["actual"], lw=0.6, color="black", label="actual")
    series.plot(daily.index, daily["static"], lw=0.6, color="tab:blue", label="static (fitted on the training split)")
    series.plot(daily.index, daily["adaptive"], lw=0.6, color="tab:orange", label="adaptive (sliding-window refits)")
    series.set_title(title or "Adaptive vs static forecast")
    series.legend(loc="upper right")
    for name, color in (("static", "tab:blue"), ("adaptive", "tab:orange")):
        error = (daily[name] - daily["actual"]).abs().rolling(smooth_days, min_periods=1).mean()
        errors.plot(daily.index, error, lw=0.8, color=color, label=name)
    errors.set_title(f"Absolute error of the summed forecast ({smooth_days}-date mean)")
    errors.legend(loc="upper right")
    for axis in (series, errors):
        axis.grid(alpha=0.3)
    return figure
