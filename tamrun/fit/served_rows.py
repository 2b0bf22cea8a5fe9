"""A served forecast held to a run's standard: what the logged model refuses, and how the refusal reaches
its caller (docs/serving.md, "What a served model refuses").

Before it forecasts, the model (`tamrun.tracking.pyfunc_model.TamPyfuncModel.predict`) checks the rows it is
given (`check_inputs`): no column is given twice; every column it reads is there; no value of them is missing
(NaN, null, None, NaT) or complex; the date is a date (text as in a CSV or a JSON request, read as the run
read its file's dates, or Python or pandas datetimes; an offset or time zone converted to UTC and dropped, as a
run does); every group and level was seen in training; every feature is a finite number within its group's training range widened by
`tamrun.fit.support.SUPPORT_MARGIN` of its span. After, every forecast must lie where a run accepts one
(`check_forecasts`). A refusal is a `TamrunError` of one line, ``tamrun: data error: <column>=<value>: ...
(rows ...) ... Fix: ...``; the logged model raises it as an `MlflowException` of INVALID_PARAMETER_VALUE
(`tamrun.tracking.pyfunc_model.served_refusals`): ``mlflow.pyfunc.load_model(...).predict`` raises it, and
``mlflow models serve`` answers HTTP 400 with it. Rows are named by their position in the request (from 0).
"""

from __future__ import annotations

from typing import List

import numpy as np
import pandas as pd
import torch

from tamrun.data.checks import plain
from tamrun.effects.categorical import CategoricalEffect
from tamrun.errors import DataError, NumericalError
from tamrun.fit.fitted import FittedModel, numbers_read
from tamrun.fit.evaluate import SUPPORT_FACTOR
from tamrun.fit.support import SUPPORT_MARGIN, numeric_columns

ROWS_SHOWN = 8  # the rows a refusal names (their count is said)
DATE_FIX = ("give every date in one format (ISO 8601 text such as 2024-01-01 00:30:00, as in a CSV or a JSON "
            "request, or the training file's), or as datetimes")


def rows_named(mask: np.ndarray) -> str:
    """``2 of the 6 rows to predict (rows 0, 3; counted from 0)``: how many of ``mask`` (n,) are set, and the
    first `ROWS_SHOWN` of them."""
    rows = np.flatnonzero(mask)
    shown = ", ".join(str(int(row)) for row in rows[:ROWS_SHOWN]) + (", ..." if rows.size > ROWS_SHOWN else "")
    return f"{rows.size} of the {mask.size} rows to predict (row{'s' if rows.size > 1 else ''} {shown}; counted from 0)"


def required_columns(model: FittedModel, frame: pd.DataFrame) -> List[str]:
    """The raw columns the model reads that ``frame`` lacks (a derived column given as such needs no source)."""
    present = set(frame.columns)
    sources = [source for column in model.input_columns if column not in present
               for source in model.recipe.raw_sources(column, present)]
    return [source for source in dict.fromkeys(sources) if source not in present]


def refuse_duplicated(frame: pd.DataFrame) -> None:
    """`DataError` naming the columns ``frame`` holds more than once (which of them is the one to read?)."""
    duplicated = [str(column) for column in dict.fromkeys(frame.columns[frame.columns.duplicated()])]
    if duplicated:
        raise DataError("columns", duplicated, f"the rows to predict hold {len(duplicated)} column name(s) more "
                        f"than once ({', '.join(map(repr, duplicated))}): which one to read is not known",
                        "send each column once (drop or rename the copies)")


def refuse_complex(model: FittedModel, frame: pd.DataFrame) -> None:
    """`DataError` naming the rows of a column the model reads that hold a complex number (its imaginary part
    would be dropped unsaid)."""
    for column in model.raw_columns(frame.columns):
        values = frame[column]
        if pd.api.types.is_complex_dtype(values):
            bad = np.ones(len(values), dtype=bool)
        else:
            bad = values.map(lambda value: isinstance(value, (complex, np.complexfloating))).to_numpy(dtype=bool)
        if bad.any():
            raise DataError(column, plain(values[bad].iloc[0]), f"{rows_named(bad)} hold a complex number, not a "
                            "real one", f"give real numbers in {column}, as in the training data")


def refuse_absent_or_missing(model: FittedModel, frame: pd.DataFrame) -> None:
    """`DataError` for a column the model reads that ``frame`` lacks, or a value of one that is missing."""
    absent = required_columns(model, frame)
    if absent:
        reads = ", ".join(model.raw_columns([*frame.columns, *absent]))
        raise DataError(absent[0], None, f"the rows to predict have no column {absent[0]!r} (absent: "
                        f"{', '.join(absent)})", f"send every column the model reads: {reads} (its input example "
                        "lists them)")
    for column in model.raw_columns(frame.columns):
        missing = frame[column].isna().to_numpy()
        if missing.any():
            raise DataError(column, plain(frame[column][missing].iloc[0]), f"{rows_named(missing)} have no value "
                            "in this column", f"give a value in every row of {column} (a forecast is never "
                            "made from a missing input), or leave those rows out")


def refuse_bad_dates(model: FittedModel, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its date column read as the run read its file's dates (when the model reads it:
    `tamrun.data.dates.read_dates`); a value that is not a date in that format is a `DataError` naming the
    rows."""
    recipe = model.recipe
    column = recipe.date_column
    if column not in model.raw_columns(frame.columns):
        return frame
    dates = recipe.dates(frame)
    bad = dates.isna().to_numpy()
    if bad.any():
        how = f"data.date_format={recipe.date_format!r}" if recipe.date_format else "one format for all of them"
        raise DataError(column, plain(frame[column][bad].iloc[0]), f"{rows_named(bad)} hold a value that is not a "
                        f"date ({how}, as the training file's were read)", DATE_FIX)
    return frame.assign(**{column: dates})


def group_codes(model: FittedModel, rows: pd.DataFrame) -> np.ndarray:
    """The position in ``model.groups`` of each row's group (n,); a group the model was not trained on is a
    `DataError` naming the rows."""
    group = model.recipe.group
    if not group:
        return np.zeros(len(rows), dtype=np.int64)
    codes = pd.Index(model.groups).get_indexer(rows[group])
    unseen = codes < 0
    if unseen.any():
        names = [plain(name) for name in pd.unique(rows[group][unseen])]
        raise DataError(group, names[0], f"{rows_named(unseen)} belong to group(s) the model was not trained on "
                        f"({', '.join(map(repr, names[:ROWS_SHOWN]))})", "forecast only the groups the model was "
                        f"trained on ({len(model.groups)}: {', '.join(map(repr, model.groups[:ROWS_SHOWN]))}"
                        f"{', ...' if len(model.groups) > ROWS_SHOWN else ''})")
    return codes


def refuse_unseen_levels(model: FittedModel, rows: pd.DataFrame) -> None:
    """`DataError` naming the rows whose level of a categorical effect's column never appeared in training."""
    for effect in model.design.effects:
        if not isinstance(effect, CategoricalEffect) or effect.column not in rows.columns:
            continue
        values = pd.to_numeric(rows[effect.column], errors="coerce").to_numpy(dtype=np.float64)
        unseen = ~np.isin(values, effect.levels.cpu().numpy())
        if unseen.any():
            levels = [plain(level) for level in effect.levels.tolist()]
            shown = ", ".join(f"{level:g}" for level in levels[:ROWS_SHOWN]) + (", ..." if len(levels) > ROWS_SHOWN
                                                                               else "")
            raise DataError(effect.column, plain(rows[effect.column][unseen].iloc[0]), f"{rows_named(unseen)} hold "
                            f"a level never seen in training (effect {effect.name!r} knows {len(levels)}: {shown})",
                            "forecast only the levels the model was trained on, or retrain it on data that has them")


def refuse_outside(model: FittedModel, rows: pd.DataFrame, codes: np.ndarray) -> None:
    """`DataError` for a feature of ``rows`` (derived ones included; ``codes``: their groups) that is not a
    finite number, or that lies outside the training support of its row's group (`refuse_far`)."""
    columns = numeric_columns(model.design, model.recipe.group)
    rows = numbers_read(rows, columns)
    for column in columns:
        given = rows[column].to_numpy(dtype=np.float64)
        bad = ~np.isfinite(given)
        if bad.any():
            raise DataError(column, float(given[bad][0]), f"{rows_named(bad)} hold a value that is not finite",
                            f"give finite numbers in {column}, as in the training data")
        if model.support is not None and column in model.support.columns:
            refuse_far(model, column, given, codes)


def refuse_far(model: FittedModel, column: str, given: np.ndarray, codes: np.ndarray) -> None:
    """`DataError` naming the rows whose ``column`` (``given``, as the model reads it: cast to its dtype) lies
    outside what their group's training data supports (`tamrun.fit.support.TrainingSupport.accepted`); rows
    of the model's groups (``codes``, their positions in ``model.groups``)."""
    support = model.support
    values = torch.from_numpy(np.array(given, dtype=np.float64)).to(model.dtype).double().numpy()
    low, high = support.accepted(codes, column)
    far = ~((values >= low) & (values <= high))
    if not far.any():
        return
    first = int(np.flatnonzero(far)[0])
    j, g = support.columns.index(column), int(codes[first])
    trained = f"{float(support.low[g, j]):.6g} .. {float(support.high[g, j]):.6g}"
    where = f"group {model.groups[g]!r}'s" if model.recipe.group else "the"
    spec = model.recipe.derived.get(column)
    named = f"{column} (the {spec.kind} computed from the rows)" if spec is not None else column
    raise DataError(column, float(given[first]), f"{rows_named(far)} lie far outside the training range of {named}: "
                    f"{where} is {trained}, accepted {low[first]:.6g} .. {high[first]:.6g} (the range widened by "
                    f"{SUPPORT_MARGIN:g} of its span each side); a forecast there is not supported",
                    "forecast rows inside the range the model was trained on, or retrain it on data that covers "
                    "these values")


def check_inputs(model: FittedModel, frame: pd.DataFrame) -> None:
    """Refuse (`DataError`) rows a run would not forecast from (module doc)."""
    try:
        frame = pd.DataFrame(frame).reset_index(drop=True)
    except (ValueError, TypeError) as exc:  # a scalar, ragged lists
        raise DataError("rows", type(frame).__name__, f"the input is not a table of rows ({exc})",
                        "send a table: CSV, or JSON as dataframe_split or dataframe_records") from None
    refuse_duplicated(frame)
    refuse_absent_or_missing(model, frame)
    refuse_complex(model, frame)
    refuse_bad_dates(model, frame)  # the dates checked; `DataRecipe.apply` reads them from ``frame`` (read once: a
    # local time read twice would move by its offset)
    rows = model.recipe.apply(frame, model.input_columns)
    codes = group_codes(model, rows)
    refuse_unseen_levels(model, rows)
    refuse_outside(model, rows, codes)


def check_forecasts(model: FittedModel, predicted: np.ndarray) -> None:
    """`NumericalError` for forecasts a run does not accept (`TrainingSupport.far_forecasts`)."""
    support = model.support
    if support is None:
        far = ~np.isfinite(np.asarray(predicted, dtype=np.float64))
    else:
        far = support.far_forecasts(predicted)
    if far.any():
        worst = float(np.asarray(predicted, dtype=np.float64)[far][0])
        center = (f"the training target's median {support.target_center:.6g} (more than {SUPPORT_FACTOR:g} times "
                  f"its spread {support.target_spread:.6g}, as a run refuses)" if support else "a finite number")
        raise NumericalError("predicted", worst, f"the forecasts of {rows_named(far)} lie far from {center}: "
                             "not supported by the training data",
                             "forecast rows like those the model was trained on, or retrain it on data that covers "
                             "them")
