"""The calendar from the timestamp (issue 59; docs/own_data.md): derived columns of kind calendar and holiday,
in the table's local time (data.timezone), and the preset model=calendar.

Real tables of tamrun.bench.sites (hourly load of a few sites, French public holidays in the load), written as
CSV and Parquet, with UTC offsets or as naive local wall times; real ``python -m tamrun`` runs into a sqlite
store of the test's own. The local times are checked against values worked out by hand: in Europe/Paris the
clocks went forward on 2022-03-27 at 02:00 (to 03:00) and back on 2022-10-30 at 03:00 (to 02:00).
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tamrun.bench.sites import hourly_sites, write_sites
from tamrun.config.load import typed_config
from tamrun.config.schema import DataConfig, DataSource, DerivedColumn
from tamrun.data.calendar import Calendar, calendar_column, table_step
from tamrun.data.table import read_table
from tamrun.errors import ConfigError, DataError
from tamrun.pipeline import load_splits
from tamrun.tracking.model_state import load_state

from test_secrets import tamrun

PARIS = "Europe/Paris"
PARTS = ["time_of_day", "hour", "day_of_week", "day_of_year", "year_fraction", "week", "month", "weekend", "day_off"]
DERIVED = {part: DerivedColumn(kind="calendar", part=part) for part in PARTS}
# The preset's run on two sites: 2021 trains, the first quarter of 2022 is tested.
RUN = ["data=csv", "data.target=load", "data.group=site", "model=calendar", "data.holidays=FR",
       f"data.timezone={PARIS}", "+model.effects.temp={kind: spline, column: temperature, k: 8}",
       "split.train_start=2021-01-01", "split.train_end=2021-12-31", "split.test_start=2022-01-01",
       "split.test_end=2022-03-31", "tracking.log_plots=false", "progress=off", "hw=cpu"]
# The generator's noise: AR(1) of sd 1.5 % of each site's level (120 and 80 MW): sqrt(mean(1.8^2, 1.2^2)).
NOISE_RMSE = 1.53


def table_of(path: Path, **fields) -> pd.DataFrame:
    """The table at ``path`` as a run reads it (dates in UTC under data.timezone), its calendar columns added."""
    from tamrun.data.derive import add_derived_columns

    cfg = DataConfig(source=DataSource.file, path=str(path), target="load", group="site", derived=DERIVED, **fields)
    frame = read_table(cfg).frame
    return add_derived_columns(frame, DERIVED, "date", None, Calendar.of(cfg, frame["date"]))


def row(frame: pd.DataFrame, utc: str, site: str = "site_1") -> pd.Series:
    (found,) = frame.index[(frame["date"] == pd.Timestamp(utc)) & (frame["site"] == site)]
    return frame.loc[found]


@pytest.fixture(scope="module")
def dst(tmp_path_factory) -> dict:
    """Two sites, the weekends of both clock changes of 2022, written with offsets and as naive local times."""
    folder = tmp_path_factory.mktemp("dst")
    frame = pd.concat([hourly_sites(sites=2, start="2022-03-26", end="2022-03-27"),
                       hourly_sites(sites=2, start="2022-10-29", end="2022-10-30")], ignore_index=True)
    return {"frame": frame, "offsets": write_sites(frame, folder / "offsets.csv"),
            "naive": write_sites(frame, folder / "naive.csv", local_naive=True),
            "parquet": write_sites(frame, folder / "naive.parquet", local_naive=True), "folder": folder}


# ---- time zones and clock changes ------------------------------------------------------------------------


def test_the_repeated_hour_is_two_rows_and_the_parts_are_local(dst):
    """Naive local times: 02:00 on 2022-10-30 reads twice, summer time (00:00 UTC) then winter time (01:00
    UTC); both are 2 o'clock of a Sunday. On 2022-03-27 local 03:00 follows 01:00 (01:00 UTC)."""
    frame = table_of(dst["naive"], timezone=PARIS, holidays="FR")
    assert len(frame) == len(dst["frame"]) == 2 * (24 + 23 + 24 + 25) and not frame.duplicated(["date", "site"]).any()
    for utc, hour in (("2022-10-30 00:00", 2), ("2022-10-30 01:00", 2), ("2022-10-30 02:00", 3),
                      ("2022-10-29 22:00", 0), ("2022-03-27 00:00", 1), ("2022-03-27 01:00", 3),
                      ("2022-03-26 23:00", 0)):
        found = row(frame, utc)
        assert (found["time_of_day"], found["hour"]) == (hour, hour), utc
        assert (found["day_of_week"], found["weekend"], found["day_off"]) == (6, 1, 1), utc
    saturday = row(frame, "2022-10-29 21:00")  # 23:00 local, Saturday 29 October: day 302, ISO week 43
    assert [saturday[p] for p in ("time_of_day", "day_of_week", "day_of_year", "week", "month")] == [23, 5, 302, 43, 10]
    assert table_step(frame["date"]) == pd.Timedelta(hours=1)
    raw = dst["frame"][dst["frame"]["site"] == "site_1"]
    first, second = raw.loc[raw["date"].dt.tz_localize(None) == pd.Timestamp("2022-10-30 02:00"), "load"]  # file order
    assert (row(frame, "2022-10-30 00:00")["load"], row(frame, "2022-10-30 01:00")["load"]) == (first, second)


@pytest.mark.parametrize("written", ["offsets", "parquet"])
def test_offsets_and_naive_parquet_give_the_naive_csv_s_columns(dst, written):
    naive = table_of(dst["naive"], timezone=PARIS, holidays="FR")
    other = table_of(dst[written], timezone=PARIS, holidays="FR")
    pd.testing.assert_frame_equal(other[["date", "site", *PARTS]], naive[["date", "site", *PARTS]], check_dtype=False)


def test_without_a_time_zone_naive_dates_are_taken_as_they_are(dst):
    """The old behaviour: the repeated hour is a duplicate (refused by the run's duplicate check)."""
    from tamrun.config.schema import CheckPolicy
    from tamrun.data.checks import check_duplicate_dates

    frame = table_of(dst["naive"])
    assert frame.duplicated(["date", "site"]).sum() == 2
    assert row(frame, "2022-03-27 03:00")["time_of_day"] == 3
    with pytest.raises(DataError, match="2 row.s. repeat a date .first: 2022-10-30 02:00:00 in group 'site_1'.*set "
                                        "data.timezone to the table's zone if they are local times of the hour"):
        check_duplicate_dates(frame, "date", "site", CheckPolicy.error)


def test_offsets_without_a_time_zone_are_read_in_utc_with_a_warning(dst, caplog):
    with caplog.at_level("WARNING", logger="tamrun.data.dates"):
        frame = table_of(dst["offsets"])
    assert row(frame, "2022-10-30 00:00")["time_of_day"] == 0  # 02:00 in Paris, 00:00 in UTC
    assert "data.timezone is not set: they are read in UTC, and so are the calendar columns time_of_day" in caplog.text


def with_skipped_hour(naive: Path, path: Path) -> int:
    """``naive`` written to ``path`` with a row at 02:00 on 2022-03-27 (a local time the clocks skip) before
    the first at 03:00; its line in the file."""
    text = naive.read_text().splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("2022-03-27 03:00:00"))
    text.insert(at, text[at].replace("03:00:00", "02:00:00", 1))
    path.write_text("\n".join(text) + "\n")
    return at + 1


def test_a_local_time_the_clocks_skip_is_refused_naming_it_and_its_line(dst, tmp_path):
    line = with_skipped_hour(dst["naive"], tmp_path / "skipped.csv")
    path = tmp_path / "skipped.csv"
    with pytest.raises(DataError) as refused:
        table_of(path, timezone=PARIS)
    message = str(refused.value)
    assert f"'2022-03-27 02:00:00' at line {line} of the file is a local time that does not exist in " \
           f"data.timezone={PARIS}" in message and "Fix: " in message, message


# ---- the parts and the holidays ------------------------------------------------------------------------


def part_of(dates: List[str], spec: DerivedColumn, **calendar) -> List[float]:
    return calendar_column(pd.Series(pd.to_datetime(dates)), spec, "data.derived.x", Calendar(**calendar)).tolist()


def test_the_parts_of_hand_picked_dates():
    dates = ["2024-02-29 23:30", "2021-01-03 00:00", "2020-12-31 12:30"]
    assert part_of(dates, DerivedColumn(kind="calendar", part="time_of_day"), step_seconds=1800.0) == [47, 0, 25]
    assert part_of(dates, DerivedColumn(kind="calendar", part="day_of_week")) == [3, 6, 3]
    assert part_of(dates, DerivedColumn(kind="calendar", part="day_of_year")) == [60, 3, 366]
    assert part_of(dates, DerivedColumn(kind="calendar", part="year_fraction")) == [60 / 366, 3 / 365, 1.0]
    assert part_of(dates, DerivedColumn(kind="calendar", part="week")) == [9, 53, 53]  # ISO: 3 Jan 2021 ends week 53
    assert part_of(dates, DerivedColumn(kind="calendar", part="month")) == [2, 1, 12]
    assert part_of(dates, DerivedColumn(kind="calendar", part="weekend")) == [0, 1, 0]
    # in UTC, read in Paris: 23:30 UTC on 29 February is 00:30 on 1 March, a Friday
    assert part_of(["2024-02-29 23:30"], DerivedColumn(kind="calendar", part="day_of_year"), timezone=PARIS) == [61]


def test_public_holidays_bridge_days_and_a_region_s_own():
    """FR: 14 July 2022; Ascension, Thursday 26 May 2022 (Friday 27 a bridge); All Saints, Tuesday 1 November
    2022 (Monday 31 October a bridge). DE-BY: Epiphany, 6 January, not a holiday in Berlin."""
    days = ["2022-07-14", "2022-07-13", "2022-05-26", "2022-05-27", "2022-10-31", "2022-11-01", "2022-11-02"]
    holiday = DerivedColumn(kind="holiday")
    assert part_of(days, holiday, country="FR") == [1, 0, 1, 0, 0, 1, 0]
    assert part_of(days, DerivedColumn(kind="holiday", bridge=True), country="FR") == [1, 0, 1, 1, 1, 1, 0]
    off = DerivedColumn(kind="calendar", part="day_off")
    assert part_of(["2022-07-14 12:00", "2022-07-16 12:00", "2022-07-15 12:00"], off, country="FR") == [1, 1, 0]
    assert part_of(["2022-07-14 12:00", "2022-07-16 12:00"], off) == [0, 1]  # no country: the weekend
    assert part_of(["2022-01-06"], holiday, country="DE", subdivision="BY") == [1]
    assert part_of(["2022-01-06"], holiday, country="DE", subdivision="BE") == [0]


@pytest.mark.parametrize("overrides, field, words", [
    (["+data.derived.x={kind: calendar, part: fortnight}"], "data.derived.x.part='fortnight'", "time_of_day"),
    (["data.timezone=Europe/Pari"], "data.timezone='Europe/Pari'", "IANA"),
    (["data.holidays=fr"], "data.holidays='fr'", "data.holidays=FR"),
    (["data.holidays=DE", "data.holiday_subdivision=ZZ"], "data.holiday_subdivision='ZZ'", "BY"),
    (["+data.derived.x={kind: holiday}", "data.holidays=null"], "data.holidays=None", "data.holidays=FR"),
    (["+data.derived.x={kind: calendar, part: month, bridge: true}"], "data.derived.x.bridge=True", "holiday"),
    (["data.timezone=Europe/Paris", "mode=adaptive"], "data.timezone='Europe/Paris'", "mode=run"),
], ids=["part", "timezone", "country-case", "subdivision", "holiday-without-country", "bridge", "adaptive"])
def test_bad_calendar_settings_are_refused_before_any_data(compose_cfg, overrides, field, words):
    with pytest.raises(ConfigError) as refused:
        typed_config(compose_cfg(*overrides))
    message = str(refused.value)
    assert field in message and words in message and "Fix: " in message, message


def test_the_preset_declares_its_columns_and_they_come_from_the_date(compose_cfg, dst):
    config, specs = typed_config(compose_cfg(*RUN, f"data.path={dst['naive']}", "split.train_start=2022-03-26",
                                             "split.train_end=2022-03-27", "split.test_start=2022-10-29",
                                             "split.test_end=2022-10-30", "data.constant_features=warn"))
    splits = load_splits(config, specs)
    assert splits.recipe.calendar == Calendar(PARIS, "FR", None, 3600.0)
    sunday = splits.train[splits.train["date"] >= pd.Timestamp("2022-03-26 23:00")]  # local 27 March
    assert sorted(set(sunday["time_of_day"])) == sorted(set(range(24)) - {2}) and len(sunday) == 2 * 23
    sunday = splits.test[splits.test["date"] >= pd.Timestamp("2022-10-29 22:00")]  # local 30 October
    assert len(sunday) == 2 * 25 and len(sunday[sunday["time_of_day"] == 2]) == 4  # twice in each site


# ---- real runs -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The preset on the same 2-site table as a CSV with offsets and as Parquet of naive local times."""
    folder = tmp_path_factory.mktemp("calendar_runs")
    frame = hourly_sites(sites=2, start="2021-01-01", end="2022-03-31")
    store = f"sqlite:///{folder / 'mlflow.db'}"
    found = {"folder": folder, "store": store, "frame": frame}
    for name, path in (("csv", write_sites(frame, folder / "sites.csv")),
                       ("parquet", write_sites(frame, folder / "sites.parquet", local_naive=True))):
        done = tamrun([*RUN, f"data.path={path}", f"tracking.uri={store}", f"tracking.run_name={name}"],
                      folder / name, {}, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        found[name] = done
    return found


def finished(store: str) -> dict:
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("tamrun").experiment_id
    return {run.info.run_name: run for run in client.search_runs([experiment]) if run.info.status == "FINISHED"}


def test_the_preset_reaches_the_noise_on_csv_and_parquet_alike(runs):
    found = finished(runs["store"])
    csv, parquet = found["csv"].data.metrics, found["parquet"].data.metrics
    assert csv["rmse_test"] < 1.2 * NOISE_RMSE, csv["rmse_test"]
    assert parquet["rmse_test"] == pytest.approx(csv["rmse_test"], rel=1e-9)
    assert parquet["rmse_train"] == pytest.approx(csv["rmse_train"], rel=1e-9)
    assert "the split's dates pushed down" in runs["parquet"].stdout + runs["parquet"].stderr


def test_the_served_model_reads_local_times_as_the_run_did(runs):
    """The logged model's calendar (time zone, holidays, step) makes the same columns of rows written in local
    time without offsets: around the clocks going forward, its forecasts are the run's."""
    import mlflow

    client = MlflowClient(tracking_uri=runs["store"])
    run = finished(runs["store"])["csv"]
    (logged,) = [m for m in client.search_logged_models([run.info.experiment_id]) if m.source_run_id == run.info.run_id]
    state = Path(logged.artifact_location.removeprefix("file://")) / "data" / "fitted"
    model = load_state(state)
    frame = runs["frame"]
    rows = frame[(frame["date"] >= pd.Timestamp("2022-03-26", tz=PARIS)) & (frame["date"] < pd.Timestamp("2022-03-29", tz=PARIS))]
    local = rows.assign(date=rows["date"].dt.tz_localize(None).astype(str))
    served = model.predict_values(local.drop(columns=["load"]).reset_index(drop=True))
    table = pd.read_parquet(mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="predictions/predictions.parquet", tracking_uri=runs["store"]))
    expected = table.set_index(["date", "group"])["predicted"].loc[
        list(zip(rows["date"].dt.tz_convert("UTC").dt.tz_localize(None), rows["site"]))].to_numpy()
    np.testing.assert_allclose(np.asarray(served, dtype=np.float64).ravel(), expected, rtol=1e-9, atol=0)


def test_a_skipped_hour_and_an_unknown_country_end_the_run_with_exit_2(dst, tmp_path):
    path = tmp_path / "skipped.csv"
    with_skipped_hour(dst["naive"], path)
    store = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"
    done = tamrun([*RUN, f"data.path={path}", store], tmp_path / "a", {}, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "tamrun: data error: data.date_column='date': the value '2022-03-27 02:00:00' at line" in done.stderr
    done = tamrun([*RUN, f"data.path={path}", store, "data.holidays=XX"], tmp_path / "b", {}, timeout=300)
    assert done.returncode == 2 and "tamrun: config error: data.holidays='XX': not a country the holidays package " \
                                    "knows" in done.stderr, done.stderr[-3000:]


def test_a_streamed_run_reads_local_times_as_the_whole_run(compose_cfg, tmp_path):
    """Six sites of naive local times across the October change, streamed one site a chunk (Parquet, the
    split's local days pushed down; memory.limit as tests/test_stream.py): the whole run's metrics."""
    from tamrun.runner import run

    path = write_sites(hourly_sites(sites=6, start="2022-10-15", end="2022-11-14"), tmp_path / "t.parquet",
                       local_naive=True)
    args = ["data=csv", f"data.path={path}", "data.target=load", "data.group=site", "model=custom",
            f"data.timezone={PARIS}", "data.holidays=FR", "hw=cpu", "progress=off", "tracking.log_plots=false",
            "tracking.log_model=false", "split.train_start=2022-10-15", "split.train_end=2022-10-31",
            "split.test_start=2022-11-01", "split.test_end=2022-11-14",
            "+data.derived.tod={kind: calendar, part: time_of_day}", "+data.derived.off={kind: calendar, part: day_off}",
            "+model.effects.tod={kind: categorical, column: tod, topo: cyclic, ap: -6}",
            "+model.effects.off={kind: categorical, column: off, ap: -6}",
            "+model.effects.temp={kind: spline, column: temperature, k: 6}"]
    whole = run(compose_cfg(*args))
    streamed = run(compose_cfg(*args, "memory.limit=2MiB", "memory.data_in_limit=true"))
    assert "stream_chunks" not in whole.metrics and streamed.metrics["stream_chunks"] >= 2
    assert whole.metrics["n_train_rows"] == 6 * (17 * 24 + 1)  # 30 October's 25 hours
    for name in ("rmse_train", "rmse_test", "mape_test"):
        assert streamed.metrics[name] == pytest.approx(whole.metrics[name], rel=1e-9), name


def test_split_days_are_local_midnights_even_where_the_clocks_change_at_midnight():
    """Paris's days start at 23:00 or 22:00 UTC; Havana's clocks change at midnight: 6 November 2022 starts at
    its first midnight (04:00 UTC, still summer time), 13 March at 01:00 (the midnight it skips)."""
    from tamrun.data.dates import table_time

    days = pd.DatetimeIndex(["2022-10-30", "2022-10-31", "2022-03-27"])
    assert table_time(days, PARIS).tolist() == [pd.Timestamp(t) for t in ("2022-10-29 22:00", "2022-10-30 23:00",
                                                                          "2022-03-26 23:00")]
    havana = table_time(pd.DatetimeIndex(["2022-11-06", "2022-03-13"]), "America/Havana")
    assert havana.tolist() == [pd.Timestamp("2022-11-06 04:00"), pd.Timestamp("2022-03-13 05:00")]


def test_parquet_timestamps_with_a_zone_are_filtered_on_local_days(dst, tmp_path):
    """The split's local days pushed down to a column of zoned timestamps (their UTC instants) and to one of
    naive local times keep the same rows: local 30 October 2022, 25 hours a site."""
    from tamrun.config.schema import SplitConfig
    from tamrun.data.parquet import DateWindow

    zoned = tmp_path / "zoned.parquet"
    dst["frame"].to_parquet(zoned, index=False)
    window = DateWindow.of(SplitConfig(train_start="2022-10-30", train_end="2022-10-30", test_start="2022-10-31",
                                       test_end="2022-10-31"), PARIS)
    read = {}
    for name, path in (("zoned", zoned), ("naive", dst["parquet"])):
        cfg = DataConfig(source=DataSource.file, path=str(path), target="load", group="site", timezone=PARIS)
        loaded = read_table(cfg, window=window)
        assert loaded.parquet.pushed_down, name
        read[name] = loaded.frame
    assert len(read["zoned"]) == 2 * 25
    pd.testing.assert_frame_equal(read["zoned"], read["naive"], check_dtype=False)
