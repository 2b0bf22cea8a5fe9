"""python -m tamrun.bench.rss: the resident set of a whole run against its plan's promise.

    python -m tamrun.bench.rss --limits fourier=5MiB,spline=9MiB,forest=19MiB,forest_fourier=26MiB

Each preset runs once in a fresh process (``python -m tamrun``) with ``memory.limit=L``, plots and
the model logged, into a fresh sqlite store, and the run's own figures are read back from MLflow:
its planning baseline (the resident set when the plan was made, after imports, data and features),
the highest resident set of every phase after the plan (solve, predict, evaluate, record: the Linux
high-water mark, reset at each phase), memory.safety_margin and the recording's reserve (what the
predictions table, the plots and the model add, `tamrun.memory.footprint.recording_bytes`). The promise
checked:

    peak after planning <= baseline + L + safety margin + recording reserve

Prints a markdown table (the one in docs/memory.md); exit code 1 when a run breaks it or fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from tamrun.config.units import parse_size
from tamrun.bench.commands import latest_metrics

MIB = 2**20
DEFAULT_LIMITS = "fourier=5MiB,spline=9MiB,forest=19MiB,forest_fourier=26MiB"
HEADER = ["| model | memory.limit MiB | exit | baseline MiB | peak after planning MiB | peak − baseline MiB | "
          "limit + margin + reserve MiB | within | record phase peak − baseline MiB | rmse_test | fit s |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]


def run_preset(model: str, limit: str, margin: str, workdir: Path, extra: List[str]) -> Dict[str, float]:
    """One run in a fresh process; its MLflow metrics (empty when it did not finish) and exit code."""
    store = f"sqlite:///{workdir / model}.db"
    command = [sys.executable, "-m", "tamrun", f"model={model}", f"memory.limit={limit}",
               f"memory.safety_margin={margin}", f"tracking.uri={store}", "tracking.log_plots=true",
               "tracking.log_model=true", f"hydra.run.dir={workdir / ('hydra-' + model)}", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        return {"exit": float(done.returncode)}
    return {"exit": 0.0, **latest_metrics(store)}


def row(model: str, limit: int, m: Dict[str, float]) -> str:
    if m["exit"] != 0:
        return f"| {model} | {limit / MIB:.1f} | {int(m['exit'])} |" + " |" * 8
    base, peak = m["planning_baseline_bytes"], m["peak_after_planning_bytes"]
    margin = m["safety_margin_bytes"] + m["recording_reserve_bytes"]
    within = "yes" if peak <= base + limit + margin else "**no**"
    return (f"| {model} | {limit / MIB:.1f} | 0 | {base / MIB:.1f} | {peak / MIB:.1f} | {(peak - base) / MIB:.1f} | "
            f"{(limit + margin) / MIB:.1f} | {within} | {(m['peak_memory_record_bytes'] - base) / MIB:.1f} | "
            f"{m['rmse_test']:.1f} | {m['fit_seconds']:.2f} |")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.rss", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limits", default=DEFAULT_LIMITS, help="preset=memory.limit,... (default: %(default)s)")
    parser.add_argument("--margin", default="16MiB", help="memory.safety_margin (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", help="further tamrun overrides for every run")
    args = parser.parse_args(argv)
    rows, broken = list(HEADER), False
    with tempfile.TemporaryDirectory(prefix="tamrun-rss-") as tmp:
        for item in args.limits.split(","):
            model, limit = item.split("=", 1)
            metrics = run_preset(model, limit, args.margin, Path(tmp), args.overrides)
            rows.append(row(model, parse_size(limit), metrics))
            broken |= metrics["exit"] != 0 or "**no**" in rows[-1]
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
