"""+experiment=day_ahead_static, composed by real Hydra: one static fit (mode=run, no adaptive update), every
choice on the validation year 2023, the refit tested on 2024, and no effect that reads the forecast day's load.
The 2024 RMSE itself is measured by the benchmark (docs/adaptive.md), not by a timed test."""

from __future__ import annotations

import pandas as pd

from tamrun.aggregate.experts import compose_experts
from tamrun.config.effects import effect_columns
from tamrun.config.load import typed_config
from tamrun.config.schema import HISTORY_KINDS, ModeName
from tamrun.data.calendar import Calendar
from tamrun.data.derive import DataRecipe, add_derived_columns
from tamrun.data.load import embedded_path

LAGS = {"Load_d1", "Load_d7"}  # the load of the days before: what a day-ahead forecast may read
DAYS_BEFORE = {"prev_mean", "week_mean"}  # the means of whole local days before the row's (history columns)


def composed(compose_cfg):
    return typed_config(compose_cfg("+experiment=day_ahead_static"))


def recipe(config) -> DataRecipe:
    data = config.data
    return DataRecipe(dict(data.derived), data.date_column, data.target, data.group, None)


def raw_sources(recipe_: DataRecipe, column: str, available) -> set:
    """The columns ``column`` is computed from, through derived columns of derived columns, down to the table's
    own columns or a history column (it reads earlier rows: a leaf here, checked apart)."""
    if column not in recipe_.derived or recipe_.derived[column].kind in HISTORY_KINDS:
        return {column}
    return set().union(*(raw_sources(recipe_, source, available)
                         for source in recipe_.sources(column, [*available, *recipe_.derived])))


def national_head(rows: int = 2000) -> pd.DataFrame:
    return pd.read_csv(embedded_path(), nrows=rows)


def test_one_static_fit_every_choice_on_2023_the_refit_tested_on_2024(compose_cfg):
    config, specs = composed(compose_cfg)
    assert config.mode.name == ModeName.run  # no sliding refits, no Kalman filter, no aggregation
    assert config.model.name == "static_day_ahead" and config.objective == "rmse_validation"
    split = config.split
    assert (split.validation_start, split.validation_end, split.train_end) == ("2023-01-01", None, "2023-12-31")
    assert (split.test_start, split.test_end) == ("2024-01-01", "2024-12-31")
    assert split.refit  # the model scored on 2023 is refitted on every training row, 2023 included
    assert split.train_start < split.validation_start
    assert any(spec.kind == "forest" for spec in specs.values())


def test_no_effect_reads_the_load_of_the_day_it_forecasts(compose_cfg):
    config, specs = composed(compose_cfg)
    rules = recipe(config)
    table = national_head(5).columns
    read = set().union(*(raw_sources(rules, column, table) for column in effect_columns(specs).values()))
    history = {column for column in read if column in rules.derived}
    assert read - history <= set(table), read - history - set(table)
    assert config.data.target == "Load" and not {column for column in read - history if column.startswith("Load")}
    from_target = {column for column in history if rules.derived[column].column == "Load"}
    assert from_target == LAGS | DAYS_BEFORE, from_target
    for column in from_target:  # a lag of whole days, or a window of whole days ending at the row's day's start
        spec = rules.derived[column]
        assert (spec.kind, spec.by) in {("lag", "1D"), ("lag", "7D")} or (spec.kind, spec.align, spec.window) in {
            ("rolling", "day", "1D"), ("rolling", "day", "7D")}, spec


def test_the_derived_columns_do_not_move_with_the_forecast_day_s_load(compose_cfg):
    """The model's derived columns computed on real rows, then on the same rows with the load of one day D
    raised by 1,000 MW: every column of day D is equal, the day after's means and lags move (they read D)."""
    config, _ = composed(compose_cfg)
    data = config.data
    frame = national_head().assign(date=lambda table: pd.to_datetime(table["date"]))

    def derived(table: pd.DataFrame) -> pd.DataFrame:  # as a run derives them (earlier rows: the table's)
        return add_derived_columns(table, data.derived, "date", None, Calendar.of(data, table["date"]), data.group)

    day = frame["date"].dt.normalize()
    moved_day = day.unique()[20]
    before = derived(frame)[list(data.derived)]
    after = derived(frame.assign(Load=frame["Load"].where(day != moved_day, frame["Load"] + 1000.0)))
    on_day = (day == moved_day).to_numpy()
    pd.testing.assert_frame_equal(after[list(data.derived)][on_day], before[on_day])
    next_day = (day == moved_day + pd.Timedelta(days=1)).to_numpy()
    assert (after["prev_mean"][next_day] - before["prev_mean"][next_day]).round(9).eq(1000.0).all()
    assert (after["week_mean"][next_day] > before["week_mean"][next_day]).all()
    assert (after["lag_change"][next_day] - before["lag_change"][next_day]).round(9).eq(1000.0).all()  # Load_d1's


def test_the_aggregate_s_static_expert_brings_its_derived_columns(compose_cfg):
    """+experiment=day_ahead_aggregate's fourth expert is this static model (mode=run): the run's data does not
    declare the derived columns it reads, the expert's composition adds them, and the Kalman experts' data stays
    the run's."""
    cfg = compose_cfg("+experiment=day_ahead_aggregate")
    config, _ = typed_config(cfg)
    experts = {expert.name: expert for expert in compose_experts(cfg, config)}
    static = experts["static_day_ahead"].config
    assert static.mode.name == ModeName.run and static.model.name == "static_day_ahead"
    assert not {"lag_change", "temperature_change"} & set(config.data.derived)
    assert {"lag_change", "temperature_change"} <= set(static.data.derived)
    assert set(experts["kalman_spline_lags"].config.data.derived) == set(config.data.derived)
    assert static.split == config.split  # the run's split: fitted on 2013-2022 for 2023, refitted for 2024
