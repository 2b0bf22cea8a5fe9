"""Figures logged as artifacts (matplotlib's object API: no pyplot state, no display needed)."""

from __future__ import annotations

import pandas as pd


def forecast_figure(table: pd.DataFrame, split: str = "test", zoom_days: int = 14, title: str = ""):
    """Actual vs predicted over the split (summed over groups at each timestamp), and a zoom on its
    first ``zoom_days`` days. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    part = table[table["split"] == split].groupby("date")[["actual", "predicted"]].sum().sort_index()
    figure = Figure(figsize=(12, 6.5), layout="constrained")
    full, zoom = figure.subplots(2, 1)
    for axis, data in ((full, part), (zoom, part[part.index < part.index.min() + pd.Timedelta(days=zoom_days)])):
        axis.plot(data.index, data["actual"], lw=0.6, color="black", label="actual")
        axis.plot(data.index, data["predicted"], lw=0.6, color="tab:orange", label="predicted")
        axis.grid(alpha=0.3)
    full.set_title(title or f"Forecast on the {split} period")
    zoom.set_title(f"First {zoom_days} days")
    full.legend(loc="upper right")
    return figure
