"""8 ``python -m tamrun`` processes writing to one fresh sqlite store at once: 8 complete runs, none
lost, no "database is locked", the store passes PRAGMA integrity_check, and (same config and seed in
8 processes) bitwise-equal coefficients and metrics."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides
from test_determinism import comparable

PROCESSES = 8


@pytest.mark.slow
def test_eight_cli_runs_on_one_fresh_store(tmp_path, csv_path):
    db = tmp_path / "store" / "mlflow.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    # hw=cpu: bitwise-equal results across processes are the CPU's (a GPU's need hw.deterministic=true)
    argv = [sys.executable, "-m", "tamrun", f"tracking.uri=sqlite:///{db}", "tracking.log_plots=false", "hw=cpu",
            *csv_overrides(csv_path), "+model.effects.f={kind: forest, column: x, others: [dow], n_trees: 5, max_depth: 3}"]
    started = time.monotonic()
    procs = []
    for i in range(PROCESSES):
        cwd = tmp_path / f"job{i}"
        cwd.mkdir()
        procs.append(subprocess.Popen([*argv, f"tracking.run_name=job{i}"], cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    print(f"{PROCESSES} processes done in {time.monotonic() - started:.1f} s")
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output
        assert "database is locked" not in output and "Traceback" not in output, output

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id], max_results=100)
    assert sorted(r.info.run_name for r in runs) == [f"job{i}" for i in range(PROCESSES)]
    assert {r.info.status for r in runs} == {"FINISHED"}
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # one config, one seed, eight processes: bitwise-equal coefficients (CSV at full precision) and metrics
    coefficients = {Path(client.download_artifacts(r.info.run_id, "fit/coefficients.csv", str(tmp_path / r.info.run_name)))
                    .read_text() for r in runs}
    assert len(coefficients) == 1
    assert len({tuple(sorted(comparable(r.data.metrics).items())) for r in runs}) == 1
