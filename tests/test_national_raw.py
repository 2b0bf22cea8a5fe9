"""The national presets from the raw columns (issue 60): every column they read is derived from the date, Load
and temperature (conf/derived/national.yaml), so that ``data=csv data.path=<raw> data.target=Load`` on a table of
those three columns only scores what the embedded table scores.

The raw table is the embedded one's date, Load and temperature, written by `write_raw_national`; the runs are
real (`tamrun.runner.run` on Hydra's composition, each into the test's own sqlite store).
"""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from tamrun.config.effects import effect_columns
from tamrun.config.load import typed_config
from tamrun.data.load import RAW_NATIONAL_COLUMNS, write_raw_national
from tamrun.errors import ConfigError
from tamrun.runner import run

QUIET = ["hw=cpu", "progress=off", "tracking.log_plots=false", "tracking.log_model=false"]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return write_raw_national(tmp_path_factory.mktemp("raw") / "national_raw.csv.gz")


def loaded_columns(caplog) -> list:
    """The '(rows) x (columns)' counts the runs' loads logged (`tamrun.data.table.Table.read`)."""
    return [int(r.getMessage().split(" x ")[1].split()[0]) for r in caplog.records
            if r.getMessage().startswith("loaded ") and " columns from " in r.getMessage()]


def test_the_raw_table_holds_the_date_the_load_and_the_temperature_only(raw):
    frame = pd.read_csv(raw)
    assert tuple(frame.columns) == RAW_NATIONAL_COLUMNS == ("date", "Load", "temperature")
    assert len(frame) == 227_904 and frame["date"].iloc[0] == "2013-01-01 00:00:00"


@pytest.mark.parametrize("model", ["fourier", pytest.param("spline", marks=pytest.mark.slow)])
def test_a_national_preset_scores_on_the_raw_table_what_it_scores_on_the_embedded_one(compose_cfg, raw, model,
                                                                                       caplog):
    caplog.set_level(logging.INFO, logger="tamrun.data.load")
    embedded = run(compose_cfg(f"model={model}", *QUIET))
    from_raw = run(compose_cfg(f"model={model}", *QUIET, "data=csv", f"data.path={raw}", "data.target=Load"))
    assert from_raw.metrics["rmse_test"] == pytest.approx(embedded.metrics["rmse_test"], rel=1e-6)
    assert from_raw.metrics["rmse_train"] == pytest.approx(embedded.metrics["rmse_train"], rel=1e-6)
    assert 1500 < embedded.metrics["rmse_test"] < 1700  # the preset's figure (docs/benchmarks.md), not a broken fit
    # one system per half-hour on either table, the group read from the date (data.group=tod, derived)
    assert embedded.groups == from_raw.groups == list(range(48))
    # the embedded file's made columns are not read: date, Load and temperature from either file
    assert loaded_columns(caplog) == [3, 3]


@pytest.mark.slow
def test_the_day_ahead_experiment_scores_on_the_raw_table_what_it_scores_on_the_embedded_one(compose_cfg, raw):
    """The Kalman experiment: its holidays (skip_updates reads day_type_jf) come from data.holidays=FR."""
    embedded = run(compose_cfg("+experiment=day_ahead", *QUIET))
    from_raw = run(compose_cfg("+experiment=day_ahead", *QUIET, "data=csv", f"data.path={raw}", "data.target=Load"))
    for metric in ("rmse_test", "rmse_validation"):
        assert from_raw.metrics[metric] == pytest.approx(embedded.metrics[metric], rel=1e-6), metric


def test_a_user_s_own_group_wins_over_the_preset_s(compose_cfg, raw):
    config, _ = typed_config(compose_cfg("model=spline_lags", "data=csv", f"data.path={raw}", "data.target=Load",
                                         "data.group=site"))
    assert config.data.group == "site" and config.data.derived["Load_d1"].column == "Load"
    config, _ = typed_config(compose_cfg("model=spline_lags", "data=csv", f"data.path={raw}", "data.target=y"))
    assert config.data.group == "tod" and config.data.derived["Load_d7"].column == "y"  # the lag of the target


def test_a_derived_group_is_refused_for_a_stream_naming_data_group(compose_cfg, raw):
    """A table that must stream under memory.limit (memory.data_in_limit): a chunk reads its groups by the file's
    group column, which a raw table lacks (its tod is read from the date): refused before the file is scanned."""
    with pytest.raises(ConfigError) as refused:
        run(compose_cfg("model=spline", *QUIET, "data=csv", f"data.path={raw}", "data.target=Load",
                        "memory.limit=2MiB", "memory.data_in_limit=true"))
    assert refused.value.field == "data.group" and refused.value.value == "tod"
    assert "its groups are derived (data.derived.tod)" in str(refused.value)
    assert "give the file a group column and set data.group to it" in str(refused.value)


NATIONAL = ["model=" + name for name in ("fourier", "fourier_holidays", "fourier_lags", "spline", "spline_holidays",
                                         "spline_lags", "forest", "forest_big", "forest_fourier", "static_day_ahead")]
EXPERIMENTS = ["+experiment=" + name for name in ("day_ahead", "day_ahead_static", "day_ahead_aggregate",
                                                  "day_ahead_aggregate_pool", "tune_penalties")]


@pytest.mark.parametrize("choice", [*NATIONAL, *EXPERIMENTS])
def test_every_national_preset_and_experiment_derives_the_same_data_from_the_raw_table(compose_cfg, raw, choice):
    """Composed by Hydra for the embedded table and for the raw one: the same derived columns, group, holidays,
    time zone and NaN policy, and every column an effect reads is derived (none read from the file's made
    copies): the runs read the same rows from date, Load and temperature (the scores of a few are compared
    above)."""
    embedded, specs = typed_config(compose_cfg(choice))
    from_raw, _ = typed_config(compose_cfg(choice, "data=csv", f"data.path={raw}", "data.target=Load"))
    keys = ("derived", "group", "holidays", "timezone", "nan_policy", "target", "date_column")
    assert {key: getattr(from_raw.data, key) for key in keys} == {key: getattr(embedded.data, key) for key in keys}
    read = set(effect_columns(specs).values())
    assert read <= set(embedded.data.derived) | set(RAW_NATIONAL_COLUMNS), read - set(embedded.data.derived)
