"""python -m tamrun.bench.groups: many small groups, whole recorded runs, against the number of groups.

    python -m tamrun.bench.groups --groups 2000,20000,200000 --rows 4
    python -m tamrun.bench.groups --groups 1000000 --rows 20 --format parquet

For each size, a table of G groups ("sites") of R daily rows is written (seeded): R/2 training rows in
January 2024 (the first two at x = 0 and x = 10, so that the training range spans the test rows'), R/2 test
rows in February with x uniform in [0, 10], y = 20 + sin(x) + N(0, 0.1^2); then one recorded run in a
fresh process (default settings: plots and the LoggedModel logged):

    python -m tamrun data=csv data.path=<table> data.target=y data.group=site model=custom \\
        '+model.effects.x={kind: spline, column: x, k: 10, ap: 0}' split.train_end=2024-01-31 \\
        split.test_start=2024-02-01 split.test_end=null tracking.uri=sqlite:///<store> progress=off

Prints the machine (`tamrun.bench.machine`) and a markdown table per size: the plan's fit chunk (groups),
data, fit (the command's ``fit=``: features and solve), predict, recording (the record phase) seconds as
the run recorded them, the command's wall time (start to exit) and the process's peak RSS
(``peak_memory_mib``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from tamrun.bench.commands import latest_metrics, tamrun_seconds
from tamrun.bench.machine import header_lines, machine_info

SPLINE = "+model.effects.x={kind: spline, column: x, k: 10, ap: 0}"
SEED = 0


def small_groups_table(groups: int, rows: int, seed: int = SEED) -> pd.DataFrame:
    """The module docstring's table: ``groups`` sites of ``rows`` daily rows (half training, half test)."""
    rng = np.random.default_rng(seed)
    train = rows // 2
    dates = pd.date_range("2024-01-01", periods=train, freq="D").append(
        pd.date_range("2024-02-01", periods=rows - train, freq="D"))
    x = rng.uniform(0, 10, (groups, rows))
    x[:, 0], x[:, 1] = 0.0, 10.0
    return pd.DataFrame({"date": np.tile(dates.to_numpy(), groups), "site": np.repeat(np.arange(groups), rows),
                         "x": x.reshape(-1), "y": 20 + np.sin(x.reshape(-1)) + rng.normal(0, 0.1, groups * rows)})


def write_table(frame: pd.DataFrame, folder: Path, form: str) -> Path:
    """``frame`` as ``folder``/sites.csv (dates as ISO days) or sites.parquet."""
    import pyarrow as pa
    import pyarrow.csv as arrow_csv

    if form == "parquet":
        path = folder / "sites.parquet"
        frame.to_parquet(path, index=False)
        return path
    path = folder / "sites.csv"
    text = frame.assign(date=frame["date"].dt.strftime("%Y-%m-%d"))
    arrow_csv.write_csv(pa.Table.from_pandas(text, preserve_index=False), str(path))
    return path


def measure(groups: int, rows: int, form: str, workdir: Path, overrides: List[str]) -> Dict[str, float]:
    """One size: write its table, run it once, return the run's figures and the wall time."""
    began = time.perf_counter()
    path = write_table(small_groups_table(groups, rows), workdir, form)
    written = time.perf_counter() - began
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    wall = tamrun_seconds(f"{groups} groups", ["data=csv", f"data.path={path}", "data.target=y", "data.group=site",
                                                "model=custom", SPLINE, "split.train_end=2024-01-31",
                                                "split.test_start=2024-02-01", "split.test_end=null",
                                                f"tracking.uri={uri}", "progress=off",
                                                f"hydra.run.dir={workdir / 'run'}", *overrides], workdir)
    return {**latest_metrics(uri), "wall": wall, "written": written}


def row(groups: int, rows: int, m: Dict[str, float]) -> str:
    return (f"| {groups:,} | {rows} | {int(m['chunk_groups']):,} | {m['data_seconds']:.1f} | {m['fit_seconds']:.2f} | "
            f"{m['predict_seconds']:.2f} | {m['record_seconds']:.1f} | {m['wall']:.1f} | {m['peak_memory_mib']:,.0f} | "
            f"{m['rmse_test']:.4f} |")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.groups", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="2000,20000,200000")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args(argv)
    lines = header_lines(machine_info()) + ["", "| groups | rows | fit chunk (groups) | data s | fit s | predict s | "
                                                "recording s | wall s | peak RSS MiB | rmse_test |",
                                            "|---|---|---|---|---|---|---|---|---|---|"]
    for groups in (int(g) for g in args.groups.split(",")):
        with tempfile.TemporaryDirectory(prefix="tamrun-groups-") as folder:
            lines.append(row(groups, args.rows, measure(groups, args.rows, args.format, Path(folder), args.overrides)))
        print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
