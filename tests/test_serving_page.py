"""docs/serving.md as written: every ```sh block, in page order, each in a fresh ``bash -euo pipefail`` from
one empty folder, with this interpreter's environment first on PATH and PORT a free port (the page's
only variable). Checked after: the sweep chose on the validation year, the best job was refitted through it
and that refit registered as national-load@champion, the served forecast for 2024-01-01 is the champion's
own predictions, and the last block stopped the server (nothing of it left, its port free). Whatever a
failing block leaves is stopped by the test (the server's process group)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import psutil
from mlflow.tracking import MlflowClient

from conftest import sh_blocks
from local_cluster import wait_until
from servers import free_port

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "serving.md"
BLOCK_TIMEOUT_S = 900  # the sweep fits two models on 2 busy cores
STOP_TIMEOUT_S = 60  # the server's processes ending after the last block's signal


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def alive_in_group(pgid: int) -> list:
    """The processes of process group ``pgid`` that still run (zombies, already ended, left out)."""
    alive = []
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
    return alive


def test_the_serving_page_runs_as_written(tmp_path, monkeypatch):
    blocks = sh_blocks(PAGE)
    assert len(blocks) == 5, "the page's five steps"
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HYDRA_", "TAMRUN_"))},
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "PORT": str(port),
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    outputs = []
    try:
        for number, block in enumerate(blocks, 1):
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, text=True,
                                  capture_output=True, timeout=BLOCK_TIMEOUT_S)
            server_log = (tmp_path / "serve.log").read_text()[-3000:] if (tmp_path / "serve.log").exists() else ""
            assert done.returncode == 0, f"block {number}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{server_log}"
            outputs.append(done.stdout + done.stderr)
    finally:
        pid_file = tmp_path / "serve.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    sweep, ranked, served = outputs[0], outputs[1], outputs[3]
    assert "best on rmse_validation: job " in sweep  # the sweep's last line names its choice
    assert "ranked on rmse_validation" in ranked and "registered: national-load version 1, alias " \
        "national-load@champion" in ranked
    assert "48 half-hours forecast" in served
    store = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    champion = client.get_model_version_by_alias("national-load", "champion")
    parent = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id],
                                filter_string="tags.sweep_role = 'parent'")[0]
    refit = client.get_run(champion.run_id)  # the registered model is the sweep's choice, refitted (--refit)
    assert refit.data.tags["refit_of"] == parent.data.tags["best_run"] != champion.run_id
    assert refit.data.params["refit_through"].startswith("2023-12-31")  # trained through the validation year
    forecast = pd.DataFrame(json.loads((tmp_path / "forecast.json").read_text())["predictions"])
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert forecast["date"].tolist() == rows["date"].tolist() and len(rows) == 48
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # what models:/ URIs resolve against
    model = mlflow.pyfunc.load_model("models:/national-load@champion")
    np.testing.assert_allclose(forecast["predicted"].to_numpy(), model.predict(rows)["predicted"].to_numpy(),
                               rtol=1e-8, atol=0)  # another process's BLAS may sum in another order
    pgid = int((tmp_path / "serve.pid").read_text())
    wait_until(lambda: not port_open(port) and not alive_in_group(pgid),
               "the last block stopping the server (its port free, nothing of its process group left)", STOP_TIMEOUT_S)
