"""python -m tamrun.bench.scale: forest x Fourier crossings with growing forests, under a memory limit.

    python -m tamrun.bench.scale --trees 50,100,200,400 --depth 8 --limit 8GiB [--solver direct]

Each run is the forest_fourier preset with T trees of the given depth (T * 2^depth leaves, each
crossed with the Fourier basis in toy: D = 12 T 2^depth + 11 columns), fitted on the national data
in-process (tracking=none). Prints a markdown table: T, leaves, D, route, fit seconds (features +
solve), predicted and measured working peak, test RMSE.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from tamrun.bench.memory import run_quiet


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default="50,100,200,400")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--limit", default="8GiB")
    parser.add_argument("--solver", default="direct")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    mib = 2**20
    rows = [f"memory.limit={args.limit}, solver={args.solver}, depth {args.depth}", "",
            "| trees T | leaves | D | route | fit s | predicted peak MiB | measured peak MiB | test RMSE MW |",
            "|---|---|---|---|---|---|---|---|"]
    for trees in (int(t) for t in args.trees.split(",")):
        result = run_quiet(["model=forest_fourier", f"model.effects.forest_toy.left.n_trees={trees}",
                       f"model.effects.forest_toy.left.max_depth={args.depth}", f"solver={args.solver}",
                       f"memory.limit={args.limit}", f"hw={args.device}"])
        m = result.metrics
        route = result.route + (" (dual)" if result.plan.dual else "")
        rows.append(f"| {trees} | {trees * 2 ** args.depth:,} | {result.width:,} | {route} | {m['fit_seconds']:.1f} | "
                    f"{m['predicted_peak_bytes'] / mib:.0f} | {m['working_peak_bytes'] / mib:.0f} | {m['rmse_test']:.1f} |")
        sys.stdout.write(rows[-1] + "\n")
        sys.stdout.flush()
    sys.stdout.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
