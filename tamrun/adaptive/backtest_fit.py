"""Fit the backtest's windows: each segment of windows sharing their effects' state (`tamrun.adaptive.backtest_windows`)
as batches of (window, group) systems through `tamrun.adaptive.fit.WindowFitter`, and forecast each window's horizon.

A system (k, g) reads its own feature ranges (window k's, group g's: row k * G + g of the segment's stacked
design). The direct route up/down-dates a system's Gram from window k - 1's only where both read the same
ranges (and between backtest.refresh recomputations); elsewhere the Gram comes from the system's rows.
The CG route and the dual form fit each batch's systems through the dispatcher, as the adaptive refits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from tamrun.adaptive.backtest_windows import BacktestSchedule, range_changes, segments, stacked_design
from tamrun.adaptive.budget import WindowPlan
from tamrun.adaptive.fit import WindowFitter
from tamrun.adaptive.windows import WindowSchedule, system_design
from tamrun.config.schema import Config
from tamrun.data.batch import GroupedBatch
from tamrun.device.manager import DeviceManager
from tamrun.effects.design import AdditiveDesign
from tamrun.memory.guard import ChunkLoop
from tamrun.solve.stats import FitStats


class BacktestFitter(WindowFitter):
    """The windows of one segment: ``changed`` (K, G) marks the systems whose feature ranges differ from the
    previous window's; ``ahead`` (K, G) is each window's first scored row."""

    def __init__(self, config: Config, design: AdditiveDesign, devices: DeviceManager, history: GroupedBatch,
                 rows: WindowSchedule, window_plan: WindowPlan, loop: ChunkLoop, changed: np.ndarray,
                 ahead: np.ndarray) -> None:
        super().__init__(config, design, devices, history, rows, window_plan, loop)
        self.refresh, self.keep, self.label = config.backtest.refresh, False, "backtest"
        self.changed, self.ahead = changed, ahead

    def system_design(self, k: np.ndarray, g: np.ndarray) -> AdditiveDesign:
        return system_design(self.design, np.asarray(k) * self.schedule.n_groups + np.asarray(g))

    def fresh_systems(self, k: np.ndarray, g: np.ndarray) -> np.ndarray:
        return super().fresh_systems(k, g) | self.changed[k, g]

    def forecast_start(self, k: np.ndarray, g: np.ndarray) -> np.ndarray:
        return self.ahead[k, g]


@dataclass
class BacktestFit:
    """``forecast`` (K, G, H): window k's forecast of rows [ahead[k, g], end[k, g]) of group g (0 beyond);
    ``segments``: the [start, stop) runs of windows fitted with one design; ``fresh_grams``: the systems
    whose Gram came from their rows (direct route)."""

    forecast: torch.Tensor
    stats: FitStats
    segments: List[tuple]
    windows_per_batch: int
    fresh_grams: int = 0
    batch_seconds: List[float] = field(default_factory=list)


def sliced(rows: WindowSchedule, start: int, stop: int) -> WindowSchedule:
    """Windows [start, stop) of ``rows``."""
    return WindowSchedule(rows.dates[start:stop], rows.lo[start:stop], rows.hi[start:stop], rows.end[start:stop],
                          rows.own[start:stop])


def fit_backtest(config: Config, designs: List[AdditiveDesign], devices: DeviceManager, history: GroupedBatch,
                 schedule: BacktestSchedule, window_plan: WindowPlan, loop: ChunkLoop) -> BacktestFit:
    """Every window's forecast, one segment after another (each in batches of windows x groups)."""
    rows, ahead = schedule.rows, schedule.ahead
    changed = range_changes(designs)
    forecast = torch.zeros(rows.n_windows, rows.n_groups, max(1, int((rows.end - ahead).max())),
                           dtype=history.x.dtype)
    runs = segments(designs)
    result = BacktestFit(forecast, FitStats(route=window_plan.plan.route, group_chunk=window_plan.groups,
                                            row_chunk=window_plan.plan.fit.rows), runs, window_plan.windows)
    for start, stop in runs:
        fitter = BacktestFitter(config, stacked_design(designs[start:stop]), devices, history,
                                sliced(rows, start, stop), window_plan, loop, changed[start:stop], ahead[start:stop])
        fitted = fitter.fit()
        forecast[start:stop, :, :fitted.forecast.shape[2]] = fitted.forecast
        result.stats.merge(fitted.stats)
        result.batch_seconds += fitted.batch_seconds
        result.windows_per_batch = min(result.windows_per_batch, fitted.windows_per_batch)
        if fitter.wplan.updating:
            k, g = np.indices(changed[start:stop].shape)
            result.fresh_grams += int(fitter.fresh_systems(k.ravel(), g.ravel()).sum())
    return result
