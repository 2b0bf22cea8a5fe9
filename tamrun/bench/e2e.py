"""python -m tamrun.bench.e2e: the wall time of a whole recorded run, this checkout against another.

    python -m tamrun.bench.e2e --baseline ../old-checkout -r 5

Each side runs ``python -m tamrun tracking.uri=sqlite:///<its store> progress=off [overrides]`` in a
fresh process (the baseline with its checkout first on PYTHONPATH), into a store created by one
untimed run first, the sides interleaved ``-r`` times. Prints the machine (`tamrun.bench.machine`) and a
markdown table of each side's median and runs (seconds from the process's start to its exit); exit code
1 when a run fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from tamrun.bench.machine import header_lines, machine_info


def tamrun_seconds(label: str, arguments: List[str], workdir: Path, pythonpath: Optional[str] = None) -> float:
    """Seconds from the start to the exit of ``python -m tamrun <arguments>`` in ``workdir`` (``pythonpath``
    first on PYTHONPATH); RuntimeError naming ``label`` when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tamrun", *arguments], cwd=workdir, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{label} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def timed_run(name: str, pythonpath: Optional[str], workdir: Path, overrides: List[str]) -> float:
    """Seconds of one ``python -m tamrun`` of side ``name`` (RuntimeError when it fails)."""
    return tamrun_seconds(name, [f"tracking.uri=sqlite:///{workdir / name}.db", "progress=off",
                                 f"hydra.run.dir={workdir / name}-run", *overrides], workdir, pythonpath)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="another tamrun checkout, measured as the side 'baseline'")
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="tamrun overrides for every run")
    args = parser.parse_args(argv)
    sides: Dict[str, Optional[str]] = {"this": None}
    if args.baseline:
        sides["baseline"] = str(Path(args.baseline).resolve())
    seconds: Dict[str, List[float]] = {name: [] for name in sides}
    machine_lines = header_lines(machine_info())  # before the runs: the load average they started in
    with tempfile.TemporaryDirectory(prefix="tamrun-e2e-") as tmp:
        try:
            for name, path in sides.items():
                timed_run(name, path, Path(tmp), args.overrides)  # creates the store: not timed
            for _ in range(args.repeats):
                for name, path in sides.items():
                    seconds[name].append(timed_run(name, path, Path(tmp), args.overrides))
        except RuntimeError as error:
            sys.stderr.write(f"{error}\n")
            return 1
    lines = [*machine_lines, "", "| side | median s | runs s |", "|---|---|---|"]
    lines += [f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |"
              for name, values in seconds.items()]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
