"""python -m tamrun.bench.meter: what measuring memory costs the fit a user's command reports.

    python -m tamrun.bench.meter -r 5                         # fourier, spline, forest, forest_fourier
    python -m tamrun.bench.meter --models forest -r 9 hw.threads=1

Each repeat runs ``python -m tamrun model=<preset> tracking=none progress=off [overrides]`` with the
default settings (the tensor meter on) and with ``memory.meter=false``, each in a fresh process, the two
alternately (which of them goes first alternates too, so that drift hits both alike). The fit is the
``fit=`` figure the command prints (the features and solve phases). Prints the machine
(`tamrun.bench.machine`) and a markdown table: per preset the median fit of each variant, the median and
range of the paired ratios (meter on / off) and the median of the whole command's wall time; exit code 1
when a run fails.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from tamrun.bench.commands import report_presets, run_tamrun

PRESETS = "fourier,spline,forest,forest_fourier"
VARIANTS: Dict[str, List[str]] = {"meter on (default)": [], "memory.meter=false": ["memory.meter=false"]}
FIT_LINE = re.compile(r"\bfit=([0-9.eE+-]+)s\b")


def reported_fit(output: str) -> float:
    """The ``fit=<seconds>s`` figure of a run's log (ValueError when there is none)."""
    found = FIT_LINE.findall(output)
    if not found:
        raise ValueError("the run printed no fit= figure")
    return float(found[-1])


def measure(model: str, repeats: int, overrides: List[str], workdir: Path) -> Dict[str, List[tuple]]:
    """(fit s, wall s) of each variant's runs of ``model``, interleaved."""
    runs: Dict[str, List[tuple]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            arguments = [f"model={model}", "tracking=none", "progress=off", f"hydra.run.dir={workdir / 'run'}",
                         *VARIANTS[name], *overrides]
            seconds, output = run_tamrun(f"{model} ({name})", arguments, workdir)
            runs[name].append((reported_fit(output), seconds))
    return runs


def table(results: Dict[str, Dict[str, List[tuple]]]) -> List[str]:
    """The markdown table of every preset's runs."""
    on, off = VARIANTS
    lines = [f"| preset | fit s, {on} (median) | fit s, {off} (median) | ratio on / off: median (min–max) | "
             "runs | command wall s (on / off) |", "|---|---|---|---|---|---|"]
    for model, runs in results.items():
        ratios = [a[0] / b[0] for a, b in zip(runs[on], runs[off])]
        fit = {name: statistics.median(r[0] for r in runs[name]) for name in VARIANTS}
        wall = {name: statistics.median(r[1] for r in runs[name]) for name in VARIANTS}
        lines.append(f"| {model} | {fit[on]:.3f} | {fit[off]:.3f} | {statistics.median(ratios):.3f} "
                     f"({min(ratios):.3f}–{max(ratios):.3f}) | {len(ratios)} | {wall[on]:.2f} / {wall[off]:.2f} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.meter", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=PRESETS, help="comma-separated presets")
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="tamrun overrides for every run")
    args = parser.parse_args(argv)
    return report_presets("python -m tamrun.bench.meter", argv, args.models,
                          lambda model, workdir: measure(model, args.repeats, args.overrides, workdir), table)


if __name__ == "__main__":
    raise SystemExit(main())
