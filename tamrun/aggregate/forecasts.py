"""The experts' forecasts of the validation and the test period, one family (`tamrun.aggregate.experts`) at a time.

    per family:  prepare (data, features, plan) -> static fit on the rows before split.validation_start
                 -> validation forecasts: the static model's; each filter group's (q, p0) pairs filtered as one
                    batch over training + validation (burn-in on training), each filtered expert keeping the
                    pair of its own grid with the lowest validation RMSE
                 -> static refit on training + validation
                 -> test forecasts: the refit's; each filter group's chosen pairs as one batch over every row up
                    to the test end (burn-in on every row before split.test_start)
    -> `ExpertForecasts`: one row per (date, group) every expert forecasts, in date order

No forecast reads the truth of its own day: the static models are fitted before the period they forecast,
and the filters forecast each day from the state after the day before (tamrun/adaptive/kalman.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from tamrun.adaptive.filtering import FilterInputs, FilterRun, slot_rmse
from tamrun.adaptive.kalman_job import adapt
from tamrun.aggregate.experts import Expert, Family
from tamrun.device.manager import DeviceManager
from tamrun.jobs.prepare import Prepared, prepare
from tamrun.pipeline import Fit, Splits, fit_model, solve

log = logging.getLogger(__name__)

VALIDATION, TEST = "validation", "test"
KEY = ["date", "group"]


@dataclass
class ExpertForecasts:
    """``table``: date, group, period (validation | test), actual, then each expert's forecast (a column named
    after it); ``chosen``: each filtered expert's (q, p0) and its grid's validation RMSE; ``seconds``: the wall
    time of each expert's family; ``prepared``: the first family's preparation; ``fits``: each family's refit."""

    table: pd.DataFrame
    chosen: Dict[str, Dict[str, object]]
    seconds: Dict[str, float]
    prepared: Prepared
    fits: List[Fit] = field(default_factory=list)

    @property
    def names(self) -> List[str]:
        return [c for c in self.table.columns if c not in (*KEY, "period", "actual")]


def actuals(splits: Splits) -> pd.DataFrame:
    """The validation and test rows: date, group (0 without a group column), period, actual."""
    recipe = splits.recipe
    parts = []
    for period, frame in ((VALIDATION, splits.validation), (TEST, splits.test)):
        parts.append(pd.DataFrame({"date": frame[recipe.date_column].to_numpy(),
                                   "group": frame[recipe.group].to_numpy() if recipe.group else 0,
                                   "period": period, "actual": frame[recipe.target].to_numpy(dtype=np.float64)}))
    return pd.concat(parts, ignore_index=True)


def static_forecast(fit: Fit, frame: pd.DataFrame, period: str) -> pd.Series:
    """The fitted model's forecast of the rows of ``frame``, keyed by (date, group)."""
    return fit.predict_frame(frame, period).set_index(KEY)["predicted"]


def filtered_forecasts(data: FilterInputs, run: FilterRun, start: pd.Timestamp) -> Tuple[pd.MultiIndex, np.ndarray]:
    """The (date, group) keys of the rows from ``start`` on and the filters' forecasts of them (C, n)."""
    g, n = np.nonzero((data.batch.row_index >= 0) & (data.dates >= np.datetime64(start)))
    day, slot = data.grid.day[g, n], data.grid.slot[g, n]
    index = pd.MultiIndex.from_arrays([data.dates[g, n], np.asarray(data.batch.groups)[g]], names=KEY)
    return index, run.forecast[:, g, day, slot].numpy()


def union_pairs(experts: List[Expert], chosen: Optional[Dict[str, Dict[str, object]]] = None
                ) -> List[Tuple[float, float]]:
    """The (q, p0) pairs of ``experts`` once each, in order: their grids, or their ``chosen`` pairs."""
    pairs = [p for e in experts for p in ([chosen[e.name]["pair"]] if chosen else e.pairs)]
    return list(dict.fromkeys(pairs))


def validation_filters(prepared: Prepared, static: Fit, experts: List[Expert], out: Dict[str, pd.Series],
                       chosen: Dict[str, Dict[str, object]]) -> None:
    """Filter every pair of ``experts`` (one filter group) over training + validation at once; each expert keeps
    the pair of its grid with the lowest validation RMSE, whose forecasts go to ``out``."""
    splits, start = prepared.splits, pd.Timestamp(prepared.config.split.validation_start)
    pairs = union_pairs(experts)
    data, run = adapt(prepared, static, pd.concat([splits.train, splits.validation]), start, pairs, False,
                      experts[0].config.adaptive.kalman)
    scored = data.observed.clone()
    scored[:, :data.day_index(start)] = False
    scores = slot_rmse(run.forecast, data.target, scored).tolist()
    index, values = filtered_forecasts(data, run, start)
    for expert in experts:
        own = [pairs.index(p) for p in expert.pairs]
        best = own[int(np.argmin([scores[i] for i in own]))]
        grid = [{"q": pairs[i][0], "p0": pairs[i][1], "rmse_validation": scores[i]} for i in own]
        chosen[expert.name] = {"pair": pairs[best], "rmse_validation": scores[best], "grid": grid}
        out[expert.name] = pd.Series(values[best], index=index)


def test_filters(prepared: Prepared, refit: Fit, experts: List[Expert], out: Dict[str, pd.Series],
                 chosen: Dict[str, Dict[str, object]]) -> None:
    """Filter the chosen pairs of ``experts`` (one filter group) over every row up to the test end at once."""
    splits, start = prepared.splits, pd.Timestamp(prepared.config.split.test_start)
    pairs = union_pairs(experts, chosen)
    rows = pd.concat([splits.train, splits.validation, splits.test])
    data, run = adapt(prepared, refit, rows, start, pairs, False, experts[0].config.adaptive.kalman)
    index, values = filtered_forecasts(data, run, start)
    for expert in experts:
        out[expert.name] = pd.Series(values[pairs.index(chosen[expert.name]["pair"])], index=index)


def family_forecasts(prepared: Prepared, family: Family, chosen: Dict[str, Dict[str, object]]
                     ) -> Tuple[Dict[str, pd.Series], Fit]:
    """Each expert of ``family``: its validation then test forecasts as one series keyed by (date, group);
    the refitted static model."""
    config, splits, recorder = prepared.config, prepared.splits, prepared.recorder
    validation: Dict[str, pd.Series] = {}
    test: Dict[str, pd.Series] = {}
    with recorder.phase("static"):
        static = solve(config, prepared.features, prepared.plan, prepared.devices, prepared.chunk_loop(), splits.recipe)
        for expert in family.static:
            validation[expert.name] = static_forecast(static, splits.validation, VALIDATION)
    with recorder.phase("selection"):
        for group in family.filter_groups():
            validation_filters(prepared, static, group, validation, chosen)
    with recorder.phase("refit"):
        union = splits.joined(pd.concat([splits.train, splits.validation]))
        refit = fit_model(config, prepared.specs, union, prepared.devices, prepared.chunk_loop())
        for expert in family.static:
            test[expert.name] = static_forecast(refit, splits.test, TEST)
    with recorder.phase("adaptive"):
        for group in family.filter_groups():
            test_filters(prepared, refit, group, test, chosen)
    return {name: pd.concat([validation[name], test[name]]) for name in validation}, refit


def expert_forecasts(families: List[Family], devices: DeviceManager, order: List[str],
                     libraries_loaded: Optional[Callable[[], None]] = None) -> ExpertForecasts:
    """Every family's experts' forecasts, joined on the rows every expert forecasts, one column per expert in
    ``order`` (`ExpertForecasts`); ``libraries_loaded`` is called by the first family's preparation."""
    chosen: Dict[str, Dict[str, object]] = {}
    seconds: Dict[str, float] = {}
    series: Dict[str, pd.Series] = {}
    fits, first = [], None
    for family in families:
        began = time.perf_counter()
        loaded = libraries_loaded if first is None else None
        prepared = prepare(family.config, family.specs, devices, libraries_loaded=loaded)
        first = first or prepared
        found, refit = family_forecasts(prepared, family, chosen)
        series.update(found)
        fits.append(refit)
        seconds.update({expert.name: time.perf_counter() - began for expert in family.experts})
        log.info("aggregate: experts %s forecast in %.2f s", ", ".join(e.name for e in family.experts),
                 seconds[family.experts[0].name])
    table = actuals(first.splits).set_index(KEY)
    table = table.join(pd.DataFrame({name: series[name] for name in order}), how="inner")
    table = table.sort_index(kind="stable").reset_index()
    return ExpertForecasts(table, chosen, seconds, first, fits)
