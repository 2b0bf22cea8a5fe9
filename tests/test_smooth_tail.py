"""A fitted model continues its smooth columns from their state at the end of its table (issue 60; docs/own_data.md,
"The fitted model keeps its table's last rows"): rows sent after the end get, from their date, group and source
column alone, the smoothing the whole table (the table and those rows together) derives, per group, day by day
(``daily``) and over the table (``over: table``); the state survives a saved model; rows at or before the end,
or of a group the table did not have, are refused naming the column; a model saved before the state still asks
for the column itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pandas as pd
import pytest

from tamrun.bench.sites import hourly_sites, write_sites
from tamrun.config.schema import DataConfig, DataSource, DerivedColumn
from tamrun.data.calendar import Calendar
from tamrun.data.derive import DataRecipe
from tamrun.data.history import HistoryTail, smooth_ends
from tamrun.data.table import read_table
from tamrun.errors import DataError
from tamrun.fit.served_rows import check_inputs
from tamrun.tracking.model_state import STATE, load_state, save_state

from test_history_columns import PARIS, derived, local_text, logged_model, predictions_of
from test_secrets import tamrun

SMOOTHS = {"s": DerivedColumn(kind="smooth", column="load", factor=0.95),
           "s_mean": DerivedColumn(kind="smooth", column="load", factor=0.9, daily="mean"),
           "s_max": DerivedColumn(kind="smooth", column="load", factor=0.8, daily="max"),
           "s_prev_max": DerivedColumn(kind="rolling", column="s", stat="max", window="1D")}  # reads a smooth
DAY_ENDS = {"site_1": "2022-10-27", "site_2": "2022-10-29"}  # local midnights: each site's table ends the day before


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> pd.DataFrame:
    """Two sites across the clock change of 2022-10-30, one row in seven missing and a few loads NaN, read as a
    run reads them (dates in UTC under data.timezone)."""
    frame = hourly_sites(sites=2, start="2022-10-18", end="2022-11-03")
    rng = np.random.default_rng(7)
    frame = frame[rng.random(len(frame)) > 1 / 7].reset_index(drop=True)
    frame.loc[rng.choice(len(frame), 12, replace=False), "load"] = np.nan
    path = write_sites(frame, tmp_path_factory.mktemp("smooth") / "sites.csv", local_naive=True)
    return read_table(DataConfig(source=DataSource.file, path=str(path), target="load", group="site",
                                 timezone=PARIS)).frame


def local_days(frame: pd.DataFrame) -> pd.Series:
    return frame["date"].dt.tz_localize("UTC").dt.tz_convert(PARIS).dt.tz_localize(None)


def recipe_of(table: pd.DataFrame, specs: Dict[str, DerivedColumn], group: Optional[str]) -> DataRecipe:
    """What a run keeps of ``table`` (its derived columns computed on it alone)."""
    kept = derived(table, specs, PARIS, group)
    return DataRecipe(dict(specs), "date", "load", group, kept["date"].min(), calendar=Calendar(PARIS),
                      tail=HistoryTail.of(kept, specs, "date", group), smooth=smooth_ends(kept, specs, "date", group,
                                                                                            PARIS))


def sent(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows as a caller sends them: dates with their offset, in another order (the order is kept)."""
    rows = rows.assign(date=rows["date"].dt.tz_localize("UTC"))
    return rows.iloc[np.random.default_rng(3).permutation(len(rows))]


def assert_served_as_whole(frame: pd.DataFrame, kept: np.ndarray, specs: Dict[str, DerivedColumn],
                           group: Optional[str]) -> None:
    """The rows after the table (``~kept``) derived from the recipe's state alone equal the whole table's."""
    whole = derived(frame, specs, PARIS, group)
    rows = sent(frame[~kept])
    served = recipe_of(frame[kept], specs, group).apply(rows)
    assert served.index.equals(rows.index)
    for name in specs:
        reference = whole.loc[rows.index, name].to_numpy()
        assert np.isfinite(reference).all()
        np.testing.assert_allclose(served[name].to_numpy(), reference, rtol=1e-12, atol=0, err_msg=name)


def test_plain_and_daily_smooths_continue_as_the_whole_table_derives_them_per_group(sites):
    """Each site's table ends on its own day; the rows after it (across the clock change) get their smooths, the
    daily ones and a window over a smooth reading the kept tail's smoothed values, as derived over the whole
    table, to 1e-12; both groups are served."""
    ends = sites["site"].map(DAY_ENDS).astype("datetime64[ns]")
    kept = (local_days(sites) < ends).to_numpy()
    assert set(sites.loc[~kept, "site"]) == {"site_1", "site_2"}
    assert_served_as_whole(sites, kept, SMOOTHS, "site")
    plain = {"s": SMOOTHS["s"]}  # a plain smooth's table may end within a day
    hours = sites["site"].map({"site_1": "2022-10-27 13:00", "site_2": "2022-10-29 05:00"}).astype("datetime64[ns]")
    assert_served_as_whole(sites, (local_days(sites) < hours).to_numpy(), plain, "site")


def test_a_smooth_over_the_table_continues_in_one_time_order(sites):
    """Site 1 on even hours, site 2 on odd ones (one row a date): over the table the state is one, whatever the
    row's group."""
    hour = local_days(sites).dt.hour
    frame = sites[(hour % 2 == 0) == (sites["site"] == "site_1")].reset_index(drop=True)
    specs = {"t": DerivedColumn(kind="smooth", column="load", factor=0.9, over="table"),
             "t_min": DerivedColumn(kind="smooth", column="load", factor=0.7, daily="min", over="table")}
    assert_served_as_whole(frame, (local_days(frame) < pd.Timestamp("2022-10-29")).to_numpy(), specs, "site")
    recipe = recipe_of(frame, specs, "site")
    assert recipe.smooth["t"].groups == [] and len(recipe.smooth["t"].ends) == 1


def test_rows_not_after_the_end_or_of_another_group_are_refused_naming_the_column(sites):
    ends = sites["site"].map(DAY_ENDS).astype("datetime64[ns]")
    kept = (local_days(sites) < ends).to_numpy()
    recipe = recipe_of(sites[kept], {"s_mean": SMOOTHS["s_mean"]}, "site")
    last_day = sites[kept & (local_days(sites).dt.normalize() == pd.Timestamp("2022-10-28")).to_numpy()]
    assert len(last_day) > 12
    with pytest.raises(DataError, match=rf"data.derived.s_mean='load': {len(last_day)} of the {len(last_day)} rows to "
                                        r"predict \(first: row 0, "
                                        r"counted from 0\) are not after the table's last local day 2022-10-28 "
                                        r"\(of their group\): the smooth continues .*Fix: send only rows after "
                                        r"the table's end, or give the column s_mean itself"):
        recipe.apply(sent(last_day))
    other = sent(sites[~kept]).assign(site="site_9")
    with pytest.raises(DataError, match=r"data.derived.s_mean='load': .* are a group the table did not have"):
        recipe.apply(other)
    given = sent(last_day).assign(s_mean=1.0)  # given as such: read as sent
    assert (recipe.apply(given)["s_mean"] == 1.0).all()


def test_the_state_survives_a_saved_recipe(sites, tmp_path):
    ends = sites["site"].map(DAY_ENDS).astype("datetime64[ns]")
    kept = (local_days(sites) < ends).to_numpy()
    recipe = recipe_of(sites[kept], SMOOTHS, "site")
    save_state(recipe, tmp_path)
    loaded = load_state(tmp_path)
    assert loaded.smooth["s"].groups == ["site_1", "site_2"]
    rows = sent(sites[~kept])
    pd.testing.assert_frame_equal(loaded.apply(rows), recipe.apply(rows), check_exact=True)


# ---- a run's model --------------------------------------------------------------------------------------


SMOOTH_RUN = ["data=csv", "data.target=load", "data.group=site", "model=calendar", f"data.timezone={PARIS}",
              "data.nan_policy=drop", "tracking.log_plots=false", "progress=off", "hw=cpu",
              "+data.derived.temp_s={kind: smooth, column: temperature, factor: 0.95}",
              "+data.derived.temp_max={kind: smooth, column: temperature, factor: 0.9, daily: max}",
              "+model.effects.ts={kind: spline, column: temp_s, k: 6}",
              "+model.effects.tm={kind: linear, column: temp_max}",
              "split.train_start=2022-01-01", "split.train_end=2022-02-28", "split.test_start=2022-03-01",
              "split.test_end=2022-03-20"]


@pytest.fixture(scope="module")
def smooth_run(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("smooth_run")
    frame = hourly_sites(sites=2, start="2022-01-01", end="2022-03-20")
    store = f"sqlite:///{folder / 'mlflow.db'}"
    done = tamrun([*SMOOTH_RUN, f"data.path={write_sites(frame, folder / 'raw.csv')}", f"tracking.uri={store}",
                   "tracking.run_name=smooth"], folder / "run", {}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"store": store, "run_id": predictions_of(store, "smooth")["run_id"].iloc[0], "frame": frame,
            "folder": folder}


def test_a_logged_model_forecasts_the_days_after_from_date_group_and_temperature(smooth_run, tmp_path):
    """The logged model (saved as safetensors + JSON, loaded back) forecasts two days after its table from the
    site, date and temperature alone, as it does given the smooths the whole table derives."""
    model = logged_model(smooth_run["store"], smooth_run["run_id"])
    assert set(model.recipe.smooth) == {"temp_s", "temp_max"}
    after = hourly_sites(sites=2, start="2022-03-21", end="2022-03-22")
    rows = local_text(after)
    raw = model.raw_columns(rows.columns)
    assert "temperature" in raw and not {"temp_s", "temp_max"} & set(raw)
    whole = pd.concat([smooth_run["frame"], after])
    cfg = DataConfig(source=DataSource.file, path=str(write_sites(whole, tmp_path / "whole.csv")), target="load",
                     group="site", timezone=PARIS)
    reference = derived(read_table(cfg).frame, {n: DerivedColumn(**s) for n, s in {
        "temp_s": {"kind": "smooth", "column": "temperature", "factor": 0.95},
        "temp_max": {"kind": "smooth", "column": "temperature", "factor": 0.9, "daily": "max"}}.items()}, PARIS)
    reference = reference.set_index(["date", "site"])
    keys = list(zip(after["date"].dt.tz_convert("UTC").dt.tz_localize(None), after["site"]))
    given = rows.assign(**{name: reference.loc[keys, name].to_numpy() for name in ("temp_s", "temp_max")})
    np.testing.assert_allclose(np.asarray(model.predict_values(rows), dtype=np.float64),
                               np.asarray(model.predict_values(given), dtype=np.float64), rtol=1e-12, atol=0)


def test_a_model_saved_without_the_state_still_asks_for_the_column(smooth_run, tmp_path):
    """A model logged before the state was kept (its JSON without the recipe's ``smooth``) reads the smooth
    columns as given: rows without them are refused naming the column."""
    model = logged_model(smooth_run["store"], smooth_run["run_id"])
    save_state(model, tmp_path)
    tree = json.loads((tmp_path / STATE).read_text(encoding="utf-8"))
    recipe = tree["root"]["fields"]["recipe"]["fields"]
    del recipe["smooth"]
    (tmp_path / STATE).write_text(json.dumps(tree), encoding="utf-8")
    old = load_state(Path(tmp_path))
    assert old.recipe.smooth is None
    rows = local_text(hourly_sites(sites=2, start="2022-03-21", end="2022-03-21"))
    assert {"temp_s", "temp_max"} <= set(old.raw_columns(rows.columns))
    with pytest.raises(DataError, match=r"the rows to predict have no column 'temp_(s|max)'"):
        check_inputs(old, rows)
    check_inputs(model, rows)  # the model with its state: served from them


def test_the_national_shape_is_served_from_date_and_temperature(sites):
    """conf/derived/national.yaml's shape: one series, data.group the time of day read from the date, smooths of
    the temperature over the table and the day before's max and min of them: rows after the table (ending at
    noon) need the date and temperature alone, and get the whole table's columns."""
    frame = sites[sites["site"] == "site_1"].drop(columns="site").reset_index(drop=True)
    specs = {"tod": DerivedColumn(kind="calendar", part="time_of_day"),
             "s950": DerivedColumn(kind="smooth", column="temperature", factor=0.95, over="table"),
             "s990": DerivedColumn(kind="smooth", column="temperature", factor=0.99, over="table"),
             "mx": DerivedColumn(kind="rolling", column="s990", stat="max", window="1D", over="table"),
             "mn": DerivedColumn(kind="rolling", column="s950", stat="min", window="1D", over="table")}
    kept = (local_days(frame) < pd.Timestamp("2022-10-28 12:00")).to_numpy()
    recipe = recipe_of(frame[kept], specs, "tod")
    assert [recipe.raw_sources(name, ["date", "temperature"]) for name in ("mx", "mn")] == [["temperature", "date"]] * 2
    rows = frame[~kept & (local_days(frame) < pd.Timestamp("2022-10-29 12:00")).to_numpy()].drop(columns="load")
    whole = derived(frame, specs, PARIS, "tod")
    served = recipe.apply(sent(rows), ["mx", "mn", "s950"])
    for name in ("mx", "mn", "s950"):
        np.testing.assert_allclose(served[name].to_numpy(), whole.loc[served.index, name].to_numpy(), rtol=1e-12,
                                   atol=0, err_msg=name)


def test_the_served_model_takes_the_days_after_without_their_smooths(smooth_run, monkeypatch):
    """Through mlflow.pyfunc (the served model's checks included): the days after the table from site, date and
    temperature; its input example, the table's last rows (at its end), carries the smooth columns."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=smooth_run["store"])
    run_id = smooth_run["run_id"]
    (logged,) = [m for m in client.search_logged_models([client.get_run(run_id).info.experiment_id])
                 if m.source_run_id == run_id]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", smooth_run["store"])  # the store its files are checked against
    loaded = mlflow.pyfunc.load_model(logged.artifact_location)
    example = loaded.metadata.load_input_example(logged.artifact_location.removeprefix("file://"))
    assert {"temp_s", "temp_max"} <= set(example.columns)
    rows = local_text(hourly_sites(sites=2, start="2022-03-21", end="2022-03-22"))
    served = loaded.predict(rows)
    expected = logged_model(smooth_run["store"], run_id).predict_values(rows)
    np.testing.assert_allclose(served["predicted"].to_numpy(dtype=np.float64), np.asarray(expected), rtol=1e-12)
    with pytest.raises(mlflow.exceptions.MlflowException, match=r"data.derived.temp_(s|max)='temperature': .* not "
                                                                r"after the table's last"):
        loaded.predict(example.drop(columns=["temp_s", "temp_max"]))
