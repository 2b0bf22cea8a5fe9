"""The benchmarks' fresh processes: a whole ``python -m tamrun`` command (`tamrun.bench.e2e`, `bench.meter`,
`bench.sweeps`), a benchmark child (`tamrun.bench.child`), and the report of a measurement over presets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from tamrun.bench.child import RESULT_PREFIX
from tamrun.bench.machine import header_lines, machine_info


def latest_run(uri: str):
    """The latest run of the MLflow store ``uri`` (every experiment): what a benchmark's command just recorded."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1)[0]


def latest_metrics(uri: str) -> Dict[str, float]:
    """The metrics of the store's latest run (`latest_run`) by plain name (``time/fit_seconds``: ``fit_seconds``)."""
    from tamrun.tracking.metric_keys import metric_name

    return {metric_name(key): value for key, value in latest_run(uri).data.metrics.items()}


def run_tamrun(label: str, arguments: List[str], workdir: Path, pythonpath: Optional[str] = None) -> Tuple[float, str]:
    """Seconds from the start to the exit of ``python -m tamrun <arguments>`` in ``workdir`` (``pythonpath``
    first on PYTHONPATH), and its output (stdout, then stderr); RuntimeError naming ``label`` when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tamrun", *arguments], cwd=workdir, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{label} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, done.stdout + done.stderr


def tamrun_seconds(label: str, arguments: List[str], workdir: Path, pythonpath: Optional[str] = None) -> float:
    """Seconds from the start to the exit of ``python -m tamrun <arguments>`` (`run_tamrun`)."""
    return run_tamrun(label, arguments, workdir, pythonpath)[0]


def run_child(command: List[str], timeout: float, env: Optional[Dict[str, str]] = None,
              cwd: Optional[str] = None) -> dict:
    """One fresh process (``env``: its environment, default this one's; ``cwd``: its working folder,
    default this one's); its BENCH_RESULT line, or a timeout / crash record. ``python -m`` puts the
    working folder first on sys.path, before PYTHONPATH: a baseline checkout's child must run inside
    that checkout, or the tamrun of the folder the bench was started from shadows it."""
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": timeout}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            record = json.loads(line[len(RESULT_PREFIX):])
            record["wall_seconds"] = time.perf_counter() - began
            return record
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "error_kind": f"exit {done.returncode}", "error": tail[:300]}


def report_presets(prog: str, argv: Optional[List[str]], presets: str, measure: Callable[[str, Path], object],
                   table: Callable[[Dict[str, object]], List[str]]) -> int:
    """Run ``measure(preset, workdir)`` for each of the comma-separated ``presets`` (one temporary working
    folder for all), then print the machine (its load average read before the runs), the command
    ``prog argv`` and ``table(results)``. 0, or 1 when a run fails (its error on stderr)."""
    machine_lines = header_lines(machine_info())
    results: Dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tamrun-bench-") as tmp:
        try:
            for preset in presets.split(","):
                results[preset] = measure(preset, Path(tmp))
        except (RuntimeError, ValueError) as error:
            sys.stderr.write(f"{error}\n")
            return 1
    command = f"{prog} " + " ".join(argv if argv is not None else sys.argv[1:])
    sys.stdout.write("\n".join([*machine_lines, f"- command: `{command.strip()}`", "", *table(results)]) + "\n")
    return 0
