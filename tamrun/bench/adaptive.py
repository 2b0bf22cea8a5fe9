"""python -m tamrun.bench.adaptive: sliding-window refits, batched vs one window at a time (tamrun only:
the peer has no adaptive mode).

    python -m tamrun.bench.adaptive --models fourier --windows 730,365 [--step 1] [--device cpu] [--test-end 2024-12-31]

For each model and window length, daily (``--step``) refits over the test year of the national data,
in-process with tracking=none:
    batched     as many windows x groups per batch as the window budget allows, Grams up/down-dated
    one window  adaptive.max_batch_windows=1 (Grams up/down-dated)
    loop        one window at a time, every Gram from its window's rows (adaptive.refresh=1): a loop
                of independent static fits
    capped      batched under memory.limit = 1/10 of the batched run's measured working peak
Prints a markdown table: windows per batch, seconds per refit, the adaptive phase's wall time,
predicted and measured working peak, test RMSE adaptive and static, and the largest relative
coefficient difference against the batched run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

import torch

from tamrun.bench.memory import run_quiet

log = logging.getLogger(__name__)

VARIANTS = (("batched", []), ("one window", ["adaptive.max_batch_windows=1"]),
            ("loop of static fits", ["adaptive.max_batch_windows=1", "adaptive.refresh=1"]))


HEADER = ["| model | window days | run | route | windows × groups per batch | refits | s per refit | adaptive s | "
          "predicted batch MiB | measured peak MiB | RMSE adaptive | RMSE static | max rel. coef. diff vs batched |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def table_row(model: str, window: int, name: str, result, batched) -> str:
    """One markdown row of a run, its coefficients compared with the batched run's."""
    m, mib = result.metrics, 2**20
    diff = torch.linalg.vector_norm(result.coef - batched.coef, dim=-1) / torch.linalg.vector_norm(batched.coef, dim=-1)
    return (f"| {model} | {window} | {name} | {result.route} | {int(m['windows_per_batch'])} × "
            f"{int(m['groups_per_batch'])} | {int(m['n_refits'])} | {m['seconds_per_refit']:.4f} | "
            f"{m['adaptive_fit_seconds']:.2f} | {m['predicted_batch_bytes'] / mib:.2f} | "
            f"{m['working_peak_bytes'] / mib:.2f} | {m['rmse_test']:.1f} | {m['rmse_test_static']:.1f} | "
            f"{float(diff.max()):.1e} |")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.adaptive", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("--models", "fourier"), ("--windows", "730"), ("--device", "cpu")):
        parser.add_argument(flag, default=default)
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--test-end", default=None, help="last test day (default: the config's, 2024-12-31)")
    args = parser.parse_args(argv)
    lines = list(HEADER)
    for model in args.models.split(","):
        for window in (int(w) for w in args.windows.split(",")):
            base = [f"model={model}", "mode=adaptive", f"adaptive.window={window}", f"adaptive.step={args.step}",
                    f"hw={args.device}"] + ([f"split.test_end={args.test_end}"] if args.test_end else [])
            runs = [(name, run_quiet(base + extra)) for name, extra in VARIANTS]
            limit = int(runs[0][1].metrics["working_peak_bytes"] / 10)
            runs.append((f"capped at {limit / 2**20:.2f} MiB", run_quiet(base + [f"memory.limit={limit}"])))
            lines += [table_row(model, window, name, result, runs[0][1]) for name, result in runs]
            log.info("%s, %d-day windows done", model, window)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
