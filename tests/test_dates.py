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


# --- dates as people write them (issue 35): data.date_format, data.dayfirst, one format per file

def day_first(tmp_path: Path, layout: str = "%d/%m/%Y %H:%M") -> Path:
    """The synthetic table with its dates written day first (31/12/2020 23:00)."""
    frame = synthetic_frame()
    frame["date"] = frame["date"].dt.strftime(layout)
    return write(frame, tmp_path / "day_first.csv")


def test_day_first_dates_are_refused_in_one_line_naming_the_value_the_format_and_the_settings(compose_cfg,
                                                                                               tmp_path):
    """The first date, 01/01/2020, reads month first: the 13th of January is the first value that does not
    fit (row 288 of the file, hour 0 of day 13: line 290). Before, pandas' four-line message quoted
    format= and dayfirst= hints that no setting passed on."""
    with pytest.raises(DataError) as refused:
        run(compose_cfg(*csv_overrides(day_first(tmp_path)), "tracking=none"))
    assert str(refused.value) == (
        "data.date_column='date': the value '13/01/2020 00:00' at line 290 of the file is not a date in the format "
        "tried ('%m/%d/%Y %H:%M', read from the first date '01/01/2020 00:00' with data.dayfirst=false). Fix: set "
        "data.date_format='%d/%m/%Y %H:%M' (the format of '13/01/2020 00:00'), or data.dayfirst=true")
    assert "\n" not in refused.value.report_line().rstrip("\n")


@pytest.mark.parametrize("setting", ["data.dayfirst=true", "data.date_format='%d/%m/%Y %H:%M'"])
def test_day_first_dates_fit_as_the_iso_file_with_either_setting(compose_cfg, tmp_path, setting):
    expected = run(compose_cfg(*csv_overrides(write(synthetic_frame(), tmp_path / "iso.csv")), "tracking=none"))
    read = run(compose_cfg(*csv_overrides(day_first(tmp_path)), "tracking=none", setting))
    assert torch.equal(read.coef, expected.coef)
    assert read.metrics["rmse_test"] == expected.metrics["rmse_test"]


def test_dayfirst_never_reads_iso_dates_day_first(compose_cfg, tmp_path):
    """pandas reads 2020-02-01 as 2 January under dayfirst=True; tamrun reads a date that starts with
    the year as ISO 8601 whatever data.dayfirst says."""
    iso = write(synthetic_frame(), tmp_path / "iso.csv")
    expected = run(compose_cfg(*csv_overrides(iso), "tracking=none"))
    read = run(compose_cfg(*csv_overrides(iso), "tracking=none", "data.dayfirst=true"))
    assert torch.equal(read.coef, expected.coef) and read.metrics["n_train_rows"] == expected.metrics["n_train_rows"]


def test_every_block_is_read_in_the_first_date_s_format(compose_cfg, tmp_path):
    """Read in blocks of 100 rows, the block that starts on 13/01/2020 would be guessed day first alone
    (13 is no month) while the first block was read month first: one format for the whole file refuses
    the file rather than read it half one way, half the other."""
    with pytest.raises(DataError, match=r"the value '13/01/2020 00:00' at line 290 of the file"):
        run(compose_cfg(*csv_overrides(day_first(tmp_path)), "tracking=none", "data.read_chunk_rows=100"))


def test_a_date_format_that_does_not_fit_names_itself_and_both_readings(compose_cfg, tmp_path):
    with pytest.raises(DataError) as refused:
        run(compose_cfg(*csv_overrides(day_first(tmp_path)), "tracking=none", "data.date_format='%Y-%m-%d'"))
    assert str(refused.value) == (
        "data.date_column='date': the value '01/01/2020 00:00' at line 2 of the file is not a date in the format "
        "tried ('%Y-%m-%d', data.date_format). Fix: set data.date_format='%d/%m/%Y %H:%M' if '01/01/2020 00:00' "
        "is day first, or '%m/%d/%Y %H:%M' if month first")
