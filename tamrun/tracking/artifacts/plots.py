"""Figures logged as artifacts (matplotlib's object API: no pyplot state, no display needed)."""

from __future__ import annotations

import calendar
from typing import List, Sequence

import numpy as np
import pandas as pd


# The training data's histogram under each partial effect: its tallest bin, as a fraction of the panel's height.
HISTOGRAM_HEIGHT = 0.25
# The band of a partial effect: these quantiles of the groups' curves at each point.
SPREAD = (0.1, 0.9)
SPREAD_LABEL = "10-90% of the groups"
# Partial-effect panels: width and height, and the figure's margin above and below them (inches).
PANEL_WIDTH, PANEL_HEIGHT, PANEL_MARGIN = 4.2, 3.2, 0.6
# A long line is drawn from its envelope over this many slices of its points (`line_envelope`): about
# one per pixel column of the forecast's 12-inch figure at matplotlib's 100 dpi. Drawing the national
# test year's 17,520 points twice took 0.5 s of the recording; 4 points per column draw the same pixels.
LINE_SLICES = 1200
# plots/intervals.png: a panel for each of the first this many groups, each this tall (inches).
INTERVAL_PANELS, INTERVAL_PANEL_HEIGHT = 4, 2.2
# Whiskers of the residual boxes: the furthest residuals within this many interquartile ranges of the box.
WHISKER_IQR = 1.5


def _label(name: str, unit: str) -> str:
    return f"{name} ({unit})" if unit else name


def _fixed_margins(figure, left: float = 1.0, right: float = 0.25, bottom: float = 0.6, top: float = 0.45,
                   hspace: float = 0.35) -> None:
    """Place the axes with margins in inches (room for the tick labels, axis labels and titles of these
    figures) instead of a layout engine: constrained layout's passes over every label cost as much as
    drawing the figure (0.34 s against 0.20 s for the forecast)."""
    width, height = figure.get_size_inches()
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                           hspace=hspace)


def line_envelope(values: np.ndarray, slices: int = LINE_SLICES) -> np.ndarray:
    """The positions (sorted) of the points of a line of ``values`` (n,) that draw it at ``slices`` pixel
    columns: in each of ``slices`` runs of consecutive points, its first, lowest, highest and last (the M4
    reduction: the drawn line's every column spans the same range and joins its neighbours the same
    way). All of them when n <= 4 * ``slices``. NaN points are never a slice's lowest or highest."""
    n = len(values)
    if n <= 4 * slices:
        return np.arange(n)
    run = -(-n // slices)  # points per slice; the last slice may be shorter
    starts = np.arange(0, n, run)
    padded = np.full(len(starts) * run, np.nan)
    padded[:n] = values
    runs = padded.reshape(len(starts), run)
    missing = np.isnan(runs)
    lowest = np.where(missing, np.inf, runs).argmin(axis=1)
    highest = np.where(missing, -np.inf, runs).argmax(axis=1)
    last = np.minimum(starts + run, n) - 1
    return np.unique(np.concatenate([starts, starts + lowest, starts + highest, last]))


def forecast_figure(table: pd.DataFrame, split: str = "test", zoom_days: int = 7, title: str = "", unit: str = ""):
    """Actual vs predicted over the split (summed over groups at each timestamp), and a zoom on its
    first ``zoom_days`` days. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    rows = table[table["split"] == split]
    part = rows.groupby("date")[["actual", "predicted"]].sum().sort_index()
    figure = Figure(figsize=(12, 6.5))
    _fixed_margins(figure)
    full, zoom = figure.subplots(2, 1)
    zoomed = part[part.index < part.index.min() + pd.Timedelta(days=zoom_days)]
    draw_bands(zoom, rows[rows["date"] < part.index.min() + pd.Timedelta(days=zoom_days)])
    for axis, data in ((full, part), (zoom, zoomed)):
        for column, colour in (("actual", "black"), ("predicted", "tab:orange")):
            drawn = data[column].iloc[line_envelope(data[column].to_numpy(dtype=float))]
            axis.plot(drawn.index, drawn.to_numpy(), lw=0.6, color=colour, label=column)
        axis.set_ylabel(_label("target", unit))
        axis.grid(alpha=0.3)
    full.set_title(title or f"Forecast on the {split} period")
    zoom.set_title(f"Zoom: the first {zoom_days} days of the {split} period")
    zoom.set_xlabel("date")
    full.legend(loc="upper right")
    if zoom.collections:  # intervals shaded
        zoom.legend(loc="upper right")
    return figure


BAND_ALPHA = (0.2, 0.3)  # the shades of the intervals, widest first (a narrower one, drawn over it, looks darker)


def draw_bands(axis, rows: pd.DataFrame) -> None:
    """Shade each interval of ``rows`` (columns lower_<p>, upper_<p>), the widest first. Nothing to draw
    without them or where a date has rows of several groups (a sum of bounds is no interval of the sum)."""
    lows = sorted((c for c in rows.columns if c.startswith("lower_")), key=lambda c: -float(c[len("lower_"):]))
    if not lows or rows["date"].duplicated().any():
        return
    rows = rows.sort_values("date")
    for index, low in enumerate(lows):
        label = low[len("lower_"):]
        axis.fill_between(rows["date"].to_numpy(), rows[low].to_numpy(dtype=float),
                          rows[f"upper_{label}"].to_numpy(dtype=float), color="tab:orange", linewidth=0,
                          alpha=BAND_ALPHA[min(index, len(BAND_ALPHA) - 1)], label=f"{label} % interval")


def interval_groups(rows: pd.DataFrame, most: int = INTERVAL_PANELS) -> tuple:
    """(the groups `interval_figure` draws: the first ``most`` of ``rows`` in their order, the number left out);
    rows without a ``group`` column are one group, None."""
    if "group" not in rows.columns:
        return [None], 0
    groups = list(pd.unique(rows["group"]))
    return groups[:most], max(0, len(groups) - most)


def interval_figure(rows: pd.DataFrame, forecast: str, zoom_days: int = 7, title: str = "", unit: str = "",
                    most: int = INTERVAL_PANELS):
    """The intervals of a forecast (``rows``: date, group, actual, ``forecast``, lower_<p>, upper_<p>): one
    panel per group for the first ``most`` groups (`interval_groups`; each titled with its group), its first
    ``zoom_days`` days shaded (`draw_bands`) under its actual and forecast lines, each sorted by date; last,
    each level's coverage per calendar month over every group against its nominal level (dashed). The
    title says how many groups are left out. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    rows = rows.sort_values("date", kind="stable")
    shown, left_out = interval_groups(rows, most)
    figure = Figure(figsize=(12, INTERVAL_PANEL_HEIGHT * (len(shown) + 1) + 0.6))
    _fixed_margins(figure, top=0.8, hspace=0.55)
    *panels, months = figure.subplots(len(shown) + 1, 1, squeeze=False)[:, 0]
    start = pd.to_datetime(rows["date"]).min()
    for axis, group in zip(panels, shown):
        mine = rows if group is None else rows[rows["group"] == group]
        first = mine[pd.to_datetime(mine["date"]) < start + pd.Timedelta(days=zoom_days)]
        draw_bands(axis, first)
        dates = pd.to_datetime(first["date"])
        axis.plot(dates, first["actual"].to_numpy(dtype=float), lw=0.6, color="black", label="actual")
        axis.plot(dates, first[forecast].to_numpy(dtype=float), lw=0.6, color="tab:orange", label=forecast)
        axis.set_ylabel(_label("target", unit))
        axis.set_title("every row" if group is None else f"group {group}", fontsize=10)
        axis.legend(loc="upper right", fontsize=8)
        axis.grid(alpha=0.3)
    more = f" ({left_out} more group(s) not drawn)" if left_out else ""
    figure.suptitle(title or f"The first {zoom_days} days and their intervals{more}")
    _monthly_coverage(months, rows)
    return figure


def _monthly_coverage(axis, rows: pd.DataFrame) -> None:
    """Each level's coverage of ``rows`` (every group) per calendar month, its nominal level dashed."""
    month = pd.to_datetime(rows["date"]).dt.to_period("M")
    for low in (c for c in rows.columns if c.startswith("lower_")):
        label = low[len("lower_"):]
        inside = (rows["actual"] >= rows[low]) & (rows["actual"] <= rows[f"upper_{label}"])
        monthly = 100.0 * inside.groupby(month).mean()
        line, = axis.plot(monthly.index.to_timestamp(), monthly.to_numpy(), marker="o", lw=0.8,
                          label=f"{label} % interval")
        axis.axhline(float(label), color=line.get_color(), ls="--", lw=0.8)
    axis.set_title("coverage per month, every group", fontsize=10)
    axis.set_ylabel("coverage per month (%)")
    axis.set_xlabel("month")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")


def residual_period(dates: Sequence) -> str:
    """What the residuals are grouped by, from the median gap between the distinct dates:
    ``time_of_day`` below a day, ``day_of_week`` from a day up to a week (every weekday still shows),
    ``month`` from a week on. Fewer than two dates: ``time_of_day``."""
    stamps = pd.DatetimeIndex(pd.to_datetime(pd.Series(dates)).dropna()).unique().sort_values()
    if len(stamps) < 2:
        return "time_of_day"
    gap = (stamps[1:] - stamps[:-1]).median()
    if gap < pd.Timedelta(days=1):
        return "time_of_day"
    return "day_of_week" if gap < pd.Timedelta(days=7) else "month"


def _period_keys(dates: pd.Series, period: str) -> tuple:
    """(each date's key, tick positions, tick labels, axis label) of a `residual_period`."""
    if period == "time_of_day":
        hours = np.arange(0, 25, 2)
        return (dates.dt.hour + dates.dt.minute / 60.0).to_numpy(), hours, [str(h) for h in hours], "time of day (h)"
    if period == "day_of_week":
        return dates.dt.day_of_week.to_numpy(), np.arange(7), list(calendar.day_abbr), "day of week"
    return dates.dt.month.to_numpy(), np.arange(1, 13), list(calendar.month_abbr)[1:], "month"


def residuals_by_period_figure(table: pd.DataFrame, period: str, split: str = "test", unit: str = ""):
    """Box plots of the residuals (actual - predicted) of ``split`` by ``period`` of the date column
    (`residual_period`: time of day, day of week or month), with their mean. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    part = table[table["split"] == split]
    keys, ticks, labels, name = _period_keys(pd.to_datetime(part["date"]), period)
    residual = (part["actual"] - part["predicted"]).to_numpy()
    slots = np.unique(keys)
    figure = Figure(figsize=(12, 4.5))
    _fixed_margins(figure)
    axis = figure.subplots()
    width = 0.6 * float(np.min(np.diff(slots))) if len(slots) > 1 else 0.5
    boxes = box_statistics([residual[keys == k] for k in slots])
    _draw_boxes(axis, slots, boxes, width)
    axis.plot(slots, boxes["mean"], color="tab:red", lw=1, label="mean")
    axis.axhline(0, color="grey", lw=0.8)
    axis.set_xticks(ticks, labels)
    axis.set_xlabel(name)
    axis.set_ylabel(_label("residual = actual - predicted", unit))
    axis.set_title(f"Residuals by {period.replace('_', ' ')} on the {split} period "
                   "(boxes: quartiles, whiskers: 1.5 IQR)")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right")
    return figure


def box_statistics(samples: Sequence[np.ndarray]) -> dict:
    """Each sample's box: ``q1``, ``median``, ``q3`` (linear-interpolated quartiles), ``low`` and ``high``
    (the whiskers: its smallest and largest values within `WHISKER_IQR` interquartile ranges of the box)
    and ``mean``; arrays (len(samples),). The box plot's usual statistics, without drawing them."""
    stats = {key: np.empty(len(samples)) for key in ("q1", "median", "q3", "low", "high", "mean")}
    for at, sample in enumerate(samples):
        q1, median, q3 = np.percentile(sample, [25, 50, 75])
        reach = WHISKER_IQR * (q3 - q1)
        stats["q1"][at], stats["median"][at], stats["q3"][at] = q1, median, q3
        stats["low"][at] = sample[sample >= q1 - reach].min()
        stats["high"][at] = sample[sample <= q3 + reach].max()
        stats["mean"][at] = sample.mean()
    return stats


def _draw_boxes(axis, positions: np.ndarray, boxes: dict, width: float) -> None:
    """`box_statistics`' boxes at ``positions`` as three artists (boxes, median bars, whiskers with
    their caps) rather than six per box: 48 boxes of a half-hourly day took 0.4 s to draw one by one."""
    from matplotlib.collections import LineCollection, PolyCollection

    left, right = positions - width / 2, positions + width / 2
    corners = np.stack([np.stack([left, boxes["q1"]], 1), np.stack([right, boxes["q1"]], 1),
                        np.stack([right, boxes["q3"]], 1), np.stack([left, boxes["q3"]], 1)], 1)
    axis.add_collection(PolyCollection(corners, facecolors="none", edgecolors="black", linewidths=1))
    axis.hlines(boxes["median"], left, right, colors="tab:orange", lw=1.5)
    capped = np.concatenate([
        [[[x, q], [x, w]] for x, q, w in zip(positions, boxes["q1"], boxes["low"])],
        [[[x, q], [x, w]] for x, q, w in zip(positions, boxes["q3"], boxes["high"])],
        [[[x - width / 4, w], [x + width / 4, w]] for x, w in zip(positions, boxes["low"])],
        [[[x - width / 4, w], [x + width / 4, w]] for x, w in zip(positions, boxes["high"])]])
    axis.add_collection(LineCollection(capped, colors="black", linewidths=1))
    axis.autoscale_view()


def partial_effects_figure(curves: Sequence[dict], unit: str = "", columns: int = 3):
    """One panel per effect: its contribution against its first column, the mean over groups and the
    band of `SPREAD` quantiles of the groups' curves, over a histogram of the column's training values
    (the data range). (One line per group, 48 on the national data, took most of the recording's time
    to draw and encode, and hid the mean.)

    ``curves``: dicts with ``name``, ``column``, ``grid`` (n,), ``values`` (G, n), ``data`` (training
    values of the column) and ``discrete`` (levels: markers instead of lines). The histogram's heights are
    relative (the tallest bin is `HISTOGRAM_HEIGHT` of the panel)."""
    from matplotlib.figure import Figure

    columns = max(1, min(columns, len(curves)))
    rows = max(1, -(-len(curves) // columns))
    height = PANEL_HEIGHT * rows + 2 * PANEL_MARGIN
    figure = Figure(figsize=(PANEL_WIDTH * columns, height))
    # a fixed grid (a layout engine's passes over every tick label took as long as the drawing)
    figure.subplots_adjust(left=1.0 / (PANEL_WIDTH * columns), right=0.99, bottom=PANEL_MARGIN / height,
                           top=1 - PANEL_MARGIN / height, wspace=0.4, hspace=0.55)
    axes = np.atleast_1d(figure.subplots(rows, columns)).ravel()
    for axis, curve in zip(axes, curves):
        # where the training data lie: their histogram in the bottom quarter of the panel (x: data, y: axes
        # fraction), one artist on the same axes (a second y axis doubled the tick labels to lay out)
        heights, edges = np.histogram(curve["data"], bins=40 if not curve["discrete"] else len(curve["grid"]))
        axis.stairs(HISTOGRAM_HEIGHT * heights / max(1, heights.max()), edges, fill=True, color="0.85", zorder=0,
                    transform=axis.get_xaxis_transform())
        grid, values = np.asarray(curve["grid"], dtype=float), np.asarray(curve["values"], dtype=float)
        low, high = np.quantile(values, SPREAD, axis=0)  # (n,) each: the spread over the groups
        if curve["discrete"]:
            axis.vlines(grid, low, high, color="tab:blue", alpha=0.5, lw=4, label=SPREAD_LABEL)
            axis.plot(grid, values.mean(axis=0), "o--", color="black", lw=1.2, label="mean over groups")
        else:
            axis.fill_between(grid, low, high, color="tab:blue", alpha=0.25, lw=0, label=SPREAD_LABEL)
            axis.plot(grid, values.mean(axis=0), color="black", lw=1.6, label="mean over groups")
        axis.set_title(f"{curve['name']}", fontsize="medium")
        axis.set_xlabel(curve["column"])
        axis.set_ylabel(_label("contribution", unit))
        axis.grid(alpha=0.3)
    for axis in axes[len(curves):]:
        axis.set_visible(False)
    if curves:
        axes[0].legend(loc="best", fontsize="small")
    figure.suptitle("Partial effects (other columns at their training median; grey: where the training data lie)")
    return figure


def cg_residual_figure(history: Sequence[float], tol: float):
    """The CG's worst relative residual ||r||/||b|| over the groups, per iteration, with the tolerance."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4))
    _fixed_margins(figure, left=0.9)
    axis = figure.subplots()
    axis.semilogy(np.arange(len(history)), history, ".-", ms=3, label="max over groups of ||r|| / ||b||")
    axis.axhline(tol, color="red", ls=":", label=f"solver.tol = {tol:g}")
    axis.set_xlabel("CG iteration")
    axis.set_ylabel("relative residual (dimensionless)")
    axis.set_title("Conjugate gradient convergence")
    axis.grid(alpha=0.3, which="both")
    axis.legend(loc="upper right")
    return figure


def memory_timeline_figure(snapshots: list, limit: int | None, predicted_peak: int):
    """Top: the process's memory (RSS on the CPU, allocated on CUDA) over time, one colour per phase.
    Bottom: the working memory of the metered phases (peak tensor bytes of each chunk), with the
    oracle's predicted peak and the memory.limit."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 6))
    _fixed_margins(figure, hspace=0.2)
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


def _axis_values(values: pd.Series) -> tuple:
    """(x, tick labels): the values as numbers when every one is a number (no labels), else the
    position of each value among the distinct values in order of appearance, and those values."""
    numbers = pd.to_numeric(values, errors="coerce")
    if len(values) and numbers.notna().all():
        return numbers.astype(float).tolist(), None
    text = values.fillna("(none)").astype(str)
    categories = list(dict.fromkeys(text))
    return [float(categories.index(v)) for v in text], categories


def sweep_objective_panels(table: pd.DataFrame, objective: str, swept: Sequence[str] = ()) -> List[dict]:
    """The objective plot's data: one panel per swept key (one panel of job numbers when none is), each
    with ``param``, ``x`` (the jobs' values of the key: numbers, or positions of the ``ticks`` labels
    when any value is not a number), ``ticks`` (None on a numeric axis), ``y`` (the objective, NaN
    where a job has none), ``failed`` (the job did not finish, or has no objective) and ``job``."""
    y = (table[objective] if objective in table.columns else pd.Series(np.nan, index=table.index)).astype(float)
    failed = ((table["status"] != "FINISHED") | y.isna()).tolist()
    keys = [key for key in swept if key in table.columns] or ["job"]
    panels = []
    for key in keys:
        x, ticks = _axis_values(table[key])
        panels.append({"param": key, "x": x, "ticks": ticks, "y": y.tolist(), "failed": failed,
                       "job": table["job"].tolist()})
    return panels


def _objective_panel(axis, panel: dict, objective: str, best_job, unit: str) -> None:
    x, y, failed = np.asarray(panel["x"]), np.asarray(panel["y"]), np.asarray(panel["failed"], dtype=bool)
    axis.plot(x[~failed], y[~failed], "o", ms=5, alpha=0.8, label=f"{objective} of a job")
    if best_job is not None and best_job in panel["job"]:
        at = panel["job"].index(best_job)
        axis.plot([x[at]], [y[at]], "*", ms=14, color="tab:red", label=f"best (job {best_job})")
    if failed.any():  # at the axis' bottom: they have no objective
        axis.plot(x[failed], np.zeros(int(failed.sum())), "x", ms=9, mew=2, color="black", clip_on=False,
                  transform=axis.get_xaxis_transform(), label="failed job (no objective)")
    if panel["ticks"] is not None:
        axis.set_xticks(range(len(panel["ticks"])), panel["ticks"], rotation=30 if len(panel["ticks"]) > 4 else 0)
        axis.set_xlim(-0.5, len(panel["ticks"]) - 0.5)
    axis.set_xlabel(panel["param"])
    axis.set_ylabel(_label(objective, unit))
    axis.grid(alpha=0.3)


def sweep_objective_figure(table: pd.DataFrame, objective: str, swept: Sequence[str] = (), best_job=None,
                           unit: str = ""):
    """A sweep's objective against each swept key's values (one panel per key, see
    `sweep_objective_panels`), the best job starred, the failed jobs as crosses at the bottom."""
    from matplotlib.figure import Figure

    panels = sweep_objective_panels(table, objective, swept)
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(max(8.0, 4.5 * columns + 1.5), 3.8 * rows + 0.4), layout="constrained")
    axes = np.atleast_1d(figure.subplots(rows, columns)).ravel()
    for axis, panel in zip(axes, panels):
        _objective_panel(axis, panel, objective, best_job, unit)
    for axis in axes[len(panels):]:
        axis.set_visible(False)
    axes[0].legend(loc="best", fontsize="small")
    failed = [job for job, bad in zip(panels[0]["job"], panels[0]["failed"]) if bad]
    figure.suptitle(f"Sweep: {objective} against the swept values ({len(table)} job(s)"
                    + (f"; failed: job(s) {', '.join(map(str, failed[:20]))}{'...' if len(failed) > 20 else ''})"
                       if failed else ")"), fontsize="medium")
    return figure
