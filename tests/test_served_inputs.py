"""A served forecast held to a run's standard (issue 58; docs/serving.md, "What a served model refuses").

A real run on a small CSV (x in 0 .. 6, a day-of-week level, a time index from the date) logs its model;
``mlflow.pyfunc.load_model`` loads it as a user would and is asked what a user might ask: missing or non-finite
inputs, rows far outside the training data, dates as pandas datetimes or as text. Every refusal is one
``tamrun:`` line naming the column and the rows, raised as MLflow's INVALID_PARAMETER_VALUE (HTTP 400 when
served: tests/test_serving.py).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil

import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from conftest import synthetic_frame
from test_model_state import load_in_process, logged_model
from tamrun.fit.support import SUPPORT_MARGIN
from tamrun.tracking.model_state import STATE, load_state
from tamrun.tracking.pyfunc_model import TamPyfuncModel

EFFECTS = ["+model.effects.sx={kind: spline, column: x, k: 6}",
           "+model.effects.dow={kind: categorical, column: dow, topo: fourier}",
           "+model.effects.trend={kind: linear, column: t}", "+data.derived.t={kind: time_index, unit: D}"]
ROWS = 6  # the rows asked about: the CSV's last six (test rows, dates as text)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A run on a 60-day CSV whose x lies in 0 .. 6: its model loaded through MLflow, its state folder, the
    CSV as a table (dates as text) and the training rows (dates parsed)."""
    folder = tmp_path_factory.mktemp("served_inputs")
    csv = folder / "d.csv"
    frame = synthetic_frame(days=60)
    frame.assign(x=frame["x"] * 0.6).to_csv(csv, index=False)
    artifacts = logged_model(folder, csv, EFFECTS)
    table = pd.read_csv(csv)
    train = pd.read_csv(csv, parse_dates=["date"])
    return {"model": load_in_process(folder, artifacts), "state": artifacts / "data" / "fitted",
            "rows": table.tail(ROWS).reset_index(drop=True), "train": train[train["date"] < "2020-02-16"]}


def refusal(model, rows: pd.DataFrame) -> str:
    """The one-line message of ``model``'s refusal of ``rows`` (an MlflowException of INVALID_PARAMETER_VALUE)."""
    with pytest.raises(MlflowException) as refused:
        model.predict(rows)
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
    message = refused.value.message
    assert message.startswith("tamrun: ") and "\n" not in message and "Fix: " in message, message
    return message


@pytest.mark.parametrize("column, values, shown, rows, problem", [
    ("x", [np.nan, 1.0, 2.0, np.nan, 3.0, 4.0], "x=nan", "2 of the 6 rows to predict (rows 0, 3;", "have no value"),
    ("x", [1.0, None, 2.0, 3.0, 3.0, 4.0], "x=None", "1 of the 6 rows to predict (row 1;", "have no value"),
    ("x", [1.0, 2.0, np.inf, 3.0, -np.inf, 4.0], "x=inf", "2 of the 6 rows to predict (rows 2, 4;", "not finite"),
    ("x", ["1.5", "inf", "2", "3", "3", "4"], "x=inf", "1 of the 6 rows to predict (row 1;", "not finite"),
    ("dow", [6, 6, None, 0, 0, 0], "dow=None", "1 of the 6 rows to predict (row 2;", "have no value"),
    ("g", [0, 1, 2, None, 1, 2], "g=None", "1 of the 6 rows to predict (row 3;", "have no value"),
    ("date", ["2020-02-29 18:00:00", None, *["2020-02-29 20:00:00"] * 4], "date=None",
     "1 of the 6 rows to predict (row 1;", "have no value"),
    ("date", ["2020-02-29 18:00:00", "tomorrow", *["2020-02-29 20:00:00"] * 4], "date='tomorrow'",
     "1 of the 6 rows to predict (row 1;", "not a date"),
])
def test_a_missing_or_non_finite_input_is_refused_naming_the_column_and_rows(served, column, values, shown, rows,
                                                                             problem):
    """NaN, None (a JSON null), inf (or its text) and a date that is none: refused, never a NaN forecast."""
    message = refusal(served["model"], served["rows"].assign(**{column: pd.Series(values, dtype=object)}))
    assert message.startswith(f"tamrun: data error: {shown}: {rows}"), message
    assert problem in message


def test_a_row_far_outside_the_training_range_is_refused_naming_rows_and_column(served):
    """Trained on x in 0 .. 6, the model refuses x = 1e12 (no forecast of 1.5e12 with narrow intervals), and
    any x beyond the training range widened by SUPPORT_MARGIN of its span; a row inside it is forecast."""
    model, rows, train = served["model"], served["rows"], served["train"]
    message = refusal(model, rows.assign(x=[1.0, 2.0, 1e12, 3.0, 1e12, 4.0]))
    assert message.startswith("tamrun: data error: x=1000000000000.0: 2 of the 6 rows to predict (rows 2, 4; "
                              "counted from 0) lie far outside the training range of x: group "), message
    assert f"widened by {SUPPORT_MARGIN:g} of its span" in message and "Fix: forecast rows inside the range" in message
    group = rows["g"][2]
    low, high = train.loc[train["g"] == group, "x"].agg(["min", "max"])
    beyond = high + 1.01 * SUPPORT_MARGIN * (high - low)  # just outside what the group accepts
    within = high + 0.99 * SUPPORT_MARGIN * (high - low)
    assert f"group {group}'s is {low:.6g} .. {high:.6g}" in refusal(model, rows.assign(x=np.where(rows.index == 2,
                                                                                                  beyond, 1.0)))
    forecast = model.predict(rows.assign(x=np.where(rows.index == 2, within, 1.0)))
    assert np.isfinite(forecast["predicted"]).all() and len(forecast) == ROWS


def test_a_date_far_past_the_training_period_is_refused_by_its_time_index(served):
    """The time index computed from the date is held to the same support: a date years after the training
    period is refused, naming the derived column."""
    message = refusal(served["model"], served["rows"].assign(date="2031-06-01 00:00:00"))
    assert message.startswith("tamrun: data error: t="), message
    assert "6 of the 6 rows to predict" in message and "t (the time_index computed from the rows)" in message


def test_dates_are_read_as_datetimes_or_as_text_alike(served):
    """The same rows with their date as text (a CSV read by pandas), as datetime64, as Python datetimes and
    as pandas' string dtype: the same forecasts, the run's own model's; the dates come back as given."""
    model, rows = served["model"], served["rows"]
    parsed = pd.to_datetime(rows["date"])
    expected = load_state(served["state"]).predict_values(rows.assign(date=parsed))
    for given in (rows, rows.assign(date=parsed), rows.assign(date=pd.Series(list(parsed.dt.to_pydatetime()),
                                                                             dtype=object)),
                  rows.assign(date=rows["date"].astype("string"))):
        forecast = model.predict(given)
        np.testing.assert_allclose(forecast["predicted"].to_numpy(), expected, rtol=0, atol=1e-12)
        assert forecast["date"].tolist() == given["date"].tolist()
    assert model.metadata.get_input_schema() is None  # no schema MLflow enforces passes all of these (module doc)
    assert isinstance(rows["date"][0], str) and isinstance(parsed.dt.to_pydatetime()[0], dt.datetime)
    # a time zone or an offset converted to UTC and dropped, as a run reads its file's dates
    paris = parsed.dt.tz_localize("UTC").dt.tz_convert("Europe/Paris")
    for zoned in (paris, paris.dt.strftime("%Y-%m-%dT%H:%M:%S%z")):
        np.testing.assert_allclose(model.predict(rows.assign(date=zoned))["predicted"], expected, rtol=0, atol=1e-12)
    # ISO 8601 text in its several forms in one request (a date alone, a T, a fraction), one format otherwise
    mixed = rows.assign(date=["2020-02-29", "2020-02-29T19:00", "2020-02-29 20:00:00.000", *rows["date"][3:]])
    np.testing.assert_allclose(model.predict(mixed)["predicted"].to_numpy()[1:], expected[1:], rtol=0, atol=1e-12)
    month_first = parsed.dt.strftime("%m/%d/%Y %H:%M")
    np.testing.assert_allclose(model.predict(rows.assign(date=month_first))["predicted"], expected, rtol=0, atol=1e-12)
    message = refusal(model, rows.assign(date=month_first.where(rows.index != 1, "29/02/2020 19:00")))
    assert message.startswith("tamrun: data error: date='29/02/2020 19:00': 1 of the 6 rows to predict (row 1; "
                              "counted from 0) hold a value that is not a date (one format for all of them"), message


def test_a_missing_column_and_an_unknown_group_are_refused_in_one_line(served):
    model, rows = served["model"], served["rows"]
    message = refusal(model, rows.drop(columns=["date"]))
    assert message.startswith("tamrun: data error: date=None: the rows to predict have no column 'date'"), message
    assert "send every column the model reads: g, x, dow, date" in message
    assert refusal(model, 5).startswith("tamrun: data error: rows='int': the input is not a table of rows")
    message = refusal(model, rows.assign(g=[0, 1, 2, 7, 7, 0]))
    assert message.startswith("tamrun: data error: g=7: 2 of the 6 rows to predict (rows 3, 4; counted from 0) "
                              "belong to group(s) the model was not trained on (7)"), message
    message = refusal(model, rows.assign(dow=[9, 6, 6, 6, 6, 6]))  # a level never seen in training
    assert message.startswith("tamrun: data error: dow=9: 1 of the 6 rows to predict (row 0; counted from 0) hold "
                              "a level never seen in training (effect 'dow' knows 7: 0, 1, 2, 3, 4, 5, 6)"), message


def test_a_forecast_farther_than_a_run_accepts_is_refused(served):
    """The run's own standard for a forecast (10 spreads of the training target from its median, as
    tamrun.fit.evaluate refuses a run's) holds for a served one: with the target's recorded spread narrowed,
    the same rows are refused, naming them."""
    fitted = load_state(served["state"])
    fitted.support.target_spread = 1e-6
    with pytest.raises(MlflowException) as refused:
        TamPyfuncModel(fitted).predict(None, served["rows"])
    assert refused.value.message.startswith("tamrun: numerical error: predicted="), refused.value.message
    assert "6 of the 6 rows to predict" in refused.value.message and "median" in refused.value.message


def test_the_training_support_is_stored_with_the_model_as_data(served, tmp_path):
    """The state holds each group's training range of every numeric feature (x and the time index; not the
    level dow) and the target's median and spread; a model logged before it was kept still refuses missing
    values, without a range check."""
    fitted, train = load_state(served["state"]), served["train"]
    support = fitted.support
    assert support.columns == ["x", "t"] and support.low.shape == support.high.shape == (3, 2)
    by_group = train.groupby("g")["x"].agg(["min", "max"]).loc[fitted.groups]
    np.testing.assert_allclose(support.low[:, 0].numpy(), by_group["min"].to_numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(support.high[:, 0].numpy(), by_group["max"].to_numpy(), rtol=0, atol=0)
    assert support.target_center == pytest.approx(float(train["y"].median()))
    older = tmp_path / "fitted"
    shutil.copytree(served["state"], older)
    tree = json.loads((older / STATE).read_text())
    del tree["root"]["fields"]["support"]
    (older / STATE).write_text(json.dumps(tree))
    model = TamPyfuncModel(load_state(older))
    assert model.model.support is None
    assert np.isfinite(model.predict(None, served["rows"].assign(x=50.0))["predicted"]).all()
    with pytest.raises(MlflowException, match=r"^tamrun: data error: x=nan: 1 of the 6 rows"):
        model.predict(None, served["rows"].assign(x=[np.nan, 1, 1, 1, 1, 1]))


def test_a_dictionary_encoded_group_column_fits_and_serves(tmp_path):
    """A Parquet file whose group column is dictionary-encoded (read as pandas' category): the run logs its
    model (before: "internal error: Input example does not match the model signature", the input schema
    typing the group as a string) and the model serves the file's rows, category or text alike."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = synthetic_frame(days=60)
    table = pa.Table.from_pandas(frame.assign(g="s" + frame["g"].astype(str)), preserve_index=False)
    table = table.set_column(table.schema.get_field_index("g"), "g", table.column("g").dictionary_encode())
    pq.write_table(table, tmp_path / "d.parquet")
    model = load_in_process(tmp_path, logged_model(tmp_path, tmp_path / "d.parquet", EFFECTS[:1]))
    rows = pd.read_parquet(tmp_path / "d.parquet").tail(ROWS)
    assert isinstance(rows["g"].dtype, pd.CategoricalDtype)
    as_category, as_text = model.predict(rows), model.predict(rows.assign(g=rows["g"].astype(str)))
    assert as_category["g"].astype(str).tolist() == ["s0", "s1", "s2"] * 2
    np.testing.assert_array_equal(as_category["predicted"].to_numpy(), as_text["predicted"].to_numpy())
    assert np.isfinite(as_category["predicted"]).all()


@pytest.mark.parametrize("copied", [["x"], ["g"], ["x", "g"]])
def test_a_column_given_twice_is_refused_naming_it(served, copied):
    """A table holding a column twice (``pd.concat([rows, rows[["x"]]], axis=1)``): which one to read is not
    known; refused in one line naming the column(s), never a raw TypeError."""
    rows = served["rows"]
    message = refusal(served["model"], pd.concat([rows, rows[copied]], axis=1))
    assert message.startswith(f"tamrun: data error: columns={copied!r}: the rows to predict hold {len(copied)} "
                              f"column name(s) more than once ({', '.join(map(repr, copied))})"), message
    assert message.endswith("Fix: send each column once (drop or rename the copies)"), message


@pytest.mark.parametrize("values", [[1 + 50j] * ROWS, pd.Series([1.0, 2.0, 1 + 50j, 3.0, 3.0, 4.0], dtype=object)])
def test_a_complex_input_is_refused_not_read_as_its_real_part(served, values):
    """x = 1+50j (a complex column, or one complex value among numbers): refused naming the column and rows,
    never a forecast made as if x were its real part."""
    rows = served["rows"].assign(x=values)
    message = refusal(served["model"], rows)
    assert message.startswith("tamrun: data error: x=(1+50j): "), message
    named = "6 of the 6 rows to predict (rows 0, 1, 2, 3, 4, 5;" if len(set(map(str, values))) == 1 else \
        "1 of the 6 rows to predict (row 2;"
    assert named in message and "hold a complex number, not a real one" in message, message
