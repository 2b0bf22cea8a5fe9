"""Requests and seconds per logged model against the locked MLflow server (issue 61; docs/benchmarks.md,
"Uploading a logged model"). Not a test: run by hand, for the tamrun at ``CODE`` (a checkout; an older commit
in a worktree measures the state before):

    PYTHONPATH=CODE python tests/upload_bench.py CODE FOLDER

It starts `servers.locked_server` (basic auth behind TLS, artifacts served by the server) in FOLDER, runs one
``python -m tamrun`` job by the EDIT user that logs its model (the synthetic CSV of tests/conftest.py), reads
the requests naming the model from the server's access log, then uploads the model's folder again
`REPEATS` times to new LoggedModels (``MlflowClient.log_model_artifacts``, the call a run makes) and times
each. Prints one JSON line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).parent))

from conftest import csv_overrides, synthetic_frame  # noqa: E402
from servers import TEAM_EXPERIMENT, USERS, client_env, credentials, locked_server  # noqa: E402
from test_team_cluster import HTTP, environment  # noqa: E402

REPEATS = 3
JOB = ["tracking.log_plots=false", "tracking.log_model=true", "progress=off", "hw.threads=1", "tracking=server",
       f"tracking.experiment={TEAM_EXPERIMENT}"]


def measure(code: str, top: Path) -> Dict[str, object]:
    """The figures of one job of the tamrun at ``code`` against a locked server started in ``top``."""
    top.mkdir(parents=True, exist_ok=True)
    frame = top / "synthetic.csv"
    synthetic_frame().to_csv(frame, index=False)
    figures: Dict[str, object] = {}
    with locked_server(top / "server") as server:
        access = credentials("writer", USERS["writer"], server.certificate)
        start = server.log.stat().st_size
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "tamrun", *csv_overrides(frame), *JOB], cwd=top, timeout=900,
                              env=environment(MLFLOW_TRACKING_URI=server.uri, **access, **HTTP, PYTHONPATH=code),
                              capture_output=True, text=True)
        figures["job_s"], figures["rc"] = round(time.monotonic() - began, 1), done.returncode
        lines = server.log.read_bytes()[start:].decode("utf-8", "replace").splitlines()
        model = next(re.search(r"/logged-models/(m-[0-9a-f]+)", line).group(1) for line in lines
                     if "/logged-models/m-" in line)
        figures["model_requests"] = sum(model in line or "POST /api/2.0/mlflow/logged-models " in line
                                        or "/runs/outputs " in line for line in lines)
        figures["model_uploads"] = sum("PUT " in line and f"/models/{model}/" in line for line in lines)
        figures["store_wait_notices"] = [line[line.find("waiting"):] for line in (done.stdout + done.stderr).splitlines()
                                         if "waiting on the store" in line]
        folder = top / "model"
        shutil.copytree(next(Path(server.artifacts).glob(f"*/models/{model}/artifacts")), folder)
        figures["model_files"] = sum(path.is_file() for path in folder.rglob("*"))
        figures["model_bytes"] = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        from mlflow.tracking import MlflowClient

        with client_env(access):
            client = MlflowClient(tracking_uri=server.uri)
            experiment = client.get_experiment_by_name(TEAM_EXPERIMENT).experiment_id
            figures["upload_s"] = [upload_s(client, experiment, folder) for _ in range(REPEATS)]
    return figures


def upload_s(client, experiment: str, folder: Path) -> float:
    """Seconds to upload ``folder`` to a new LoggedModel of ``experiment``."""
    logged = client.create_logged_model(experiment, name="again")
    began = time.monotonic()
    client.log_model_artifacts(logged.model_id, str(folder))
    return round(time.monotonic() - began, 2)


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], Path(sys.argv[2]))))
