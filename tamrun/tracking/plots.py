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


def memory_timeline_figure(snapshots: list, limit: int | None, predicted_peak: int):
    """Top: the process's memory (RSS on the CPU, allocated on CUDA) over time, one colour per phase.
    Bottom: the working memory of the metered phases (peak tensor bytes of each chunk), with the
    oracle's predicted peak and the memory.limit."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 6), layout="constrained")
    held, working = figure.subplots(2, 1, sharex=True)
    for phase in dict.fromkeys(s["phase"] for s in snapshots):
        points = [s for s in snapshots if s["phase"] == phase]
        seconds = [p["seconds"] for p in points]
        line, = held.plot(seconds, [p["allocated"] / 2**20 for p in points], ".-", label=phase)
        metered = [p for p in points if p.get("working", -1) >= 0]
        if metered:
            working.step([p["seconds"] for p in metered], [p["working"] / 2**20 for p in metered], where="pre",
                         color=line.get_color(), label=phase)
    working.axhline(predicted_peak / 2**20, color="grey", ls="--", lw=1, label="predicted peak")
    if limit:
        working.axhline(limit / 2**20, color="red", ls=":", lw=1, label="memory.limit")
    held.set_ylabel("MiB held by the process")
    held.set_title("Memory timeline by phase")
    working.set_ylabel("MiB of working tensors (chunk peaks)")
    working.set_xlabel("seconds")
    for axis in (held, working):
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize="small")
    return figure
