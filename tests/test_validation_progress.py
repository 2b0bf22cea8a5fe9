"""The validation split carved out of training, and progress reporting without a terminal."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from tamrun.config.schema import SplitConfig
from tamrun.data.split import carve_validation
from tamrun.errors import ConfigError, DataError
from tamrun.progress import ChunkProgress, IterationProgress

from conftest import synthetic_frame


def test_the_validation_period_leaves_training_and_never_touches_the_test_period():
    frame = synthetic_frame(days=400)
    train = frame[frame["date"] < "2021-01-01"]
    cfg = SplitConfig(train_end="2020-12-31", test_start="2021-01-01", validation_start="2020-12-01")
    fit, validation = carve_validation(train, cfg, "date")
    assert validation["date"].min() == pd.Timestamp("2020-12-01")
    assert validation["date"].max() == pd.Timestamp("2020-12-31 23:00")
    assert fit["date"].max() < pd.Timestamp("2020-12-01") and len(fit) + len(validation) == len(train)
    same, none = carve_validation(train, SplitConfig(), "date")  # no validation split
    assert same is train and none is None


@pytest.mark.parametrize("start,end,error,field", [
    ("2020-12-01", "2021-01-15", ConfigError, "split.validation_end"),   # reaches into the test period
    ("2020-12-01", "2020-11-01", ConfigError, "split.validation_end"),   # ends before it starts
    ("2020-13-01", None, ConfigError, "split.validation_start"),         # not a date
    ("2019-01-01", "2019-12-31", DataError, "split.validation_start"),   # no rows there
])
def test_a_bad_validation_period_names_the_field(start, end, error, field):
    train = synthetic_frame(days=366)
    cfg = SplitConfig(train_end="2020-12-31", test_start="2021-01-01", validation_start=start, validation_end=end)
    with pytest.raises(error, match=field):
        carve_validation(train, cfg, "date")


def test_progress_without_a_terminal_is_plain_log_lines(caplog):
    caplog.set_level(logging.INFO, logger="tamrun.progress")
    chunks = ChunkProgress(mode="log")
    for last in (15, 31, 47):
        chunks("fit/direct", last + 1, 48)
    iterations = IterationProgress(max_iter=100, mode="log")
    for i, residual in enumerate((1e-1, 1e-3, 1e-7), start=1):
        iterations(i, residual)
    iterations.close()
    lines = [r.getMessage() for r in caplog.records]
    assert "fit/direct: 48/48 groups" in lines
    assert "CG: 3/100 iterations (residual 1.00e-07)" in lines
    silent = ChunkProgress(mode="off")
    caplog.clear()
    silent("fit/direct", 4, 4)
    assert not caplog.records
