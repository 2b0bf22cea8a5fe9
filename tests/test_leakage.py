"""Guards against silent nonsense: an effect on the target (or on a copy of it) is refused; a model
column constant within some groups is named in a warning, or refused with data.constant_in_group=error;
an objective that names no scored split is refused before the run. Real runs on the synthetic CSV."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tamrun.errors import DataError
from tamrun.runner import run

from conftest import csv_overrides, synthetic_frame


def test_an_effect_on_the_target_is_refused(compose_cfg, csv_path):
    with pytest.raises(DataError, match=r"model.effects.leak.column='y': the column is the target column itself"):
        run(compose_cfg(*csv_overrides(csv_path), "+model.effects.leak={kind: linear, column: y}", "tracking=none"))


def test_an_effect_on_a_copy_of_the_target_is_refused(compose_cfg, tmp_path):
    frame = synthetic_frame()
    frame["y_copy"] = frame["y"]
    path = tmp_path / "copy.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"'y_copy': the column holds exactly the values of the target 'y'"):
        run(compose_cfg(*csv_overrides(path), "+model.effects.leak={kind: linear, column: y_copy}", "tracking=none"))


def constant_in_group_zero(tmp_path: Path) -> Path:
    frame = synthetic_frame()
    frame.loc[frame["g"] == 0, "x"] = 1.5  # x says nothing in group 0
    path = tmp_path / "flat.csv"
    frame.to_csv(path, index=False)
    return path


def test_a_column_constant_within_a_group_is_named_in_a_warning(compose_cfg, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tamrun.data.checks")
    result = run(compose_cfg(*csv_overrides(constant_in_group_zero(tmp_path)), "tracking=none"))
    assert "model.effects.sx.column='x': the column is constant within 1 of 3 group(s)" in caplog.text
    assert result.metrics["rmse_test"] > 0


def test_data_constant_in_group_error_refuses_it(compose_cfg, tmp_path):
    with pytest.raises(DataError, match=r"constant within 1 of 3 group\(s\) of the training split \(e.g. \[0\]\)"):
        run(compose_cfg(*csv_overrides(constant_in_group_zero(tmp_path)), "tracking=none",
                        "data.constant_in_group=error"))


@pytest.mark.parametrize("field,objective,fix", [("objective", "rmse_tset", "use one of: rmse_train, rmse_test"),
                                                 ("objective", "mape_validation", "set split.validation_start"),
                                                 ("more_objectives", "rmse_validation", "set split.validation_start")])
def test_an_objective_no_split_scores_is_refused_before_the_run(compose_cfg, csv_path, store_uri, field, objective,
                                                                fix):
    from tamrun.errors import ConfigError

    setting = f"objective={objective}" if field == "objective" else f"more_objectives=[cost_usd,{objective}]"
    with pytest.raises(ConfigError, match=rf"{field}='{objective}': this run scores no split.*{fix}"):
        run(compose_cfg(*csv_overrides(csv_path), setting))
    assert not Path(store_uri.removeprefix("sqlite:///")).exists()  # no MLflow run was started
