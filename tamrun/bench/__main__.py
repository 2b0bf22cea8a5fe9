"""python -m tamrun.bench: tamrun and the peer side by side, in one invocation, each run in a fresh process.

    python -m tamrun.bench --peer-python ../peer-venv/bin/python                   # CPU, fourier + spline, r=3
    python -m tamrun.bench --peer-python ... --device cuda --cap 0.02
    python -m tamrun.bench --peer-python ... --models forest_fourier,forest_fourier:solver=direct
    python -m tamrun.bench --models fourier,forest --baseline ../old-checkout -r 5   # tamrun old vs new

tamrun's side runs what ``python -m tamrun`` runs with the default settings (its phases, the memory
meter): its fit column is the command's ``fit=``. The bare fit (`tamrun.pipeline.fit_model` timed
directly, in a fresh process of its own) is the second column.

A model is a preset, optionally followed by tamrun overrides after colons (``preset:key=value:...``);
the peer fits the preset's formula, once per preset and repeat, shared by the rows of that preset.

It installs nothing: the peer (tam-ml 1.5.0) lives in its own virtual environment, whose python is
passed with --peer-python (without it only tamrun is measured). Both sides fit the same formula
(translated from tamrun's preset), on the same data and split, on the same machine. --baseline adds
a third side: tamrun from another checkout (its tamrun/ first on PYTHONPATH), interleaved with this
one, to compare two versions of tamrun in one run. A crash or a timeout is a recorded outcome.
Writes <out>/bench-<device>-<time>.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

from tamrun.bench.commands import run_child, write_report
from tamrun.bench.machine import machine_info
from tamrun.bench.report import markdown

log = logging.getLogger("tamrun.bench")
CHILD = Path(__file__).with_name("child.py")


def peer_arguments(model: str) -> List[str]:
    """The peer's formula and data for one of tamrun's presets (same data file, same split)."""
    from hydra import compose, initialize_config_dir

    from tamrun.bench.formula import peer_formula
    from tamrun.config.load import config_dir, typed_config
    from tamrun.config.store import register_configs
    from tamrun.data.load import embedded_path

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", "tracking=none"])
    config, specs = typed_config(cfg)
    test_end = (dt.date.fromisoformat(config.split.test_end) + dt.timedelta(days=1)).isoformat()
    return ["--formula", peer_formula(config.data.target, specs), "--data", str(embedded_path()),
            "--date", config.data.date_column, "--group", config.data.group, "--target", config.data.target,
            "--test-start", config.split.test_start, "--test-end", test_end]


def tamrun_record(command: List[str], timeout: float) -> dict:
    """tamrun's record: the run's path as ``python -m tamrun`` runs it (its fit: the command's ``fit=``),
    with the bare fit (`tamrun.pipeline.fit_model` timed directly, in a fresh process of its own) beside it
    as ``bare_fit_seconds``."""
    record = run_child(command, timeout)
    bare = run_child(command + ["--bare"], timeout)
    if bare.get("status") == "ok":
        record["bare_fit_seconds"] = bare["fit_seconds"]
    return record


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer-python", help="python of the peer's virtual environment (tam-ml 1.5.0)")
    parser.add_argument("--models", default="fourier,spline", help="comma-separated presets")
    parser.add_argument("--repeats", "-r", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--cap", type=float, default=None,
                        help="torch.cuda.set_per_process_memory_fraction for both sides (tamrun: as memory.limit)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is recorded as a timeout")
    parser.add_argument("--peer-max-iter", type=int, default=None, help="cap on the peer's CG iterations (stated in the table)")
    parser.add_argument("--sides", default="tamrun,peer")
    parser.add_argument("--baseline", help="another tamrun checkout, measured as the side 'baseline'")
    parser.add_argument("--out", default="outputs/bench")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    sides = [s for s in args.sides.split(",") if s == "tamrun" or (s == "peer" and args.peer_python)]
    sides += ["baseline"] if args.baseline else []
    baseline_env = {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())} if args.baseline else None
    if "peer" in args.sides and not args.peer_python:
        log.warning("no --peer-python: measuring tamrun only")
    common = ["--device", args.device] + (["--cap", str(args.cap)] if args.cap is not None else [])
    records = []
    peer_runs: Dict[tuple, dict] = {}  # (preset, repeat) -> the peer's record, shared by that preset's rows
    for model in args.models.split(","):
        preset, *overrides = model.split(":")
        peer_args = peer_arguments(preset) if "peer" in sides else []
        if args.peer_max_iter is not None:
            peer_args += ["--peer-max-iter", str(args.peer_max_iter)]
        for repeat in range(args.repeats):
            for side in sides:  # interleaved, so that drift hits both sides alike
                if side in ("tamrun", "baseline"):
                    command = [sys.executable, "-m", "tamrun.bench.child", "--side", "tamrun", "--model", preset]
                    command += [f"--override={item}" for item in overrides] + common
                    record = (run_child(command, args.timeout, baseline_env, str(Path(args.baseline).resolve()))
                              if side == "baseline" else tamrun_record(command, args.timeout))
                elif (preset, repeat) in peer_runs:
                    record = dict(peer_runs[preset, repeat])
                else:
                    command = [args.peer_python, str(CHILD), "--side", "peer", "--model", preset] + peer_args
                    record = peer_runs[preset, repeat] = run_child(command + common, args.timeout)
                    record = dict(record)
                record.update(model=model, side=side, repeat=repeat)
                log.info("%s %s #%d: %s fit %.2fs rmse %s", model, side, repeat, record["status"],
                         record.get("fit_seconds", float("nan")), record.get("rmse"))
                records.append(record)

    command_line = "python -m tamrun.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    header = {"title": f"{args.device}{f', cap {args.cap}' if args.cap else ''}, float64, r = {args.repeats}",
              "command": f"`{command_line}`", "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
              **machine_info(args.device)}
    stem = write_report(args.out, f"bench-{args.device}", header, records, markdown(records, header))
    log.info("wrote %s.json and .md", stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
