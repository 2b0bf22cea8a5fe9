"""python -m tamrun.bench.meter: what measuring memory costs the fit a user's command reports.

    python -m tamrun.bench.meter -r 5                         # fourier, spline, forest, forest_fourier
    python -m tamrun.bench.meter --models forest -r 9 hw.threads=1

    python -m tamrun.bench.meter --child -r 5                 # and the benchmark's tamrun side beside them

Each repeat runs ``python -m tamrun model=<preset> tracking=none progress=off [overrides]`` with the
default settings (the tensor meter on) and with ``memory.meter=false``, each in a fresh process, the two
alternately (which of them goes first alternates too, so that drift hits both alike). The fit is the
``fit=`` figure the command prints (the features and solve phases). ``--child`` adds a third variant in
the rotation: the benchmark's tamrun side (`tamrun.bench.child`, what the fit column of ``python -m
tamrun.bench`` measures), to check that it reports the command's fit. Prints the machine
(`tamrun.bench.machine`) and a markdown table: per preset the median fit of each variant, the median and
range of the paired ratios (meter on / off; child / command) and the median of the whole command's wall
time; exit code 1 when a run fails.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tamrun.bench.commands import report_presets, run_child, run_tamrun

PRESETS = "fourier,spline,forest,forest_fourier"
VARIANTS: Dict[str, List[str]] = {"meter on (default)": [], "memory.meter=false": ["memory.meter=false"]}
CHILD = "bench child"  # the benchmark's tamrun side (--child)
CHILD_TIMEOUT_S = 3600.0
FIT_LINE = re.compile(r"\bfit=([0-9.eE+-]+)s\b")


def reported_fit(output: str) -> float:
    """The ``fit=<seconds>s`` figure of a run's log (ValueError when there is none)."""
    found = FIT_LINE.findall(output)
    if not found:
        raise ValueError("the run printed no fit= figure")
    return float(found[-1])


def run_variant(name: str, model: str, overrides: List[str], workdir: Path) -> Tuple[float, float]:
    """(fit s, wall s) of one run of variant ``name`` (RuntimeError when it fails)."""
    if name == CHILD:
        command = [sys.executable, "-m", "tamrun.bench.child", "--side", "tamrun", "--model", model,
                   *[f"--override={item}" for item in overrides]]
        record = run_child(command, CHILD_TIMEOUT_S)
        if record.get("status") != "ok":
            raise RuntimeError(f"{model} ({name}): {record}")
        return record["fit_seconds"], record["wall_seconds"]
    arguments = [f"model={model}", "tracking=none", "progress=off", f"hydra.run.dir={workdir / 'run'}",
                 *VARIANTS[name], *overrides]
    seconds, output = run_tamrun(f"{model} ({name})", arguments, workdir)
    return reported_fit(output), seconds


def measure(model: str, repeats: int, overrides: List[str], workdir: Path, child: bool) -> Dict[str, List[tuple]]:
    """(fit s, wall s) of each variant's runs of ``model``, interleaved (the order rotates each repeat)."""
    names = [*VARIANTS, *([CHILD] if child else [])]
    runs: Dict[str, List[tuple]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(run_variant(name, model, overrides, workdir))
    return runs


def paired(runs: Dict[str, List[tuple]], top: str, bottom: str) -> str:
    """The median (min–max) of the repeats' ratios of fit ``top`` / ``bottom``."""
    ratios = [a[0] / b[0] for a, b in zip(runs[top], runs[bottom])]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"


def table(results: Dict[str, Dict[str, List[tuple]]]) -> List[str]:
    """The markdown table of every preset's runs."""
    on, off = VARIANTS
    child = any(CHILD in runs for runs in results.values())
    extra = (f" fit s, {CHILD} (median) | child / command: median (min–max) |", "---|---|") if child else ("", "")
    lines = [f"| preset | fit s, {on} (median) | fit s, {off} (median) | ratio on / off: median (min–max) |{extra[0]} "
             "runs | command wall s (on / off) |", f"|---|---|---|---|{extra[1]}---|---|"]
    for model, runs in results.items():
        fit = {name: statistics.median(r[0] for r in values) for name, values in runs.items()}
        wall = {name: statistics.median(r[1] for r in runs[name]) for name in VARIANTS}
        beside = f" {fit[CHILD]:.3f} | {paired(runs, CHILD, on)} |" if child else ""
        lines.append(f"| {model} | {fit[on]:.3f} | {fit[off]:.3f} | {paired(runs, on, off)} |{beside} {len(runs[on])} | "
                     f"{wall[on]:.2f} / {wall[off]:.2f} |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.meter", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=PRESETS, help="comma-separated presets")
    parser.add_argument("-r", "--repeats", type=int, default=5)
    parser.add_argument("--child", action="store_true", help="add the benchmark's tamrun side as a third variant")
    parser.add_argument("overrides", nargs="*", help="tamrun overrides for every run")
    args = parser.parse_args(argv)
    return report_presets("python -m tamrun.bench.meter", argv, args.models,
                          lambda model, workdir: measure(model, args.repeats, args.overrides, workdir, args.child),
                          table)


if __name__ == "__main__":
    raise SystemExit(main())
