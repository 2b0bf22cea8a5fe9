"""python -m tamrun.bench.stream: a table of more rows than memory, streamed in chunks of groups.

    python -m tamrun.bench.stream --groups 200,600 --rows 50000 [--limit 2GiB] [--cgroup 2.5GiB]

For each size a Parquet table of G sites x R hourly rows is written (seeded, `write_hourly`, written a
block of sites at a time so that the generator never holds the table): x uniform in [0, 10], hour of day,
y = 20 + 0.01 site + sin(x) + 0.5 sin(2 pi hour / 24) + N(0, 0.1^2); the first 80 % of the hours train,
the rest test. Then one recorded run in a fresh process (`STREAM_ARGS`: a spline on x and an hourly
categorical effect per site; predictions recorded, no plots or model), under ``memory.limit`` with
memory.data_in_limit=true and, with ``--cgroup``, in a cgroup v1 memory cgroup of that size
(/sys/fs/cgroup/memory, root). Prints the machine (`tamrun.bench.machine`) and a markdown table: rows,
chunks x groups, wall seconds (the command, start to exit), the run's largest resident set (`getrusage`)
and its peak_memory_mib, the cgroup's max usage (page cache included), rows/s and the test RMSE.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from tamrun.bench.commands import latest_metrics
from tamrun.bench.machine import header_lines, machine_info
from tamrun.config.units import parse_size

SEED = 0
START = "2020-01-01"
TRAIN_FRACTION = 0.8
SITES_PER_BLOCK = 50  # sites generated and written at once
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def site_block(first: int, sites: int, rows: int, seed: int = SEED) -> pd.DataFrame:
    """Sites ``first .. first + sites - 1`` of the module docstring's table (``rows`` hourly rows each)."""
    rng = np.random.default_rng([seed, first])
    dates = pd.date_range(START, periods=rows, freq="h")
    hour = np.tile(dates.hour.to_numpy(), sites)
    x = rng.uniform(0, 10, sites * rows)
    site = np.repeat(np.arange(first, first + sites), rows)
    y = 20 + 0.01 * site + np.sin(x) + 0.5 * np.sin(2 * np.pi * hour / 24) + rng.normal(0, 0.1, sites * rows)
    return pd.DataFrame({"date": np.tile(dates.to_numpy(), sites), "site": site, "x": x, "hour": hour, "y": y})


def write_hourly(path: Path, groups: int, rows: int, seed: int = SEED) -> Path:
    """The table of ``groups`` sites x ``rows`` hours as one Parquet file, `SITES_PER_BLOCK` sites a row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    try:
        for first in range(0, groups, SITES_PER_BLOCK):
            block = pa.Table.from_pandas(site_block(first, min(SITES_PER_BLOCK, groups - first), rows, seed),
                                         preserve_index=False)
            writer = writer or pq.ParquetWriter(str(path), block.schema)
            writer.write_table(block)
    finally:
        if writer is not None:
            writer.close()
    return path


def split_args(rows: int) -> List[str]:
    """The split of a table of ``rows`` hours: the first `TRAIN_FRACTION` train, the rest test."""
    dates = pd.date_range(START, periods=rows, freq="h")
    last = dates[int(TRAIN_FRACTION * rows) - 1].normalize()
    return [f"split.train_end={last.date()}", f"split.test_start={(last + pd.Timedelta(days=1)).date()}",
            "split.test_end=null"]


STREAM_ARGS = ["data=csv", "data.target=y", "data.group=site", "model=custom",
               "+model.effects.sx={kind: spline, column: x, k: 10, ap: -6}",
               "+model.effects.hod={kind: categorical, column: hour, topo: cyclic, ap: -3}",
               "tracking.log_plots=false", "tracking.log_model=false", "progress=off"]


def command(path: Path, rows: int, store: str, limit: Optional[str]) -> List[str]:
    """The run's command line."""
    extra = [f"memory.limit={limit}", "memory.data_in_limit=true"] if limit else []
    return [sys.executable, "-m", "tamrun", f"data.path={path}", *STREAM_ARGS, *split_args(rows),
            f"tracking.uri={store}", *extra]


def run_in_cgroup(args: List[str], cwd: Path, cgroup: Optional[int]) -> Dict[str, float]:
    """Run ``args`` (in a fresh memory cgroup of ``cgroup`` bytes when given); wall seconds, exit code, the
    cgroup's max usage (page cache included: the file read and the predictions written) and the largest
    resident set of the children so far (`getrusage`: the runs go from small to large)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    group = CGROUP_V1 / f"tamrun-bench-stream-{os.getpid()}" if cgroup else None
    if group is not None:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(cgroup))
    try:
        start = time.perf_counter()
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                              preexec_fn=None if group is None else lambda: (group / "cgroup.procs").write_text(
                                  str(os.getpid())))
        wall = time.perf_counter() - start
        charged = int((group / "memory.max_usage_in_bytes").read_text()) if group is not None else 0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    finally:
        if group is not None:
            group.rmdir()
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
    return {"code": done.returncode, "wall": wall, "charged": charged, "rss": rss}


def measure(groups: int, rows: int, limit: Optional[str], cgroup: Optional[int], folder: Path) -> Dict[str, float]:
    """One size: the table written, one run, its figures."""
    path = write_hourly(folder / f"hourly-{groups}x{rows}.parquet", groups, rows)
    store = f"sqlite:///{folder / f'mlflow-{groups}.db'}"
    figures = run_in_cgroup(command(path, rows, store, limit), folder, cgroup)
    logged = latest_metrics(store) if figures["code"] == 0 else {}
    path.unlink()
    return {**figures, "rows": groups * rows, "chunks": logged.get("stream_chunks", 1.0),
            "chunk_groups": logged.get("stream_chunk_groups", groups), "rmse_test": logged.get("rmse_test", float("nan")),
            "peak_mib": logged.get("peak_memory_mib", float("nan"))}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="200,600", help="comma-separated numbers of sites")
    parser.add_argument("--rows", type=int, default=50000, help="hourly rows per site")
    parser.add_argument("--limit", default="2GiB", help="memory.limit (with memory.data_in_limit=true); '' for none")
    parser.add_argument("--cgroup", default="", help="a memory cgroup's size, e.g. 2.5GiB ('' for none)")
    args = parser.parse_args(argv)
    cgroup = int(parse_size(args.cgroup)) if args.cgroup else None
    print("\n".join(header_lines(machine_info())))
    print("\n| rows | chunks x groups | wall s | max RSS MiB | run's peak_memory_mib | cgroup max usage MiB (page cache "
          "included) | rows/s | rmse_test |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="tamrun-bench-stream-") as tmp:
        for groups in (int(g) for g in args.groups.split(",")):
            m = measure(groups, args.rows, args.limit or None, cgroup, Path(tmp))
            status = "" if m["code"] == 0 else f" (exit {m['code']})"
            print(f"| {m['rows']:,} | {m['chunks']:.0f} x {m['chunk_groups']:.0f} | {m['wall']:.1f}{status} | "
                  f"{m['rss'] / 2**20:.0f} | {m['peak_mib']:.0f} | {m['charged'] / 2**20:.0f} | {m['rows'] / m['wall']:,.0f} | "
                  f"{m['rmse_test']:.4g} |", flush=True)


if __name__ == "__main__":
    main()
