"""python -m tamrun.bench.data_read: reading a sizeable table as CSV and as Parquet, as a run reads it.

    python -m tamrun.bench.data_read --rows 10000000

Writes (seeded) a table of ``--rows`` hourly rows over 400 sites (date, site, x, y and 6 columns no model
reads), as a CSV and as one Parquet file (pyarrow's defaults, snappy), then reads each in a fresh process
with `tamrun.data.table.read_table` as a run of a spline on x per site reads it: the date, site, x and y
columns only, and the split's window (training the last year but one, testing the first month of the last
year: about 40 % of the rows for 3 years). Prints the machine and a markdown table: the file's size, the
read's wall seconds, the process's peak RSS above its baseline after the imports, the rows and columns
read, and whether the dates were pushed down.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from tamrun.bench.machine import header_lines, machine_info

SITES = 400
UNUSED = 6
RESULT = "READ_RESULT "


def write_tables(rows: int, folder: Path) -> Dict[str, Path]:
    """The table (module docstring) as ``folder``/table.csv and table.parquet."""
    import pyarrow as pa
    import pyarrow.csv as arrow_csv

    rng = np.random.default_rng(0)
    hours = -(-rows // SITES)
    dates = pd.date_range("2021-01-01", periods=hours, freq="h")
    frame = pd.DataFrame({"date": np.repeat(dates.to_numpy(), SITES)[:rows],
                          "site": np.tile(np.arange(SITES), hours)[:rows], "x": rng.uniform(0, 10, rows)})
    frame["y"] = 20 + np.sin(frame["x"]) + rng.normal(0, 0.1, rows)
    for i in range(UNUSED):
        frame[f"unused_{i}"] = rng.normal(size=rows)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    paths = {"csv": folder / "table.csv", "parquet": folder / "table.parquet"}
    arrow_csv.write_csv(table, str(paths["csv"]))
    frame.to_parquet(paths["parquet"], index=False)
    return paths


def split_of(rows: int) -> Dict[str, str]:
    """Training the last year but one of the dates, testing the first month of the last (or their share
    of a shorter table)."""
    hours = -(-rows // SITES)
    end = pd.Timestamp("2021-01-01") + pd.Timedelta(hours=hours - 1)
    test_start = (end - pd.Timedelta(days=365)).normalize()
    return {"train_start": str((test_start - pd.Timedelta(days=365)).date()),
            "train_end": str((test_start - pd.Timedelta(days=1)).date()), "test_start": str(test_start.date()),
            "test_end": str((test_start + pd.Timedelta(days=30)).date())}


def read_once(path: str, split: Dict[str, str]) -> dict:
    """In this (fresh) process: read ``path`` as a run would; seconds, peak RSS above the baseline, what was read."""
    from tamrun.bench.child import PeakMeter
    from tamrun.config.schema import DataConfig, DataSource, SplitConfig
    from tamrun.data.table import read_table
    from tamrun.data.parquet import DateWindow

    meter = PeakMeter("cpu")  # VmHWM reset here: a child's ru_maxrss may be its parent's, inherited over exec
    meter.start()
    cfg = DataConfig(name="csv", source=DataSource.file, path=path, target="y", group="site")
    began = time.perf_counter()
    loaded = read_table(cfg, {"data.target": "y", "data.group": "site", "model.effects.x.column": "x"},
                        window=DateWindow.of(SplitConfig(**split)))
    seconds = time.perf_counter() - began
    read = loaded.parquet
    return {"seconds": seconds, "peak_above_baseline": meter.peak_above_baseline(), "rows": len(loaded.frame),
            "columns": loaded.frame.shape[1], "pushed_down": bool(read and read.pushed_down)}


def measure(path: Path, split: Dict[str, str]) -> dict:
    """`read_once` in a fresh process."""
    done = subprocess.run([sys.executable, "-m", "tamrun.bench.data_read", "--read", str(path), "--split",
                           json.dumps(split)], capture_output=True, text=True, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith(RESULT))
    return json.loads(line[len(RESULT):])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tamrun.bench.data_read", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--read", help=argparse.SUPPRESS)
    parser.add_argument("--split", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.read:
        print(RESULT + json.dumps(read_once(args.read, json.loads(args.split))))
        return 0
    split = split_of(args.rows)
    lines = header_lines(machine_info()) + [f"- {args.rows:,} rows x {4 + UNUSED} columns, split {split}", "",
                                            "| format | file MiB | read s | peak above baseline MiB | rows read | "
                                            "columns | dates pushed down |", "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="tamrun-read-") as folder:
        for form, path in write_tables(args.rows, Path(folder)).items():
            m = measure(path, split)
            lines.append(f"| {form} | {path.stat().st_size / 2**20:,.0f} | {m['seconds']:.1f} | "
                         f"{m['peak_above_baseline'] / 2**20:,.0f} | {m['rows']:,} | {m['columns']} | "
                         f"{'yes' if m['pushed_down'] else 'no'} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
