"""python -m tamrun.bench.memory: the oracle's predicted working peak against the measured one, for
every preset, uncapped and under memory.limit = 1/10 of the uncapped measured working peak.

    python -m tamrun.bench.memory --models fourier,spline [--device cpu] [--solvers auto,cg,direct]

Prints a markdown table (the one in docs/memory.md). Runs in-process with tracking=none.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import torch

from tamrun.errors import TamrunError


def run_quiet(overrides: List[str]):
    """One in-process run of the composed config with ``overrides`` and tracking=none (its RunResult)."""
    from hydra import compose, initialize_config_dir

    from tamrun.config.load import config_dir
    from tamrun.config.store import register_configs
    from tamrun.runner import run

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return run(compose(config_name="config", overrides=["tracking=none", *overrides]))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="fourier,spline")
    parser.add_argument("--solvers", default="auto")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    mib = 2**20
    rows = ["| model | solver | route | limit MiB | predicted MiB | measured MiB | measured / predicted | "
            "measured / limit | chunks (groups × rows) | max rel. coef. diff vs uncapped | solve s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in args.models.split(","):
        for solver in args.solvers.split(","):
            base = [f"model={model}", f"solver={solver}", f"hw={args.device}"]
            free = run_quiet(base)
            limit = int(free.metrics["working_peak_bytes"] / 10)
            try:
                capped = run_quiet(base + [f"memory.limit={limit}"])
            except TamrunError as error:  # a route whose smallest system does not fit is a recorded outcome
                capped = None
                rows.append(f"| {model} | {solver} | {free.route} | {limit / mib:.2f} | does not fit: {error} |"
                            + " |" * 6)
            for result, cap in ((free, None), (capped, limit)):
                if result is None:
                    continue
                m = result.metrics
                diff = torch.linalg.vector_norm(result.coef - free.coef, dim=1) / torch.linalg.vector_norm(free.coef, dim=1)
                rows.append(
                    f"| {model} | {solver} | {result.route} | {'–' if cap is None else f'{cap / mib:.2f}'} | "
                    f"{m['predicted_peak_bytes'] / mib:.2f} | {m['working_peak_bytes'] / mib:.2f} | "
                    f"{m['working_peak_bytes'] / m['predicted_peak_bytes']:.2f} | "
                    f"{'–' if cap is None else format(m['working_peak_bytes'] / cap, '.2f')} | "
                    f"{int(m['chunk_groups'])} × {int(m['chunk_rows'])} | {float(diff.max()):.1e} | {m['solve_seconds']:.2f} |")
    sys.stdout.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
