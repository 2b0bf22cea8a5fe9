"""Derived columns that read earlier rows (issue 60; docs/own_data.md, "Columns from earlier rows"): kinds lag,
rolling and smooth, per group in time order.

Against references worked out apart (pandas' shift, rolling and ewm on naive times; a row-by-row reference with
Python's zoneinfo across the clock changes of Europe/Paris: forward on 2022-03-27 at 02:00, back on 2022-10-30
at 03:00), on real tables of tamrun.bench.sites with rows missing; the no-peeking run (a target moved on one
test day changes no forecast of that day); the refusals; streamed and Parquet runs against the whole CSV run;
the fitted model's refusal of rows without their history.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides, synthetic_frame
from tamrun.__main__ import main
from tamrun.bench.sites import hourly_sites, write_sites
from tamrun.config.schema import DataConfig, DataSource, DerivedColumn
from tamrun.data.calendar import Calendar
from tamrun.data.derive import add_derived_columns
from tamrun.data.table import Table, read_table
from tamrun.errors import DataError
from tamrun.tracking.model_state import load_state

from test_secrets import tamrun

PARIS = "Europe/Paris"
ZONE = zoneinfo.ZoneInfo(PARIS)


def derived(frame: pd.DataFrame, specs: Dict[str, DerivedColumn], timezone: Optional[str],
            group: Optional[str] = "site") -> pd.DataFrame:
    return add_derived_columns(frame, specs, "date", None, Calendar(timezone), group)


@pytest.fixture(scope="module")
def dst(tmp_path_factory) -> dict:
    """Two sites around both clock changes of 2022, naive local times, one row in seven missing (gaps), read as
    a run reads them (dates in UTC under data.timezone), in the run's (date, site) order."""
    folder = tmp_path_factory.mktemp("history")
    frame = pd.concat([hourly_sites(sites=2, start="2022-03-18", end="2022-04-04"),
                       hourly_sites(sites=2, start="2022-10-22", end="2022-11-06")], ignore_index=True)
    frame = frame[np.random.default_rng(1).random(len(frame)) > 1 / 7].reset_index(drop=True)
    path = write_sites(frame, folder / "gaps.csv", local_naive=True)
    cfg = DataConfig(source=DataSource.file, path=str(path), target="load", group="site", timezone=PARIS)
    return {"utc": read_table(cfg).frame, "naive": read_table(DataConfig(
        source=DataSource.file, path=str(write_sites(frame.assign(date=frame["date"].dt.tz_convert("UTC")),
                                                     folder / "utc.csv", local_naive=True)),
        target="load", group="site")).frame}


# ---- references ------------------------------------------------------------------------------------------


def local_of(utc: pd.Timestamp) -> dt.datetime:
    return utc.to_pydatetime().replace(tzinfo=dt.timezone.utc).astimezone(ZONE).replace(tzinfo=None)


def utc_of(local: dt.datetime, exact: bool) -> Optional[pd.Timestamp]:
    """A Paris wall time as naive UTC (its first reading when it reads twice); None when it does not exist and
    ``exact``, else the time after the skipped hour."""
    placed = local.replace(tzinfo=ZONE, fold=0)
    if placed.astimezone(dt.timezone.utc).astimezone(ZONE).replace(tzinfo=None) != local:  # skipped
        if exact:
            return None
        placed = (local + dt.timedelta(hours=1)).replace(tzinfo=ZONE, fold=0)
    return pd.Timestamp(placed.astimezone(dt.timezone.utc).replace(tzinfo=None))


def lag_reference(frame: pd.DataFrame, days: int) -> np.ndarray:
    """Row by row: the load of the row's site at the same Paris wall time ``days`` days earlier."""
    values = {(site, date): load for site, date, load in zip(frame["site"], frame["date"], frame["load"])}
    out = []
    for site, date in zip(frame["site"], frame["date"]):
        earlier = utc_of(local_of(date) - dt.timedelta(days=days), exact=True)
        out.append(values.get((site, earlier), np.nan) if earlier is not None else np.nan)
    return np.array(out)


def window_reference(frame: pd.DataFrame, stat: str, day: bool) -> np.ndarray:
    """Row by row: ``stat`` of the loads of the row's site in [t - 1 local day, t), or, under ``day``, in the
    previous local calendar day."""
    out = []
    for site, date in zip(frame["site"], frame["date"]):
        local = local_of(date)
        end = utc_of(dt.datetime.combine(local.date(), dt.time()), exact=False) if day else date
        start = utc_of((dt.datetime.combine(local.date(), dt.time()) if day else local) - dt.timedelta(days=1),
                       exact=False)
        rows = frame.loc[(frame["site"] == site) & (frame["date"] >= start) & (frame["date"] < end), "load"]
        out.append(getattr(rows, stat)() if len(rows) else np.nan)
    return np.array(out)


def per_site(frame: pd.DataFrame, compute) -> np.ndarray:
    """``compute(series indexed by date)`` of each site, put back in ``frame``'s row order."""
    out = np.full(len(frame), np.nan)
    for _, rows in frame.groupby("site"):
        ordered = rows.sort_values("date")
        out[ordered.index] = np.asarray(compute(ordered.set_index("date")["load"]), dtype=np.float64)
    return out


# ---- against the references ----------------------------------------------------------------------------


def test_lags_are_the_value_at_exactly_t_minus_by_across_gaps_and_clock_changes(dst):
    frame = dst["utc"]
    found = derived(frame, {"d1": DerivedColumn(kind="lag", column="load", by="1D"),
                            "d7": DerivedColumn(kind="lag", column="load", by="7D"),
                            "h2": DerivedColumn(kind="lag", column="load", by="2h")}, PARIS)
    np.testing.assert_array_equal(found["d1"].to_numpy(), lag_reference(frame, 1))
    np.testing.assert_array_equal(found["d7"].to_numpy(), lag_reference(frame, 7))
    assert np.isnan(found["d1"]).mean() > 0.1  # the gaps keep their meaning: never "k rows back"
    # a local day after the clocks go forward: 12:00 on 28 March (10:00 UTC) reads 12:00 on 27 March (10:00 UTC,
    # 23 hours earlier); 02:00 on 28 March reads a time that does not exist: NaN
    both = frame.set_index(["site", "date"])["load"]
    d1 = found.set_index(["site", "date"])["d1"]
    for site in ("site_1", "site_2"):
        noon, before = (site, pd.Timestamp("2022-03-28 10:00")), (site, pd.Timestamp("2022-03-27 10:00"))
        if noon in d1.index and before in both.index:
            assert d1.loc[noon] == both.loc[before]
        if (site, pd.Timestamp("2022-03-28 00:00")) in d1.index:
            assert np.isnan(d1.loc[(site, pd.Timestamp("2022-03-28 00:00"))])
    elapsed = per_site(frame, lambda s: s.shift(freq="2h").reindex(s.index))  # hours: elapsed time
    np.testing.assert_array_equal(found["h2"].to_numpy(), elapsed)


def test_without_a_time_zone_a_lag_is_pandas_shift_by_the_offset(dst):
    frame = dst["naive"]
    found = derived(frame, {"d1": DerivedColumn(kind="lag", column="load", by="1D"),
                            "w": DerivedColumn(kind="lag", column="load", by="1W")}, None)
    np.testing.assert_array_equal(found["d1"].to_numpy(), per_site(frame, lambda s: s.shift(freq="1D").reindex(s.index)))
    np.testing.assert_array_equal(found["w"].to_numpy(), per_site(frame, lambda s: s.shift(freq="7D").reindex(s.index)))


@pytest.mark.parametrize("stat", ["mean", "min", "max"])
def test_rolling_windows_match_pandas_and_the_local_days(dst, stat):
    naive = dst["naive"]
    found = derived(naive, {"r": DerivedColumn(kind="rolling", column="load", stat=stat, window="1D")}, None)
    reference = per_site(naive, lambda s: getattr(s.rolling("1D", closed="left"), stat)())
    np.testing.assert_allclose(found["r"].to_numpy(), reference, rtol=1e-12, atol=0)
    frame = dst["utc"]
    found = derived(frame, {"row": DerivedColumn(kind="rolling", column="load", stat=stat, window="1D"),
                            "day": DerivedColumn(kind="rolling", column="load", stat=stat, window="1D", align="day"),
                            "h24": DerivedColumn(kind="rolling", column="load", stat=stat, window="24h")}, PARIS)
    np.testing.assert_allclose(found["row"].to_numpy(), window_reference(frame, stat, day=False), rtol=1e-12, atol=0)
    np.testing.assert_allclose(found["day"].to_numpy(), window_reference(frame, stat, day=True), rtol=1e-12, atol=0)
    reference = per_site(frame, lambda s: getattr(s.rolling("24h", closed="left"), stat)())
    np.testing.assert_allclose(found["h24"].to_numpy(), reference, rtol=1e-12, atol=0)


def test_the_previous_day_s_mean_is_the_daily_mean_shifted_one_local_day(dst):
    frame = dst["utc"]
    found = derived(frame, {"prev": DerivedColumn(kind="rolling", column="load", window="1D", align="day")}, PARIS)
    day = frame["date"].dt.tz_localize("UTC").dt.tz_convert(PARIS).dt.tz_localize(None).dt.normalize()
    means = frame.groupby([frame["site"], day])["load"].mean()
    reference = means.reindex(list(zip(frame["site"], day - pd.Timedelta(days=1)))).to_numpy()
    np.testing.assert_allclose(found["prev"].to_numpy(), reference, rtol=1e-12, atol=0)


def test_smoothing_is_pandas_ewm_per_group_and_per_day(dst):
    frame = dst["utc"].copy()
    frame.loc[frame.index[[3, 40]], "load"] = np.nan  # a missing value leaves the smoothing as it was
    found = derived(frame, {"s": DerivedColumn(kind="smooth", column="load", factor=0.95),
                            "mx": DerivedColumn(kind="smooth", column="load", factor=0.9, daily="max")}, PARIS)
    reference = per_site(frame, lambda s: s.ewm(alpha=0.05, adjust=False, ignore_na=True).mean())
    np.testing.assert_allclose(found["s"].to_numpy(), reference, rtol=1e-12, atol=0)
    local = frame["date"].dt.tz_localize("UTC").dt.tz_convert(PARIS).dt.tz_localize(None).dt.normalize()
    days = frame.assign(day=local).groupby(["site", "day"])["load"].max()
    smoothed = days.groupby(level="site").transform(lambda s: s.ewm(alpha=0.1, adjust=False).mean())
    np.testing.assert_allclose(found["mx"].to_numpy(), smoothed.reindex(list(zip(frame["site"], local))).to_numpy(),
                               rtol=1e-12, atol=0)


def test_over_the_table_reads_every_row_in_one_time_order(dst):
    """Site 1 on even hours, site 2 on odd ones (one row per date, as the national table's half-hours): over
    the table a 1h lag reads the other site, within a group it finds no row."""
    frame = dst["naive"]
    hour = frame["date"].dt.hour
    frame = frame[(hour % 2 == 0) == (frame["site"] == "site_1")].reset_index(drop=True)
    found = derived(frame, {"t": DerivedColumn(kind="lag", column="load", by="1h", over="table"),
                            "g": DerivedColumn(kind="lag", column="load", by="1h"),
                            "s": DerivedColumn(kind="smooth", column="load", factor=0.5, over="table")}, None)
    series = frame.set_index("date")["load"]
    np.testing.assert_array_equal(found["t"].to_numpy(), series.shift(freq="1h").reindex(series.index).to_numpy())
    assert found["g"].isna().all()
    np.testing.assert_allclose(found["s"].to_numpy(), series.ewm(alpha=0.5, adjust=False).mean().to_numpy(),
                               rtol=1e-12, atol=0)
    with pytest.raises(DataError, match=r"data.derived.t.over='table': .* row\(s\) share a date"):
        derived(dst["naive"], {"t": DerivedColumn(kind="lag", column="load", by="1h", over="table")}, None)


def test_a_derived_column_reads_an_earlier_one_and_the_frame_keeps_its_order(dst):
    frame = dst["naive"].sample(frac=1.0, random_state=3)  # any order: computed sorted, put back
    specs = {"kelvin": DerivedColumn(kind="expr", expr="load + 273.15"),
             "k1": DerivedColumn(kind="lag", column="kelvin", by="1D")}
    found = derived(frame, specs, None)
    assert found.index.equals(frame.index)
    plain = derived(frame, {"d1": DerivedColumn(kind="lag", column="load", by="1D")}, None)
    np.testing.assert_allclose(found["k1"].to_numpy(), plain["d1"].to_numpy() + 273.15, rtol=1e-12)


# ---- what a run may see ---------------------------------------------------------------------------------


PEEK_RUN = ["data=csv", "data.target=load", "data.group=site", "model=calendar", "data.holidays=FR",
            f"data.timezone={PARIS}", "data.nan_policy=drop", "tracking.log_plots=false", "progress=off", "hw=cpu",
            "+data.derived.load_d1={kind: lag, column: load, by: 1D}",
            "+data.derived.load_d7={kind: lag, column: load, by: 7D}",
            "+data.derived.load_prev={kind: rolling, column: load, stat: mean, window: 1D, align: day}",
            "+model.effects.d1={kind: linear, column: load_d1}", "+model.effects.d7={kind: linear, column: load_d7}",
            "+model.effects.prev={kind: linear, column: load_prev}",  # linear: the moved day extrapolates
            "+model.effects.temp={kind: spline, column: temperature, k: 6}",
            "split.train_start=2022-01-10", "split.train_end=2022-02-28", "split.test_start=2022-03-01",
            "split.test_end=2022-03-20"]
MOVED_DAY = pd.Timestamp("2022-03-15")  # a Tuesday of the test period (local day)


def predictions_of(store: str, name: str) -> pd.DataFrame:
    import mlflow

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("tamrun").experiment_id
    (run,) = [r for r in client.search_runs([experiment]) if r.info.run_name == name]
    assert run.info.status == "FINISHED"
    table = pd.read_parquet(mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="predictions/predictions.parquet", tracking_uri=store))
    local = table["date"].dt.tz_localize("UTC").dt.tz_convert(PARIS).dt.tz_localize(None).dt.normalize()
    return table.assign(day=local, run_id=run.info.run_id).set_index(["date", "group"]).sort_index()


@pytest.fixture(scope="module")
def peeking(tmp_path_factory) -> dict:
    """The same run on the table as it is and with the load of every row of one test day moved by +1000."""
    folder = tmp_path_factory.mktemp("peek")
    frame = hourly_sites(sites=2, start="2022-01-01", end="2022-03-20")
    local_day = frame["date"].dt.tz_localize(None).dt.normalize()
    moved = frame.assign(load=np.where(local_day == MOVED_DAY, frame["load"] + 1000.0, frame["load"]))
    store = f"sqlite:///{folder / 'mlflow.db'}"
    for name, table in (("as_is", frame), ("moved", moved)):
        path = write_sites(table, folder / f"{name}.csv")
        done = tamrun([*PEEK_RUN, f"data.path={path}", f"tracking.uri={store}", f"tracking.run_name={name}"],
                      folder / name, {}, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    return {"store": store, "as_is": predictions_of(store, "as_is"), "moved": predictions_of(store, "moved"),
            "frame": frame}


def test_moving_the_target_of_one_day_changes_no_forecast_of_that_day(peeking):
    """The acceptance of issue 60: a day-ahead forecast never reads the target of its own day. The next day's
    forecasts do change (they read the moved day as yesterday), so the test can fail."""
    as_is, moved = peeking["as_is"], peeking["moved"]
    assert as_is.index.equals(moved.index)
    day = (as_is["day"] == MOVED_DAY).to_numpy()
    assert day.sum() == 2 * 24
    np.testing.assert_array_equal(moved["predicted"].to_numpy()[day], as_is["predicted"].to_numpy()[day])
    assert (moved["actual"].to_numpy()[day] - as_is["actual"].to_numpy()[day] == pytest.approx(1000.0))
    after = (as_is["day"] == MOVED_DAY + pd.Timedelta(days=1)).to_numpy()
    assert np.abs(moved["predicted"].to_numpy()[after] - as_is["predicted"].to_numpy()[after]).min() > 1.0
    before = (as_is["day"] < MOVED_DAY).to_numpy()  # and nothing before it moves
    np.testing.assert_array_equal(moved["predicted"].to_numpy()[before], as_is["predicted"].to_numpy()[before])


HISTORY = {"load_d1": DerivedColumn(kind="lag", column="load", by="1D"),
           "load_d7": DerivedColumn(kind="lag", column="load", by="7D"),
           "load_prev": DerivedColumn(kind="rolling", column="load", window="1D", align="day")}


def logged_model(store: str, run_id: str):
    client = MlflowClient(tracking_uri=store)
    (logged,) = [m for m in client.search_logged_models([client.get_run(run_id).info.experiment_id])
                 if m.source_run_id == run_id]
    return load_state(Path(logged.artifact_location.removeprefix("file://")) / "data" / "fitted")


def local_text(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows as a request sends them: local wall times as text, no load."""
    return rows.assign(date=rows["date"].dt.tz_localize(None).astype(str)).drop(columns=["load"]).reset_index(drop=True)


def test_the_logged_model_forecasts_the_day_after_from_its_input_example_s_columns(peeking, monkeypatch):
    """The served model (mlflow.pyfunc) reads the day after its table without its load: its input example lists
    the date, the group and the temperature, and its forecasts are the fitted model's."""
    import mlflow

    run_id = peeking["as_is"]["run_id"].iloc[0]
    client = MlflowClient(tracking_uri=peeking["store"])
    (logged,) = [m for m in client.search_logged_models([client.get_run(run_id).info.experiment_id])
                 if m.source_run_id == run_id]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", peeking["store"])  # the store its files are checked against
    loaded = mlflow.pyfunc.load_model(logged.artifact_location)
    example = loaded.metadata.load_input_example(logged.artifact_location.removeprefix("file://"))
    assert list(example.columns) == ["site", "date", "temperature"]
    after = local_text(hourly_sites(sites=2, start="2022-03-21", end="2022-03-21"))
    served = loaded.predict(after)
    expected = logged_model(peeking["store"], run_id).predict_values(after)
    np.testing.assert_allclose(served["predicted"].to_numpy(dtype=np.float64), np.asarray(expected), rtol=1e-12)


def test_the_fitted_model_keeps_the_table_s_last_rows_for_the_day_after(peeking, tmp_path):
    """The model keeps each group's last rows within the lags' reach (7 days): the day after its table gets
    its lags and its previous day's mean from them, as the whole table derived would give; a day whose earlier
    rows it neither keeps nor is sent is refused naming the column; given the history columns as such, the
    model forecasts what the run did."""
    as_is, frame = peeking["as_is"], peeking["frame"]
    model = logged_model(peeking["store"], as_is["run_id"].iloc[0])
    assert model.recipe.tail is not None and set(model.recipe.tail.values) == {"load"}
    kept = pd.to_datetime(model.recipe.tail.dates)
    assert kept.min() >= pd.Timestamp("2022-03-12") and kept.max() == pd.Timestamp("2022-03-20 22:00")
    after = hourly_sites(sites=2, start="2022-03-21", end="2022-03-21")  # the day after the table
    served = model.predict_values(local_text(after))
    cfg = DataConfig(source=DataSource.file, path=str(write_sites(pd.concat([frame, after.assign(load=np.nan)]),
                                                                  tmp_path / "after.csv")),
                     target="load", group="site", timezone=PARIS)
    whole = derived(read_table(cfg).frame, HISTORY, PARIS).set_index(["date", "site"])
    keys = list(zip(after["date"].dt.tz_convert("UTC").dt.tz_localize(None), after["site"]))
    given = local_text(after).assign(**{name: whole.loc[keys, name].to_numpy() for name in HISTORY})
    assert given[list(HISTORY)].notna().all().all()
    np.testing.assert_allclose(np.asarray(served, dtype=np.float64),
                               np.asarray(model.predict_values(given), dtype=np.float64), rtol=1e-12, atol=0)
    two_days = hourly_sites(sites=2, start="2022-03-21", end="2022-03-22")  # the second day's lag 1D: not known
    with pytest.raises(DataError, match=r"data.derived.load_d1='load': 48 of the 96 rows to predict .* have no lag of "
                                        r"'load'.*Fix: send those earlier rows with their load along"):
        model.predict_values(local_text(two_days))
    rows = frame[frame["date"].dt.tz_localize(None).dt.normalize() == pd.Timestamp("2022-03-08")]
    with pytest.raises(DataError, match=r"48 of the 48 rows to predict .* have no lag of 'load'"):
        model.predict_values(local_text(rows))
    keys = list(zip(rows["date"].dt.tz_convert("UTC").dt.tz_localize(None), rows["site"]))
    given = local_text(rows).assign(**{name: whole.loc[keys, name].to_numpy() for name in HISTORY})
    np.testing.assert_allclose(np.asarray(model.predict_values(given), dtype=np.float64),
                               as_is.loc[keys, "predicted"].to_numpy(), rtol=1e-9, atol=0)


# ---- refusals ---------------------------------------------------------------------------------------------


def two_rows_a_date(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([frame, frame.assign(g=frame["g"] + 3)], ignore_index=True)


REFUSALS = [
    ("smooth of the target", ["+data.derived.ys={kind: smooth, column: y, factor: 0.9}"], None,
     "tamrun: config error: data.derived.ys.kind='smooth': this smooth of data.target='y' reads the target of its "
     "own row's day"),
    ("lag of 2h of the target", ["+data.derived.y2={kind: lag, column: y, by: 2h}"], None,
     "tamrun: config error: data.derived.y2.by='2h': this lag of data.target='y' reads the target of its own row's "
     "day: a forecast would read the answer (a history column may read the target only up to the end of the day "
     "before). Fix: set data.derived.y2.by to 1D or more"),
    ("a smooth of an expression of the target", ['+data.derived.y3={kind: expr, expr: "y * 2"}',
                                                 "+data.derived.s3={kind: smooth, column: y3, factor: 0.9}"], None,
     "data.derived.s3.kind='smooth': this smooth of data.target='y' (through 'y3') reads the target"),
    ("bad offset", ["+data.derived.x1={kind: lag, column: x, by: yesterday}"], None,
     "tamrun: config error: data.derived.x1.by='yesterday': not a pandas offset of days or time. Fix: write a pandas "
     "offset of days or time such as 1D, 7D, 1W, 12h or 30min"),
    ("month offset", ["+data.derived.x1={kind: rolling, column: x, window: 1MS}"], None,
     "data.derived.x1.window='1MS': not a pandas offset of days or time"),
    ("rolling stat", ["+data.derived.x1={kind: rolling, column: x, window: 1D, stat: median}"], None,
     "data.derived.x1.stat='median': not a stat of a rolling column. Fix: use one of mean, min, max"),
    ("a field of another kind", ["+data.derived.x1={kind: smooth, column: x, factor: 0.9, by: 1D}"], None,
     "tamrun: config error: data.derived.x1.by='1D': a smooth column has no by (a field of kind lag). Fix: remove "
     "data.derived.x1.by, or set data.derived.x1.kind=lag"),
    ("smooth factor", ["+data.derived.x1={kind: smooth, column: x, factor: 1.5}"], None,
     "data.derived.x1.factor=1.5: a smooth's factor weighs the previous value"),
    ("over the table with repeated dates", ["+data.derived.xt={kind: lag, column: x, by: 1D, over: table}",
                                            "+model.effects.xt={kind: linear, column: xt}"], two_rows_a_date,
     "tamrun: data error: data.derived.xt.over='table': 9600 row(s) share a date with another (first: "
     "2020-01-01 00:00:00): the table has no single time order. Fix: set data.derived.xt.over=group"),
    ("over the table streamed", ["+data.derived.xt={kind: lag, column: x, by: 1D, over: table}",
                                 "memory.limit=6MiB", "memory.data_in_limit=true"], None,
     "tamrun: config error: data.derived.xt.over='table': the table does not fit in memory and is streamed in "
     "chunks of groups, but a column over the whole table reads every group's rows in one time order. Fix: set "
     "data.derived.xt.over=group"),
]


@pytest.mark.parametrize("name, overrides, edit, expected", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_bad_history_columns_are_refused_in_one_line(name, overrides, edit, expected, tmp_path, monkeypatch, capsys):
    path = tmp_path / "data.csv"
    frame = synthetic_frame(days=400, groups=3)
    (edit(frame) if edit else frame).to_csv(path, index=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main([*csv_overrides(path), *overrides, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    out = capsys.readouterr()
    output = out.out + out.err
    assert ended.value.code == 2 and "Traceback" not in output, output
    assert expected in output, output


# ---- streaming, sharding's chunks, Parquet --------------------------------------------------------------


LAG_RUN = ["data=csv", "data.target=load", "data.group=site", "model=custom", f"data.timezone={PARIS}",
           "data.nan_policy=drop", "hw=cpu", "progress=off", "tracking.log_plots=false", "tracking.log_model=false",
           "+data.derived.d1={kind: lag, column: load, by: 1D}", "+data.derived.d7={kind: lag, column: load, by: 7D}",
           "+data.derived.prev={kind: rolling, column: load, stat: max, window: 1D, align: day}",
           "+model.effects.d1={kind: spline, column: d1, k: 6}", "+model.effects.d7={kind: spline, column: d7, k: 6}",
           "+model.effects.prev={kind: spline, column: prev, k: 6}",
           "+model.effects.temp={kind: spline, column: temperature, k: 6}",
           "split.train_start=2022-10-15", "split.train_end=2022-10-31", "split.test_start=2022-11-01",
           "split.test_end=2022-11-14"]
METRICS = ("n_train_rows", "n_test_rows", "rmse_train", "rmse_test", "mape_test")


@pytest.fixture(scope="module")
def sites_files(tmp_path_factory) -> dict:
    """Six sites from 1 October 2022 (a fortnight of history before the training period) across the October
    change, as a CSV with offsets and as Parquet of naive local times."""
    folder = tmp_path_factory.mktemp("sites")
    frame = hourly_sites(sites=6, start="2022-10-01", end="2022-11-14")
    return {"csv": write_sites(frame, folder / "t.csv"),
            "parquet": write_sites(frame, folder / "t.parquet", local_naive=True), "rows": len(frame)}


def test_a_streamed_run_derives_each_chunk_s_groups_as_the_whole_run(compose_cfg, sites_files):
    """Chunks hold whole groups, so each group's history is whole: a run streamed one site a chunk (memory.limit
    as tests/test_stream.py) gives the whole run's metrics."""
    from tamrun.runner import run

    args = [*LAG_RUN, f"data.path={sites_files['parquet']}"]
    whole = run(compose_cfg(*args))
    streamed = run(compose_cfg(*args, "memory.limit=3MiB", "memory.data_in_limit=true"))
    assert "stream_chunks" not in whole.metrics and streamed.metrics["stream_chunks"] >= 2
    for name in METRICS:
        assert streamed.metrics[name] == pytest.approx(whole.metrics[name], rel=1e-9), name


def test_parquet_reads_the_split_s_days_widened_by_the_lookback(compose_cfg, sites_files):
    """The split's days pushed down to Parquet are widened by the longest lookback (7 days, and a margin): the first training day's lags are found, fewer rows are read than the
    table holds, and the run equals the CSV run, which reads every row."""
    from tamrun.config.load import typed_config
    from tamrun.pipeline import load_splits
    from tamrun.runner import run

    config, specs = typed_config(compose_cfg(*LAG_RUN, f"data.path={sites_files['parquet']}"))
    window = Table.open(config.data).window(config.split)
    assert window.lower == pd.Timestamp("2022-10-06")  # 15 October - (7 days of 25 hours, rounded up to 8, + 1)
    loaded = read_table(config.data, window=window)
    assert loaded.parquet.pushed_down and 0 < len(loaded.frame) < sites_files["rows"]
    splits = load_splits(config, specs)
    first = splits.train[splits.train["date"] < pd.Timestamp("2022-10-15 22:00")]  # local 15 October
    assert len(first) == 6 * 24 and first[["d1", "d7", "prev"]].notna().all().all()
    assert splits.train["date"].min() == pd.Timestamp("2022-10-14 22:00")  # the history rows dropped
    parquet = run(compose_cfg(*LAG_RUN, f"data.path={sites_files['parquet']}"))
    csv = run(compose_cfg(*LAG_RUN, f"data.path={sites_files['csv']}"))
    for name in METRICS:
        assert parquet.metrics[name] == pytest.approx(csv.metrics[name], rel=1e-9), name


def test_the_file_columns_read_and_a_sharded_run_s_refusal(compose_cfg):
    """A history column's source is a file column the run must read, unless it is an earlier derived column; a
    run sharded over Ray refuses ``over: table`` as a streamed one does (`require_streamable`)."""
    from tamrun.config.load import typed_config
    from tamrun.data.derive import derived_sources
    from tamrun.errors import ConfigError
    from tamrun.jobs.shard import require_shardable

    required, _ = derived_sources({"kelvin": DerivedColumn(kind="expr", expr="temperature + 273.15"),
                                   "k1": DerivedColumn(kind="lag", column="kelvin", by="1D"),
                                   "d1": DerivedColumn(kind="lag", column="load", by="1D"),
                                   "s": DerivedColumn(kind="smooth", column="temperature", factor=0.9)})
    assert required == {"data.derived.d1.column": "load", "data.derived.s.column": "temperature"}
    config, specs = typed_config(compose_cfg("~data.derived.tod", "data.group=tod",  # the file's own group
                                             "+data.derived.s={kind: smooth, column: temperature, factor: 0.9, "
                                             "over: table}"))
    with pytest.raises(ConfigError, match=r"data.derived.\w+.over='table': shard.over=ray fits chunks of groups as tasks "
                                          r"of a Ray cluster, but a column over the whole table reads every group's"):
        require_shardable(config, specs)


def test_deriving_the_national_columns_allocates_less_than_the_guard_s_estimate(compose_cfg):
    """The derive step's estimate (`derive_bytes`: the columns it makes and DERIVE_WORK_COLUMNS more, what the
    room check before it asks for) is an upper bound of what `add_derived_columns` really allocates at its peak
    (tracemalloc, which numpy's arrays report to), on the national preset's twelve derived columns over the whole
    embedded table (its dates sorted: over-table columns in place; its lags per half-hour: sorted once). Measured
    on the second call: the first also caches the holiday calendar and imports the holidays package."""
    import tracemalloc

    from tamrun.config.load import typed_config
    from tamrun.memory.footprint import DERIVE_WORK_COLUMNS, derive_bytes

    config, _ = typed_config(compose_cfg("model=spline"))
    data = config.data
    frame = read_table(data, {"data.target": "Load", "temperature": "temperature"}).frame
    calendar = Calendar.of(data, frame[data.date_column])

    def derive() -> pd.DataFrame:
        return add_derived_columns(frame, data.derived, data.date_column, None, calendar, data.group)

    expected = derive()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        derived = derive()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(data.derived) == 12 and len(frame) == 227_904
    assert peak <= derive_bytes(len(frame), len(data.derived)), (peak / 2**20, DERIVE_WORK_COLUMNS)
    assert peak >= 8 * len(frame) * len(data.derived)  # it did make the columns (a measurement that can fail)
    pd.testing.assert_frame_equal(derived, expected)
