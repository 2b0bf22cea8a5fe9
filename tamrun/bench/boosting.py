"""python -m tamrun.bench.boosting: tamrun's day-ahead models against mlforecast + LightGBM on the embedded
national table, in one run, idle and beside busy processes.

    python -m tamrun.bench.boosting --mlforecast-python /work/peers/mlforecast/bin/python
    python -m tamrun.bench.boosting --sides tamrun --conditions idle -r 1        # tamrun only
    python -m tamrun.bench.boosting --mlforecast-python ... --tamrun model=spline_lags \\
        --tamrun +experiment=day_ahead_static                                    # the commands measured

Both sides fit 2013-2023 and forecast 2024 from the same information: the load up to the end of the day
before, the calendar, the day's actual temperatures. tamrun's runs are the whole command a user types,
``python -m tamrun <overrides>`` (``--tamrun``, repeatable; default `TAMRUN_COMMANDS`), each in a fresh
process recording its metrics into a sqlite store of its own (`STORE_ARGUMENTS`: no predictions, plots or
model logged), from which RMSE, MAPE and the fit seconds are read. The peer (`tamrun.bench.boost_child`,
in its own virtual environment: ``--mlforecast-python``) is one static LightGBM fit with mlforecast's lags.

Every process is reaped with ``os.wait4`` (`tamrun.bench.commands.measured_run`): its wall seconds, its CPU
seconds (user + system, its threads and waited-for children included) and its resident-set high-water
mark. Prints the machine (`tamrun.bench.machine`), the command and a markdown table; writes the records as
JSON and the table to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tamrun.bench.commands import Measured, error_record, measured_run, result_record
from tamrun.bench.load import base_environment, busy_processes
from tamrun.bench.machine import header_lines, machine_info
from tamrun.bench.report import MIB, Spread, cell
from tamrun.redact import redacted

log = logging.getLogger("tamrun.bench.boosting")
BOOST_CHILD = Path(__file__).with_name("boost_child.py")
TAMRUN_COMMANDS = ("model=spline_lags", "+experiment=day_ahead", "+experiment=day_ahead_aggregate")
STORE_ARGUMENTS = ("tracking.log_predictions=false", "tracking.log_plots=false", "tracking.log_model=false",
                   "progress=off")
FIT_METRICS = ("fit_seconds", "compute_seconds")  # the first a run reports: a static fit, else all its work
LIGHTGBM = "mlforecast + LightGBM (static)"
SETUP = ("python3 -m venv /work/peers/mlforecast && "
         "/work/peers/mlforecast/bin/pip install mlforecast lightgbm pandas")


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.boosting", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mlforecast-python", help="python of the peer's virtual environment (mlforecast, lightgbm)")
    parser.add_argument("--sides", default="tamrun,lightgbm")
    parser.add_argument("--tamrun", action="append", metavar="OVERRIDES",
                        help=f"one tamrun command's overrides (repeatable; default: {', '.join(TAMRUN_COMMANDS)})")
    parser.add_argument("--conditions", default="idle,loaded", help="idle, loaded (beside --busy processes)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs")
    parser.add_argument("-r", "--repeats", type=int, default=3, help="tamrun's runs per condition (LightGBM: one)")
    parser.add_argument("--day-mean", choices=["calendar", "rolling"], default="calendar",
                        help="the peer's previous day's mean (tamrun/bench/boost_child.py)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is cut")
    parser.add_argument("--out", default="outputs/bench")
    return parser.parse_args(argv)


def tamrun_commands(values: Optional[Sequence[str]]) -> List[Tuple[str, List[str]]]:
    """(label, overrides) of each ``--tamrun`` value (whitespace-separated overrides, shell quoting kept);
    `TAMRUN_COMMANDS` without any. ValueError for an empty one."""
    out = []
    for value in values or TAMRUN_COMMANDS:
        overrides = shlex.split(value)
        if not overrides:
            raise ValueError("--tamrun needs at least one override, e.g. --tamrun model=spline_lags")
        out.append(("tamrun " + " ".join(overrides), overrides))
    return out


def missing_peer(python: Optional[str]) -> Optional[str]:
    """Why the peer cannot run from ``python`` (None when it can): no interpreter, or no mlforecast/lightgbm."""
    import subprocess

    if not python:
        return "no --mlforecast-python given"
    if not Path(python).is_file():
        return f"--mlforecast-python={python}: no such file"
    done = subprocess.run([python, "-I", "-c", "import mlforecast, lightgbm"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"--mlforecast-python={python}: " + (done.stderr.strip().splitlines() or ["cannot run"])[-1]
    return None


def tamrun_record(overrides: List[str], workdir: Path, timeout: float) -> dict:
    """One tamrun command, measured; RMSE, MAPE and fit seconds from its store."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{workdir / 'store.db'}"
    command = [sys.executable, "-m", "tamrun", *overrides, f"tracking.uri={store}", *STORE_ARGUMENTS,
               f"hydra.run.dir={workdir / 'run'}"]
    done = measured_run(command, timeout, env=base_environment(), cwd=workdir)
    record = process_record(done)
    if done.returncode != 0 or done.timed_out:
        return {**record, **({} if done.timed_out else error_record(done.stderr, done.returncode))}
    metrics = store_metrics(workdir / "store.db")
    fit = next((key for key in FIT_METRICS if key in metrics), None)
    return {**record, "status": "ok", "rmse": metrics.get("rmse_test"), "mape": metrics.get("mape_test"),
            "fit_seconds": metrics.get(fit) if fit else None, "fit_metric": fit}


def store_metrics(db: Path) -> Dict[str, float]:
    """The metrics of the one run of the sqlite store ``db``, by plain name, read with sqlite3: importing MLflow
    would raise this process's resident set, the floor of every later child's (`measured_run`)."""
    import sqlite3

    from tamrun.tracking.metric_keys import metric_name

    with contextlib.closing(sqlite3.connect(db)) as connection:
        rows = connection.execute("SELECT key, value FROM latest_metrics").fetchall()
    return {metric_name(key): float(value) for key, value in rows}


def lightgbm_record(python: str, day_mean: str, timeout: float) -> dict:
    """The peer's run (`tamrun.bench.boost_child`) in its environment, measured. ``-I``: neither this
    process's PYTHONPATH nor tamrun/bench (whose module names could shadow a library's) is on its path."""
    from tamrun.data.load import embedded_path

    command = [python, "-I", str(BOOST_CHILD), "--data", str(embedded_path()), "--day-mean", day_mean]
    done = measured_run(command, timeout, env=base_environment())
    record = result_record(done.stdout) or ({} if done.timed_out else error_record(done.stderr, done.returncode))
    return {**record, **process_record(done)}


def process_record(done: Measured) -> dict:
    """What the kernel counted for a finished run (a timeout marks the record)."""
    record = {"wall_seconds": done.wall_seconds, "cpu_seconds": done.cpu_seconds, "peak_bytes": done.peak_bytes,
              "peak_floor_bytes": done.floor_bytes}
    return {**record, "status": "timeout"} if done.timed_out else record


def measure(args: argparse.Namespace, commands: List[Tuple[str, List[str]]], workdir: Path) -> List[dict]:
    """Every run of every condition (idle, then beside ``--busy`` processes), each a record."""
    sides = args.sides.split(",")
    records = []
    for condition in args.conditions.split(","):
        with busy_processes(args.busy if condition == "loaded" else 0):
            runs = [(label, lambda o=overrides, k=len(records) + i: tamrun_record(o, workdir / f"run{k}", args.timeout))
                    for i, (label, overrides) in enumerate(commands * args.repeats) if "tamrun" in sides]
            if "lightgbm" in sides:
                runs.append((LIGHTGBM, lambda: lightgbm_record(args.mlforecast_python, args.day_mean, args.timeout)))
            for name, run in runs:
                record = {"run": name, "condition": condition, **run()}
                log.info("%s, %s: %s", name, condition, {k: v for k, v in record.items() if k != "features"})
                records.append(record)
    return records


def median(records: List[dict], key: str, fmt: str) -> str:
    """The median of ``key`` over ``records`` (which the load does not change: an RMSE), as a cell."""
    found = Spread.of([r.get(key) for r in records])
    return cell(found.median if found else None, fmt)


def where(condition: str, busy: int) -> str:
    return condition if condition == "idle" else f"beside {busy} busy"


def table(records: List[dict], busy: int) -> List[str]:
    """The markdown table: per condition and run, the RMSE and MAPE of 2024, the medians (min–max) over
    its repeats of the fit, CPU and wall seconds and of the peak resident set (``≤`` when a run's peak is
    this process's own high-water mark, which it inherits: `tamrun.bench.commands.measured_run`)."""
    lines = ["| condition | run | ok | RMSE 2024 MW | MAPE 2024 % | fit s | process CPU s | wall s | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for record in records:
        groups.setdefault((record["condition"], record["run"]), []).append(record)
    for (condition, run), runs in groups.items():
        ok = [r for r in runs if r.get("status") == "ok"]

        def spread(key: str, scale: float = 1.0, fmt: str = ".1f") -> str:
            found = Spread.of([r[key] / scale for r in ok if r.get(key) is not None])
            if found is None:
                return "–"
            median = cell(found.median, fmt)
            return median if len(ok) == 1 else f"{median} ({cell(found.low, fmt)}–{cell(found.high, fmt)})"

        at_floor = any(r.get("peak_bytes", 0) <= r.get("peak_floor_bytes", -1) for r in ok)  # the bench's own
        lines.append(f"| {where(condition, busy)} | {run} | {len(ok)}/{len(runs)} | {median(ok, 'rmse', ',.1f')} | "
                     f"{median(ok, 'mape', '.3f')} | {spread('fit_seconds', fmt='.2f')} | {spread('cpu_seconds')} | "
                     f"{spread('wall_seconds')} | {'≤ ' if at_floor else ''}{spread('peak_bytes', MIB, '.0f')} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        commands = tamrun_commands(args.tamrun)
    except ValueError as error:
        sys.stderr.write(redacted(f"tamrun.bench.boosting: {error}\n"))
        return 2
    if "lightgbm" in args.sides.split(","):
        why = missing_peer(args.mlforecast_python)
        if why:
            sys.stderr.write(redacted(f"tamrun.bench.boosting: {why}. Set up the peer's environment "
                                      f"(docs/benchmarks.md): {SETUP}; then pass --mlforecast-python "
                                      "/work/peers/mlforecast/bin/python (or --sides tamrun to measure tamrun only)\n"))
            return 2
    machine = header_lines(machine_info())
    with tempfile.TemporaryDirectory(prefix="tamrun-bench-boosting-") as tmp:
        records = measure(args, commands, Path(tmp))
    command = "python -m tamrun.bench.boosting " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                       else sys.argv[1:]))
    command = redacted(command)  # an override may carry a store's password (tracking.uri)
    report = redacted("\n".join([*machine, f"- command: `{command.strip()}`", "", *table(records, args.busy)]) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"boosting-{dt.datetime.now():%Y%m%d-%H%M%S}"
    recorded = {"machine": machine, "command": command, "records": records}
    stem.with_suffix(".json").write_text(redacted(json.dumps(recorded, indent=2, default=str)))
    stem.with_suffix(".md").write_text(report)
    sys.stdout.write(report)
    return 0 if all(r.get("status") == "ok" for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
