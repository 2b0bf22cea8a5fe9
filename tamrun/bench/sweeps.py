"""python -m tamrun.bench.sweeps: a sweep's jobs two at once against the same jobs one after the other.

    python -m tamrun.bench.sweeps -r 5                      # 4 forest jobs (issue 18's case)
    python -m tamrun.bench.sweeps -r 3 model=fourier model.effects.toy.ap=-3,-4,-5,-6

Each round runs ``python -m tamrun -m hydra/launcher=parallel <sweep>`` and ``python -m tamrun -m <sweep>``
(Hydra's basic launcher: one process, the jobs one after the other, each on every core), interleaved, into
one sqlite store that an untimed run created first (the usual case). Prints the machine
(`tamrun.bench.machine`) and a markdown table of each round's wall times (process start to exit) and
their ratio, and the medians; exit code 1 when a run fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from tamrun.bench.commands import tamrun_seconds
from tamrun.bench.machine import header_lines, machine_info

FOREST_SWEEP = ["model=forest", "model.effects.trend.ap=-5,-5.5,-6,-6.5"]
# side -> the launcher's overrides
SIDES: Dict[str, List[str]] = {"parallel": ["hydra/launcher=parallel"], "one after another": []}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.sweeps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help=f"the sweep (default: {' '.join(FOREST_SWEEP)})")
    args = parser.parse_args(argv)
    sweep = args.overrides or FOREST_SWEEP
    seconds: Dict[str, List[float]] = {side: [] for side in SIDES}
    machine_lines = header_lines(machine_info())  # before the runs: the load average they started in
    with tempfile.TemporaryDirectory(prefix="tamrun-sweeps-") as tmp:
        workdir = Path(tmp)
        store = [f"tracking.uri=sqlite:///{workdir / 'mlflow.db'}", "progress=off"]
        try:
            tamrun_seconds("store", [*store, f"hydra.run.dir={workdir / 'first'}"], workdir)  # not timed
            for repeat in range(args.repeats):
                for side, launcher in SIDES.items():
                    sweep_dir = f"hydra.sweep.dir={workdir / side.replace(' ', '-')}-{repeat}"
                    seconds[side].append(tamrun_seconds(side, ["-m", *launcher, *store, sweep_dir, *sweep], workdir))
        except RuntimeError as error:
            sys.stderr.write(f"{error}\n")
            return 1
    parallel, serial = seconds["parallel"], seconds["one after another"]
    ratios = [p / s for p, s in zip(parallel, serial)]
    lines = [*machine_lines, f"- sweep: {' '.join(sweep)}", "", "| round | parallel s | one after another s | ratio |",
             "|---|---|---|---|"]
    lines += [f"| {i + 1} | {p:.1f} | {s:.1f} | {r:.2f} |" for i, (p, s, r) in enumerate(zip(parallel, serial, ratios))]
    lines.append(f"| median | {statistics.median(parallel):.1f} | {statistics.median(serial):.1f} | "
                 f"{statistics.median(ratios):.2f} |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
