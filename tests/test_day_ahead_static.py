"""+experiment=day_ahead_static, composed by real Hydra: one static fit (mode=run, no adaptive update), every
choice on the validation year 2023, the refit tested on 2024, and no effect that reads the forecast day's load.
The 2024 RMSE itself is measured by the benchmark (docs/adaptive.md), not by a timed test."""

from __future__ import annotations

import pandas as pd

from tamrun.aggregate.experts import compose_experts
from tamrun.config.effects import effect_columns
from tamrun.config.load import typed_config
from tamrun.config.schema import ModeName
from tamrun.data.derive import DataRecipe
from tamrun.config.schema import HISTORY_KINDS
from tamrun.data.load import embedded_path

LAGS = {"Load_d1", "Load_d7"}  # the load of the days before: what a day-ahead forecast may read


def composed(compose_cfg):
    return typed_config(compose_cfg("+experiment=day_ahead_static"))


def recipe(config) -> DataRecipe:
    data = config.data
    return DataRecipe(dict(data.derived), data.date_column, data.target, data.group, None)


def raw_sources(recipe_: DataRecipe, column: str, available) -> set:
    """The columns ``column`` is computed from, through derived columns of derived columns, down to the table's
    own columns or a history column (a lag, a rolling window: it reads earlier rows, a leaf here)."""
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
    assert read <= set(table), read - set(table)
    loads = {column for column in read if column.lower().startswith("load")}
    assert config.data.target == "Load" and loads == LAGS, loads
    for lag in LAGS & set(rules.derived):  # derived from the target: a lag of whole days (checked at config time)
        spec = rules.derived[lag]
        assert (spec.kind, spec.column, spec.by) in {("lag", "Load", "1D"), ("lag", "Load", "7D")}, spec


def test_the_derived_columns_do_not_move_with_the_forecast_day_s_load(compose_cfg):
    """The model's derived columns computed on real rows, then on the same rows with every target scaled by
    1.5: equal, while a column of the lags does move when the lags do."""
    config, _ = composed(compose_cfg)
    rules = recipe(config)
    frame = national_head()
    before = rules.apply(frame)[list(rules.derived)]
    moved = frame.assign(Load=frame["Load"] * 1.5)
    pd.testing.assert_frame_equal(rules.apply(moved)[list(rules.derived)], before)
    lags_moved = rules.apply(frame.assign(Load_d1=frame["Load_d1"] + 100.0))
    assert (lags_moved["lag_change"] - before["lag_change"]).eq(100.0).all()


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
