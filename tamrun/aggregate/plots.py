"""The aggregation's weights over time and each forecast's monthly RMSE (matplotlib's object API)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd


def weights_figure(days: np.ndarray, daily: np.ndarray, names: Sequence[str], test_start: pd.Timestamp,
                   title: str = ""):
    """Stacked daily weights (T, K) of the experts ``names`` (averaged over the series), the test period's
    start marked: the weights each day was forecast with."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5), layout="constrained")
    axis = figure.subplots()
    axis.stackplot(pd.to_datetime(days), daily.T, labels=list(names), linewidth=0)
    axis.axvline(test_start, color="black", lw=0.8, ls="--")
    axis.set_ylim(0.0, 1.0)
    axis.set_ylabel("weight (mean over series)")
    axis.set_title(title or "Aggregation weights over time")
    axis.legend(loc="upper left", ncol=min(4, len(names)), fontsize="small")
    return figure


def monthly_figure(monthly: pd.DataFrame, test_start: pd.Timestamp, title: str = ""):
    """Each forecast's RMSE per month (``monthly``: one column per forecast, indexed by monthly periods), the
    test period's start marked."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5), layout="constrained")
    axis = figure.subplots()
    for name in monthly.columns:
        width = 2.0 if name == "aggregate" else 0.8
        axis.plot(monthly.index.to_timestamp(), monthly[name], lw=width, marker="o", ms=3, label=name)
    axis.axvline(test_start, color="black", lw=0.8, ls="--")
    axis.set_ylabel("RMSE")
    axis.set_title(title or "Monthly RMSE")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right", fontsize="small")
    return figure
