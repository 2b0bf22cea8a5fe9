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


def memory_timeline_figure(snapshots: list, limit: int | None, predicted_peak: int, baseline: int = 0):
    """Memory held over time (MiB), one colour per phase, with the limit and the predicted peak
    (both drawn above ``baseline``, the memory held when the solve began)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4), layout="constrained")
    axis = figure.subplots()
    phases = list(dict.fromkeys(s["phase"] for s in snapshots))
    for phase in phases:
        points = [s for s in snapshots if s["phase"] == phase]
        axis.plot([p["seconds"] for p in points], [p["allocated"] / 2**20 for p in points], ".-", label=phase)
    axis.axhline((baseline + predicted_peak) / 2**20, color="grey", ls="--", lw=1, label="predicted peak")
    if limit:
        axis.axhline((baseline + limit) / 2**20, color="red", ls=":", lw=1, label="memory.limit")
    axis.set_xlabel("seconds")
    axis.set_ylabel("MiB held")
    axis.set_title("Memory timeline by phase")
    axis.grid(alpha=0.3)
    axis.legend(loc="best", fontsize="small")
    return figure
