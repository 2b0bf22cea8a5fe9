"""python -m tamrun.bench.backtest: a 52-window weekly backtest of a raw hourly table against one fit of it,
and against statsforecast's ``cross_validation`` of its MSTL on the same table and windows, idle and
beside busy processes.

    python -m tamrun.bench.backtest --statsforecast-python /work/peers/statsforecast/bin/python
    python -m tamrun.bench.backtest --sides tamrun --conditions idle          # tamrun only, idle

The table is `tamrun.bench.sites.hourly_sites` (``--sites`` sites, hourly, ``--start`` to ``--end`` in
``--timezone``, days off of ``--country``) written to a temporary CSV, dates with their UTC offsets.
tamrun's runs are the whole command a user types (`tamrun_arguments`), each in a fresh process into a
sqlite store of its own, timed from start to exit:

    backtest              mode=backtest: ``--windows`` cut-offs at the local midnights from split.test_start,
                          every ``--step-days``, each trained on everything before it (expanding) and scored
                          on the ``--horizon-days`` after it; model=calendar + a spline of the temperature
    backtest without temperature: the same without the temperature (MSTL has no weather either)
    one fit               mode=run: trained up to split.train_end, tested on the windows' span
    one fit without temperature: the same without the temperature

statsforecast's run (`tamrun.bench.mstl_child`, in its own virtual environment: ``--statsforecast-python``)
is ``MSTL(season_length=[24, 168])`` (its default trend forecaster, AutoETS) through
``cross_validation(h=168, step_size=168, n_windows=52)`` on ``unique_id`` = site, ``ds`` = the hour in UTC,
the table cut where tamrun's last window ends (`window_bounds`): both sides then score the same hours.
Its time is the whole process (start, imports, reading, cross-validation) and the cross-validation alone.

RMSE is computed alike on both sides: each window's RMSE over every site's hours, their mean over the
windows (tamrun's ``rmse_backtest``), and the pooled RMSE of every window's hours together (tamrun's from
its ``rmse_window`` history weighted by each window's rows). Prints the machine (`tamrun.bench.machine`),
the command and a markdown table; writes the records as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from tamrun.bench.commands import latest_metrics, latest_run, run_child, run_tamrun
from tamrun.bench.load import base_environment, busy_processes
from tamrun.bench.machine import header_lines, machine_info

log = logging.getLogger("tamrun.bench.backtest")
MSTL_CHILD = Path(__file__).with_name("mstl_child.py")
TEMPERATURE = "+model.effects.temperature={kind: spline, column: temperature, k: 20, deg: 3, p: 2, ap: -5}"
VARIANTS: Dict[str, List[str]] = {  # tamrun's runs: name -> (the mode, with the temperature)
    "backtest": ["mode=backtest", TEMPERATURE], "backtest without temperature": ["mode=backtest"],
    "one fit": ["mode=run", TEMPERATURE], "one fit without temperature": ["mode=run"]}
STATSFORECAST = "statsforecast MSTL cross_validation"


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.backtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--statsforecast-python", help="python of statsforecast's virtual environment")
    parser.add_argument("--sides", default="tamrun,statsforecast")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated tamrun runs (VARIANTS)")
    parser.add_argument("--conditions", default="idle,loaded", help="idle, loaded (beside --busy processes)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs")
    parser.add_argument("-r", "--repeats", type=int, default=3, help="tamrun's runs per condition (statsforecast: one)")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--start", default="2021-01-01")
    parser.add_argument("--end", default="2023-12-31")
    parser.add_argument("--timezone", default="Europe/Paris")
    parser.add_argument("--country", default="FR")
    parser.add_argument("--test-start", default="2023-01-01", help="the first cut-off (a local midnight)")
    parser.add_argument("--windows", type=int, default=52)
    parser.add_argument("--step-days", type=int, default=7)
    parser.add_argument("--horizon-days", type=int, default=7)
    parser.add_argument("--n-jobs", type=int, default=-1, help="statsforecast's n_jobs (-1: every core)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before statsforecast's run is cut")
    parser.add_argument("--out", default="outputs/bench")
    return parser.parse_args(argv)


def window_bounds(test_start: str, windows: int, step_days: int, horizon_days: int, timezone: str) -> list:
    """[(cut-off, end)] of each window: local midnights (time zone aware) from ``test_start``, every
    ``step_days``, each ``horizon_days`` long (23 or 25 h days where the clocks change)."""
    import pandas as pd

    first = dt.date.fromisoformat(test_start)

    def midnight(days: int):
        return pd.Timestamp(first + dt.timedelta(days=days)).tz_localize(timezone)

    return [(midnight(k * step_days), midnight(k * step_days + horizon_days)) for k in range(windows)]


def window_rows(dates, bounds: list) -> List[int]:
    """The rows of each window (``dates``: the table's time zone aware dates, every group)."""
    return [int(((dates >= start) & (dates < end)).sum()) for start, end in bounds]


def pooled(window_rmse: List[float], rows: List[int]) -> float:
    """The RMSE of every window's rows together, from each window's RMSE and rows."""
    return math.sqrt(sum(n * r * r for n, r in zip(rows, window_rmse)) / sum(rows))


def tamrun_arguments(csv: Path, variant: str, args: argparse.Namespace, workdir: Path) -> List[str]:
    """The whole command a user types for ``variant`` (module docstring), into ``workdir``'s store."""
    last_day = (dt.date.fromisoformat(args.test_start)
                + dt.timedelta(days=(args.windows - 1) * args.step_days + args.horizon_days - 1))
    train_end = dt.date.fromisoformat(args.test_start) - dt.timedelta(days=1)
    name = variant.replace(" ", "_")
    backtest = [f"backtest.windows={args.windows}", f"backtest.step={args.step_days}D",
                f"backtest.horizon={args.horizon_days}D", "backtest.refit=expanding"]
    return ["data=csv", f"data.path={csv}", "data.target=load", "data.group=site", f"data.timezone={args.timezone}",
            f"data.holidays={args.country}", "model=calendar", *VARIANTS[variant],
            f"split.train_end={train_end}", f"split.test_start={args.test_start}", f"split.test_end={last_day}",
            *(backtest if "mode=backtest" in VARIANTS[variant] else []),
            f"tracking.uri=sqlite:///{workdir / name}.db", "progress=off", f"hydra.run.dir={workdir / name}-run"]


def tamrun_record(csv: Path, variant: str, args: argparse.Namespace, workdir: Path, rows: List[int]) -> dict:
    """One tamrun run's wall seconds and RMSEs (read from its store); an error record when it fails."""
    arguments = tamrun_arguments(csv, variant, args, workdir)
    try:
        seconds, _ = run_tamrun(variant, arguments, workdir)
    except RuntimeError as error:
        return {"status": "error", "error": str(error)[-300:]}
    uri = arguments[-3].split("=", 1)[1]
    metrics = latest_metrics(uri)
    record = {"status": "ok", "wall_seconds": seconds, "rmse_test": metrics.get("rmse_test"),
              "fit_seconds": metrics.get("fit_seconds")}
    if "backtest" in variant:
        from mlflow.tracking import MlflowClient

        from tamrun.tracking.metric_keys import metric_key

        history = MlflowClient(tracking_uri=uri).get_metric_history(latest_run(uri).info.run_id,
                                                                    metric_key("rmse_window"))
        window_rmse = [m.value for m in sorted(history, key=lambda m: m.step)]
        record.update(rmse_backtest=metrics.get("rmse_backtest"), window_rmse=window_rmse,
                      rmse_mean_of_windows=sum(window_rmse) / len(window_rmse) if window_rmse else None,
                      rmse_pooled=pooled(window_rmse, rows) if len(window_rmse) == len(rows) else None)
    return record


def statsforecast_record(csv: Path, args: argparse.Namespace, end_utc: str) -> dict:
    """statsforecast's run (`tamrun.bench.mstl_child`) in its environment: ``-I``, so that neither this
    process's PYTHONPATH nor the child's folder (tamrun/bench, whose module names could shadow a library's)
    is on its path."""
    command = [args.statsforecast_python, "-I", str(MSTL_CHILD), "--data", str(csv), "--end", end_utc,
               "--h", str(24 * args.horizon_days), "--step", str(24 * args.step_days),
               "--windows", str(args.windows), "--n-jobs", str(args.n_jobs)]
    return run_child(command, args.timeout, env=base_environment())


def measure(args: argparse.Namespace, workdir: Path) -> List[dict]:
    """Every run of every condition (idle, then beside ``--busy`` processes), each a record."""
    from tamrun.bench.sites import hourly_sites, write_sites

    frame = hourly_sites(args.sites, args.start, args.end, args.timezone, args.country)
    csv = write_sites(frame, workdir / "sites.csv")
    bounds = window_bounds(args.test_start, args.windows, args.step_days, args.horizon_days, args.timezone)
    rows = window_rows(frame["date"], bounds)
    end_utc = bounds[-1][1].tz_convert("UTC").tz_localize(None).isoformat()
    sides = args.sides.split(",")
    records = []
    for condition in args.conditions.split(","):
        with busy_processes(args.busy if condition == "loaded" else 0):
            runs = [(v, lambda v=v: tamrun_record(csv, v, args, workdir, rows))
                    for _ in range(args.repeats) for v in args.variants.split(",") if "tamrun" in sides]
            if "statsforecast" in sides and args.statsforecast_python:
                runs.append((STATSFORECAST, lambda: statsforecast_record(csv, args, end_utc)))
            for name, run in runs:
                record = {"run": name, "condition": condition, **run()}
                log.info("%s, %s: %s", name, condition, {k: v for k, v in record.items() if "window_" not in k})
                records.append(record)
    return records


def cell(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table(records: List[dict], busy: int) -> List[str]:
    """The markdown table: per condition and run, the median wall time of its repeats (and each), the ratio
    of a backtest's to the one fit's with the same effects, statsforecast's cross-validation alone, the RMSEs."""
    lines = ["| condition | run | ok | wall s (median) | / one fit | runs: wall s | cross_validation s | windows | "
             "RMSE mean of windows | RMSE pooled | RMSE one fit (test) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: Dict[tuple, List[dict]] = {}
    for record in records:
        groups.setdefault((record["condition"], record["run"]), []).append(record)
    walls = {key: [r["wall_seconds"] for r in runs if r.get("status") == "ok"] for key, runs in groups.items()}
    median = {key: statistics.median(values) if values else None for key, values in walls.items()}
    for (condition, run), runs in groups.items():
        ok = [r for r in runs if r.get("status") == "ok"]
        last = ok[-1] if ok else {}
        one_fit = median.get((condition, run.replace("backtest", "one fit"))) if "backtest" in run else None
        ratio = median[condition, run] / one_fit if one_fit and median[condition, run] else None
        where = condition if condition == "idle" else f"beside {busy} busy"
        lines.append(f"| {where} | {run} | {len(ok)}/{len(runs)} | {cell(median[condition, run], 1)} | {cell(ratio)} | "
                     f"{', '.join(f'{w:.1f}' for w in walls[condition, run]) or '–'} | "
                     f"{cell(last.get('cross_validation_seconds'), 1)} | {len(last.get('window_rmse') or []) or '–'} | "
                     f"{cell(last.get('rmse_mean_of_windows'), 3)} | {cell(last.get('rmse_pooled'), 3)} | "
                     f"{cell(last.get('rmse_test') if 'one fit' in run else None, 3)} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        sys.stderr.write(f"unknown variant(s) {unknown}: use some of {list(VARIANTS)}\n")
        return 2
    if "statsforecast" in args.sides.split(",") and not args.statsforecast_python:
        log.warning("no --statsforecast-python: measuring tamrun only")
    machine = header_lines(machine_info())
    with tempfile.TemporaryDirectory(prefix="tamrun-bench-backtest-") as tmp:
        records = measure(args, Path(tmp))
    command = "python -m tamrun.bench.backtest " + " ".join(argv if argv is not None else sys.argv[1:])
    report = "\n".join([*machine, f"- command: `{command.strip()}`", "", *table(records, args.busy)]) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"backtest-{dt.datetime.now():%Y%m%d-%H%M%S}"
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine, "command": command, "records": records},
                                                    indent=2))
    stem.with_suffix(".md").write_text(report)
    sys.stdout.write(report)
    return 0 if all(r.get("status") == "ok" for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
