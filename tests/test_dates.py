"""Timestamps with UTC offsets (one table may mix them, as local summer and winter time do) are
converted to UTC; blank dates are refused under data.nan_policy=error and dropped under drop. Real
runs on the synthetic CSV."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest
import torch

from tamrun.errors import DataError
from tamrun.runner import run

from conftest import csv_overrides, synthetic_frame


def write(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


def test_mixed_utc_offsets_fit_as_the_same_instants_in_utc(compose_cfg, tmp_path):
    frame = synthetic_frame()
    utc = write(frame, tmp_path / "utc.csv")
    local = frame.copy()
    local["date"] = frame["date"].dt.tz_localize("UTC").dt.tz_convert("Europe/Paris").map(lambda t: t.isoformat())
    assert local["date"].str.endswith("+01:00").any() and local["date"].str.endswith("+02:00").any()
    paris = write(local, tmp_path / "paris.csv")
    expected = run(compose_cfg(*csv_overrides(utc), "tracking=none"))
    converted = run(compose_cfg(*csv_overrides(paris), "tracking=none"))
    assert torch.equal(converted.coef, expected.coef)
    assert converted.metrics["rmse_test"] == expected.metrics["rmse_test"]


def blank_dates(tmp_path: Path) -> Path:
    frame = synthetic_frame().astype({"date": str})
    frame.loc[[5, 17, 400], "date"] = ""
    return write(frame, tmp_path / "blank.csv")


def test_blank_dates_are_refused_by_default_naming_how_many(compose_cfg, tmp_path):
    with pytest.raises(DataError, match=r"data.date_column='date': 3 row\(s\) have no date.*nan_policy=drop"):
        run(compose_cfg(*csv_overrides(blank_dates(tmp_path)), "tracking=none"))


def test_blank_dates_are_dropped_under_nan_policy_drop(compose_cfg, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tamrun.data.load")
    result = run(compose_cfg(*csv_overrides(blank_dates(tmp_path)), "tracking=none", "data.nan_policy=drop"))
    assert "dropping 3 row(s) without a date" in caplog.text
    assert result.metrics["n_train_rows"] + result.metrics["n_test_rows"] == len(synthetic_frame()) - 3


def test_blank_dates_are_found_at_their_file_line_whatever_the_read_block(compose_cfg, tmp_path):
    """The file is read in blocks of data.read_chunk_rows rows: a blank date in the third block of
    100 rows is reported at its own line of the file (row 250 + the header = line 252)."""
    frame = synthetic_frame().astype({"date": str})
    frame.loc[[250, 251], "date"] = ""
    path = write(frame, tmp_path / "blank.csv")
    with pytest.raises(DataError, match=r"2 row\(s\) have no date \(first at line 252 of the file\)"):
        run(compose_cfg(*csv_overrides(path), "tracking=none", "data.read_chunk_rows=100"))
