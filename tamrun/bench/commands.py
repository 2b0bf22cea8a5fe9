"""The benchmarks' fresh processes: a whole ``python -m tamrun`` command (`tamrun.bench.e2e`, `bench.meter`,
`bench.sweeps`), a benchmark child (`tamrun.bench.child`), and the report of a measurement over presets."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
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
    """The metrics of the store's latest run (`latest_run`) by plain name
    (``system/time/solve_seconds``: ``solve_seconds``)."""
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
    record = result_record(done.stdout)
    if record is None:
        return error_record(done.stderr, done.returncode)
    record["wall_seconds"] = time.perf_counter() - began
    return record


def result_record(stdout: str) -> Optional[dict]:
    """A child's ``BENCH_RESULT`` record (None when it printed none)."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None


def error_record(stderr: str, returncode: int) -> dict:
    """The record of a process that failed: its exit code and the last line of its stderr."""
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "error_kind": f"exit {returncode}", "error": tail[:300]}


@dataclass
class Measured:
    """A finished process: its exit code and output, and what the kernel counted for it (`measured_run`)."""

    returncode: int
    stdout: str
    stderr: str
    wall_seconds: float
    cpu_seconds: float  # user + system of the process and every descendant it waited for
    peak_bytes: int  # the largest resident set of the process or one of those descendants (ru_maxrss)
    timed_out: bool
    floor_bytes: int  # this process's own high-water mark at the start, which the child's ru_maxrss inherits


def measured_run(command: List[str], timeout: float, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[Path] = None) -> Measured:
    """Run ``command`` to its end (killed after ``timeout`` seconds) and reap it with ``os.wait4``: its own
    CPU time and resident-set high-water mark, those of its waited-for descendants included, whatever
    else this process runs or reaps meanwhile (busy processes). Linux hands a process's high-water mark on
    to the program it executes, so a child's ``ru_maxrss`` is at least this process's own at the start
    (``floor_bytes``): a peak at that floor is this process's, not the child's."""
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        killed = threading.Event()
        timer = threading.Timer(timeout, lambda: (killed.set(), process.kill()))
        timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - began
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        return Measured(process.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                        wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, killed.is_set(), floor)


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


def write_report(out: str, name: str, header: Dict[str, str], records: object, text: str) -> Path:
    """Write ``<out>/<name>-<time>.json`` (the header and the records) and ``.md`` (``text``), print ``text``;
    the files' stem."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps({"header": header, "records": records}, indent=2))
    stem.with_suffix(".md").write_text(text)
    sys.stdout.write(text)
    return stem
