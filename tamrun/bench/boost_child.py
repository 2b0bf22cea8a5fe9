"""The gradient-boosting peer of ``python -m tamrun.bench.boosting``: mlforecast + LightGBM in a fresh process.

Run in the peer's own virtual environment, where neither tamrun nor torch is installed (this file imports
neither), as ``<mlforecast python> -I boost_child.py --data force_national.csv.gz``. The same information
as tamrun's day-ahead models, nothing tuned:

- the load up to the end of the day before: mlforecast's ``lags=[48, 336]`` (the same half-hour one and
  seven days earlier: the table has 48 rows every day, so a lag counts half-hours of wall time) and the
  mean load of the previous calendar day (`previous_day_mean`; ``--day-mean rolling``: mlforecast's
  ``RollingMean(window_size=48)`` of lag 48 instead, the 48 half-hours ending a day before the row);
- the calendar: the table's ``tod``, ``day_type_week``, ``toy``, ``day_type_jf`` (`CALENDAR`);
- the day's actual temperatures: the raw and the four smoothed ones (`TEMPERATURES`).

Static, one fit: ``MLForecast.preprocess`` computes the features on the whole series (so the lags of 2024
are the actual loads, a day-ahead forecast with known lags, not a recursive forecast of the year), a
``LGBMRegressor()`` with its default parameters is fitted on the rows up to ``--train-end`` and applied to
the rows from ``--test-start`` to ``--test-end``. Prints one line ``BENCH_RESULT {json}``: the seconds of
the imports, reading, features, fit and predict, the test RMSE and MAPE, the features, LightGBM's
parameters and the libraries' versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

RESULT_PREFIX = "BENCH_RESULT "  # the same as tamrun.bench.child.RESULT_PREFIX (this file cannot import it)
LAGS = (48, 336)  # half-hours: the day before and the week before
ROWS_PER_DAY = 48
CALENDAR = ("tod", "day_type_week", "toy", "day_type_jf")
TEMPERATURES = ("temperature", "temperature_smooth_950", "temperature_smooth_990", "temperature_max_smooth_990",
                "temperature_min_smooth_950")
DAY_MEAN = "previous_day_mean"


def previous_day_mean(dates, target):
    """The mean of ``target`` over the calendar day before each row's day (NaN when that day is absent):
    it reads nothing of the row's own day."""
    import pandas as pd

    day = pd.to_datetime(dates).dt.normalize()
    daily = pd.Series(target.to_numpy(float), index=day.to_numpy()).groupby(level=0).mean()
    return pd.Series((day - pd.Timedelta(days=1)).map(daily).to_numpy(float), index=target.index, name=DAY_MEAN)


def exogenous_frame(table, target: str = "Load", date: str = "date", day_mean: str = "calendar"):
    """mlforecast's input: ``unique_id``, ``ds``, ``y`` and the exogenous features (calendar, temperatures
    and, for ``day_mean="calendar"``, `previous_day_mean`), in time order."""
    import pandas as pd

    ds = pd.to_datetime(table[date])
    frame = pd.DataFrame({"unique_id": "national", "ds": ds, "y": table[target].astype(float)})
    for column in (*CALENDAR, *TEMPERATURES):
        frame[column] = table[column].to_numpy()
    if day_mean == "calendar":
        frame[DAY_MEAN] = previous_day_mean(ds, frame["y"]).to_numpy()
    return frame.sort_values("ds", kind="stable").reset_index(drop=True)


def scores(actual, predicted) -> dict:
    """RMSE and MAPE (%) of the test rows."""
    import numpy as np

    actual, predicted = np.asarray(actual, float), np.asarray(predicted, float)
    return {"rmse": float(np.sqrt(np.mean((actual - predicted) ** 2))),
            "mape": float(100 * np.mean(np.abs((actual - predicted) / actual)))}


def forecaster(day_mean: str):
    """The untuned ``MLForecast``: LightGBM with its defaults, the lags and (``rolling``) the rolling mean."""
    from lightgbm import LGBMRegressor
    from mlforecast import MLForecast
    from mlforecast.lag_transforms import RollingMean

    transforms = {ROWS_PER_DAY: [RollingMean(window_size=ROWS_PER_DAY)]} if day_mean == "rolling" else None
    return MLForecast(models={"lightgbm": LGBMRegressor(verbosity=-1)}, freq="30min", lags=list(LAGS),
                      lag_transforms=transforms)


def run(args: argparse.Namespace) -> dict:
    """Read, derive, fit and predict (module docstring); the seconds of each step."""
    began = time.perf_counter()
    import importlib.metadata

    import pandas as pd

    fcst = forecaster(args.day_mean)
    imported = time.perf_counter()
    frame = exogenous_frame(pd.read_csv(args.data), args.target, args.date, args.day_mean)
    read = time.perf_counter()
    prepared = fcst.preprocess(frame, static_features=[], dropna=True)
    features = [c for c in prepared.columns if c not in ("unique_id", "ds", "y")]
    train = prepared[prepared["ds"] < pd.Timestamp(args.train_end) + pd.Timedelta(days=1)]
    test = prepared[(prepared["ds"] >= pd.Timestamp(args.test_start))
                    & (prepared["ds"] < pd.Timestamp(args.test_end) + pd.Timedelta(days=1))]
    derived = time.perf_counter()
    fcst.fit_models(train[features], train["y"].to_numpy())
    fitted = time.perf_counter()
    predicted = fcst.models_["lightgbm"].predict(test[features])
    done = time.perf_counter()
    parameters = fcst.models_["lightgbm"].get_params()
    return {"import_seconds": imported - began, "read_seconds": read - imported, "features_seconds": derived - read,
            "fit_seconds": fitted - derived, "predict_seconds": done - fitted, "train_rows": len(train),
            "test_rows": len(test), "features": features, **scores(test["y"], predicted),
            "lightgbm_parameters": {k: v for k, v in parameters.items() if v is not None},
            "versions": {p: importlib.metadata.version(p) for p in ("mlforecast", "lightgbm", "pandas", "numpy")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="the national table (CSV, gzip or not)")
    parser.add_argument("--date", default="date")
    parser.add_argument("--target", default="Load")
    parser.add_argument("--train-end", default="2023-12-31", help="the last day of the fit (inclusive)")
    parser.add_argument("--test-start", default="2024-01-01")
    parser.add_argument("--test-end", default="2024-12-31", help="the last day of the test (inclusive)")
    parser.add_argument("--day-mean", choices=["calendar", "rolling"], default="calendar")
    args = parser.parse_args(argv)
    try:
        out = {"status": "ok", **run(args)}
    except Exception as exc:  # a crash is a recorded outcome, not a benchmark failure
        traceback.print_exc(file=sys.stderr)
        out = {"status": "error", "error_kind": type(exc).__name__, "error": (str(exc).splitlines() or [""])[0][:300]}
    sys.stdout.write(RESULT_PREFIX + json.dumps(out, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
