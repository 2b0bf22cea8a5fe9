"""python -m tamrun.bench.tco: what chunking costs in time. Every preset fitted uncapped, then under a
ladder of memory.limit values (fractions of the limit its uncapped plan needs), with the group chunks,
whether CG keeps W Phi, and the chunked work's time (solve + predict phases) against the uncapped run's.

    python -m tamrun.bench.tco --models forest,forest_big,forest_fourier [--fractions 0.5,0.25,0.1] [-r 1]

Prints a markdown table (docs/benchmarks.md) and the per-step overhead each run implies,
(ratio - 1) / (steps - 1), the figure `tamrun.tco.time.CHUNK_STEP_OVERHEAD` holds. Runs in-process
with tracking=none (`tamrun.bench.memory.run_quiet`).

    python -m tamrun.bench.tco --classes --models forest_big,forest_fourier

prints instead each preset's plan per machine class (conf/tco/default.yaml) priced from an uncapped run,
then checks the predicted time of the CPU classes this machine can play (no more cores than it has; the
class it is measured on, and those that fit chunked) against a run with their threads (hw.threads) and their
memory (memory.limit = what the class leaves the run): the table of docs/memory.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from tamrun.bench.machine import header_lines, machine_info
from tamrun.bench.memory import run_quiet
from tamrun.errors import TamrunError
from tamrun.tco.plan import FITS_CHUNKED
from tamrun.tco.time import chunked_seconds, compute_seconds, group_steps

PRESETS = "fourier,fourier_holidays,fourier_lags,spline,spline_holidays,spline_lags,forest,forest_big,forest_fourier"
FRACTIONS = "0.5,0.25,0.1"


def best_of(overrides: List[str], repeats: int):
    """The run with the least chunked work of ``repeats`` in-process runs (least disturbed by the load)."""
    return min((run_quiet(overrides) for _ in range(repeats)), key=lambda r: chunked_seconds(r.metrics))


def ladder_rows(model: str, fractions: List[float], repeats: int, device: str) -> List[str]:
    """One markdown row per rung of ``model``'s ladder: uncapped, then memory.limit = fraction x the
    uncapped plan's limit (`Plan.plan_limit`)."""
    base = [f"model={model}", f"hw={device}"]
    free = best_of(base, repeats)
    reference = chunked_seconds(free.metrics)
    rows = [row(model, None, free, reference)]
    for fraction in fractions:
        limit = int(free.plan.plan_limit * fraction)
        try:
            rows.append(row(model, limit, best_of(base + [f"memory.limit={limit}"], repeats), reference))
        except TamrunError as error:
            rows.append(f"| {model} | {limit / 2**20:.1f} | does not fit: {error.problem} |" + " |" * 6)
    return rows


def row(model: str, limit: Optional[int], result, reference: float) -> str:
    """A rung: limit, route, chunks, CG's design kept, group steps, chunked seconds, ratio, per-step overhead."""
    plan, seconds = result.plan, chunked_seconds(result.metrics)
    steps = group_steps(len(result.groups), plan.fit.groups)
    ratio = seconds / reference
    per_step = f"{(ratio - 1) / (steps - 1):.3f}" if steps > 1 else "–"
    kept = ("kept" if plan.cache_design else "rebuilt") if plan.route == "cg" else "–"
    return (f"| {model} | {'–' if limit is None else f'{limit / 2**20:.1f}'} | {plan.route} | "
            f"{plan.fit.groups} × {plan.fit.rows} | {kept} | {steps} | {seconds:.2f} | {ratio:.2f} | {per_step} |")


def class_rows(model: str, repeats: int, device: str, cores: int) -> List[str]:
    """``model``'s plan per class priced from an uncapped run, then predicted against measured seconds
    (compute_seconds) for the CPU classes this machine can play."""
    base = [f"model={model}", f"hw={device}"]
    tco = best_of(base, repeats).tco
    rows = [f"{model}, measured on {tco.measured_on}:", "",
            "| class | memory | $/h | fit | predicted s | predicted cost $ |", "|---|---|---|---|---|---|"]
    for c in tco.classes:
        seconds = "–" if c.seconds is None else f"{c.seconds:.2f}"
        cost = "–" if c.cost_usd is None else f"{c.cost_usd:.2e}"
        rows.append(f"| {c.name} | {c.memory_bytes / 2**30:g} GiB | {c.price_per_hour:g} | {c.cell()} | {seconds} | {cost} |")
    ahead = f", ahead of {tco.next_cheapest} by ${tco.beats_next_usd:.2e} per run" if tco.next_cheapest else ""
    rows += ["", f"cheapest: {tco.cheapest}{ahead}", "",
             "| class | hw.threads | memory.limit MiB | predicted s | measured s | measured / predicted |",
             "|---|---|---|---|---|---|"]
    for c in tco.classes:
        playable = c.kind == "cpu" and c.fits and (c.cores or 0) <= cores
        if not playable or not (c.name == tco.measured_on or c.fit == FITS_CHUNKED):
            continue
        limit = [f"memory.limit={c.free_bytes}"] if c.fit == FITS_CHUNKED else []
        measured = compute_seconds(best_of(base + [f"hw.threads={c.cores}", *limit], repeats).metrics)
        shown = f"{c.free_bytes / 2**20:.0f}" if limit else "–"
        rows.append(f"| {c.name} | {c.cores} | {shown} | {c.seconds:.2f} | {measured:.2f} | {measured / c.seconds:.2f} |")
    return rows + [""]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.tco", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=PRESETS)
    parser.add_argument("--fractions", default=FRACTIONS)
    parser.add_argument("-r", "--repeats", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--classes", action="store_true", help="the plan per class and its check (docs/memory.md)")
    args = parser.parse_args(argv)
    command = f"python -m tamrun.bench.tco {' '.join(argv if argv is not None else sys.argv[1:])}"
    lines = [*header_lines(machine_info(args.device)), f"- command: `{command.strip()}`", ""]
    if not args.classes:
        lines += ["| model | memory.limit MiB | route | fit chunk (groups × rows) | CG's W Phi | group steps | "
                  "solve + predict s | × uncapped | overhead per extra step |", "|---|---|---|---|---|---|---|---|---|"]
    for model in args.models.split(","):
        if args.classes:
            lines += class_rows(model, args.repeats, args.device, os.cpu_count() or 1)
        else:
            lines += ladder_rows(model, [float(f) for f in args.fractions.split(",")], args.repeats, args.device)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
