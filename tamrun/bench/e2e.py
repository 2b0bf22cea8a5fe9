"""python -m tamrun.bench.e2e: where the time of a whole recorded run goes, preset by preset; and a
checkout's runs against another's.

    python -m tamrun.bench.e2e -r 3                                   # fourier, spline, forest, forest_fourier
    python -m tamrun.bench.e2e --models forest -r 5 hw.threads=1
    python -m tamrun.bench.e2e --models fourier --baseline ../old-checkout -r 5

Each run is ``python -m tamrun model=<preset> tracking.uri=sqlite:///<its store> progress=off
[overrides]`` in a fresh process, into a store that one untimed run created first (the usual case);
with --baseline the same runs of the other checkout (its tamrun first on PYTHONPATH), the sides
interleaved ``-r`` times. The command's wall time (start to exit) is split with what the run recorded
in its memory/report.json (when the data phase began, each phase's seconds):

    start-up   the process's start to the data phase: imports, Hydra, opening the MLflow run, the
               recording's libraries, the tensor meter's warm-up
    data       the data phase (read, derive, check, split)
    fit        the features and solve phases (the command's ``fit=``)
    predict    the predict and evaluate phases
    recording  the rest: the plan, the dataset inputs, the record phase (metrics, artifacts, plots, the
               model), closing the run and the process's exit

Prints the machine (`tamrun.bench.machine`) and a markdown table: per preset and side, the median of
each part, its share of the median wall time, and the runs' wall times; exit code 1 when a run fails.
A checkout whose report has no start time (before issue 40) gets its wall time only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tamrun.bench.commands import latest_run, report_presets, tamrun_seconds

PRESETS = "fourier,spline,forest,forest_fourier"
PARTS = ("start-up", "data", "fit", "predict", "recording")


def store_uri(workdir: Path, side: str) -> str:
    return f"sqlite:///{workdir / side}.db"


def timed_run(side: str, pythonpath: Optional[str], workdir: Path, overrides: List[str]) -> Tuple[float, float]:
    """(time stamp of the launch, wall seconds) of one ``python -m tamrun`` of ``side`` into its store."""
    launched = time.time()
    seconds = tamrun_seconds(side, [f"tracking.uri={store_uri(workdir, side)}", "progress=off",
                                    f"hydra.run.dir={workdir / side}-run", *overrides], workdir, pythonpath)
    return launched, seconds


def last_report(uri: str, workdir: Path) -> dict:
    """The memory/report.json of the store's latest run."""
    from mlflow.artifacts import download_artifacts

    run = latest_run(uri)
    path = download_artifacts(run_id=run.info.run_id, artifact_path="memory/report.json", tracking_uri=uri,
                              dst_path=str(workdir / "reports" / run.info.run_id))
    return json.loads(Path(path).read_text())


def split(report: dict, launched: float, wall: float) -> Dict[str, Optional[float]]:
    """The run's wall time in `PARTS` (module docstring); start-up None (and in recording) without a start time."""
    phases = {name: phase["seconds"] for name, phase in report.get("phases", {}).items()}
    started = report.get("started_at")
    parts: Dict[str, Optional[float]] = {
        "start-up": None if started is None else started - launched, "data": phases.get("data", 0.0),
        "fit": phases.get("features", 0.0) + phases.get("solve", 0.0),
        "predict": phases.get("predict", 0.0) + phases.get("evaluate", 0.0)}
    parts["recording"] = wall - sum(value for value in parts.values() if value is not None)
    return {"wall": wall, **parts}


def measure(model: str, sides: Dict[str, Optional[str]], repeats: int, overrides: List[str],
            workdir: Path) -> Dict[str, List[Dict[str, Optional[float]]]]:
    """Each side's split runs of ``model``, interleaved (one untimed run per side first: its store)."""
    arguments = [f"model={model}", *overrides]
    runs: Dict[str, List[Dict[str, Optional[float]]]] = {side: [] for side in sides}
    for side, path in sides.items():
        timed_run(side, path, workdir, arguments)
    for _ in range(repeats):
        for side, path in sides.items():
            launched, wall = timed_run(side, path, workdir, arguments)
            runs[side].append(split(last_report(store_uri(workdir, side), workdir), launched, wall))
    return runs


def table(results: Dict[str, Dict[str, List[Dict[str, Optional[float]]]]]) -> List[str]:
    """The markdown table: per preset and side, each part's median seconds and share of the median wall."""
    lines = ["| preset | side | wall s | " + " | ".join(f"{part} s (share)" for part in PARTS) + " | runs: wall s |",
             "|---|---|---|" + "---|" * len(PARTS) + "---|"]
    for model, sides in results.items():
        for side, runs in sides.items():
            wall = statistics.median(run["wall"] for run in runs)
            cells = []
            for part in PARTS:
                values = [run[part] for run in runs if run[part] is not None]
                median = statistics.median(values) if values else None
                cells.append("–" if median is None else f"{median:.2f} ({100 * median / wall:.0f} %)")
            lines.append(f"| {model} | {side} | {wall:.2f} | " + " | ".join(cells) + " | "
                         + ", ".join(f"{run['wall']:.2f}" for run in runs) + " |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=PRESETS, help="comma-separated presets")
    parser.add_argument("--baseline", help="another tamrun checkout, measured as the side 'baseline'")
    parser.add_argument("-r", "--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="tamrun overrides for every run")
    args = parser.parse_args(argv)
    sides: Dict[str, Optional[str]] = {"this": None}
    if args.baseline:
        sides["baseline"] = str(Path(args.baseline).resolve())
    return report_presets("python -m tamrun.bench.e2e", argv, args.models,
                          lambda model, workdir: measure(model, sides, args.repeats, args.overrides, workdir), table)


if __name__ == "__main__":
    raise SystemExit(main())
