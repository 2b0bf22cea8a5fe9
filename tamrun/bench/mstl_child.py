"""statsforecast's side of ``python -m tamrun.bench.backtest``: MSTL's ``cross_validation`` in a fresh process.

Run in statsforecast's own virtual environment, where neither tamrun nor torch is installed (this file
imports neither), as ``<statsforecast python> -I mstl_child.py --data sites.csv --end ... --windows 52``.
It reads the benchmark's CSV (dates with their UTC offsets), takes the rows before ``--end`` (UTC), makes
``unique_id`` = the group, ``ds`` = the hour in UTC (naive: a regular hourly series, no hour missing or
repeated where the clocks change), ``y`` = the target, and runs ``StatsForecast([MSTL(season_length=[24,
168])], freq="h").cross_validation(h, step_size, n_windows)``: MSTL's default trend forecaster (AutoETS),
refitted at every window. Prints one line ``BENCH_RESULT {json}``: the seconds of the imports, of reading
the table and of ``cross_validation``; each window's cut-off and RMSE over every series' hours; the mean
of those RMSEs and the pooled RMSE (every window's hours together).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

RESULT_PREFIX = "BENCH_RESULT "  # the same as tamrun.bench.child.RESULT_PREFIX (this file cannot import it)


def window_scores(cv, model: str = "MSTL") -> dict:
    """Per cut-off RMSE over every series' hours, their mean, and the pooled RMSE of all windows."""
    import numpy as np

    squared = (cv["y"].to_numpy(float) - cv[model].to_numpy(float)) ** 2
    frame = cv.assign(squared=squared)
    per_window = frame.groupby("cutoff", sort=True)["squared"].agg(["mean", "size"])
    rmse = np.sqrt(per_window["mean"].to_numpy())
    return {"window_cutoffs": [str(c) for c in per_window.index], "window_rmse": [float(r) for r in rmse],
            "window_rows": [int(n) for n in per_window["size"]], "rmse_mean_of_windows": float(rmse.mean()),
            "rmse_pooled": float(np.sqrt(squared.mean())), "first_ds": str(cv["ds"].min()), "last_ds": str(cv["ds"].max())}


def run(args: argparse.Namespace) -> dict:
    """Read, cut and cross-validate (module docstring); the seconds of each step."""
    began = time.perf_counter()
    import pandas as pd
    from statsforecast import StatsForecast
    from statsforecast.models import MSTL

    imported = time.perf_counter()
    table = pd.read_csv(args.data, usecols=[args.date, args.group, args.target])
    ds = pd.to_datetime(table[args.date], utc=True).dt.tz_localize(None)
    df = pd.DataFrame({"unique_id": table[args.group], "ds": ds, "y": table[args.target].astype(float)})
    df = df[df["ds"] < pd.Timestamp(args.end)].sort_values(["unique_id", "ds"], kind="stable").reset_index(drop=True)
    read = time.perf_counter()
    seasons = [int(s) for s in args.season_length.split(",")]
    forecaster = StatsForecast(models=[MSTL(season_length=seasons)], freq="h", n_jobs=args.n_jobs)
    cv = forecaster.cross_validation(df=df, h=args.h, step_size=args.step, n_windows=args.windows)
    done = time.perf_counter()
    return {"import_seconds": imported - began, "read_seconds": read - imported,
            "cross_validation_seconds": done - read, "series": int(df["unique_id"].nunique()), "rows": len(df),
            **window_scores(cv)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="the benchmark's CSV")
    parser.add_argument("--end", required=True, help="UTC time (naive) where the last window ends, exclusive")
    parser.add_argument("--date", default="date")
    parser.add_argument("--group", default="site")
    parser.add_argument("--target", default="load")
    parser.add_argument("--h", type=int, default=168, help="hours per window")
    parser.add_argument("--step", type=int, default=168, help="hours between cut-offs")
    parser.add_argument("--windows", type=int, default=52)
    parser.add_argument("--season-length", default="24,168")
    parser.add_argument("--n-jobs", type=int, default=1, help="StatsForecast's n_jobs (-1: every core)")
    args = parser.parse_args(argv)
    try:
        out = {"status": "ok", **run(args)}
    except Exception as exc:  # a crash is a recorded outcome, not a benchmark failure
        traceback.print_exc(file=sys.stderr)
        out = {"status": "error", "error_kind": type(exc).__name__, "error": (str(exc).splitlines() or [""])[0][:300]}
    sys.stdout.write(RESULT_PREFIX + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
