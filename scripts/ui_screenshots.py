"""Screenshots of the MLflow UI, taken by headless Chromium against a real `mlflow server`.

Starts `mlflow server` on 127.0.0.1 with a fresh sqlite store in a temporary folder, records a
two-job sweep into it over HTTP (python -m tamrun -m tracking.uri=http://127.0.0.1:PORT ...), and
saves the experiment's run list and the comparison of the two runs as PNGs:

    python scripts/ui_screenshots.py --out docs/img [--port 5077] [--chromium chromium]

Needs Chromium (Debian: apt-get install chromium). Everything it starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import List

log = logging.getLogger("ui_screenshots")

JOBS = ["model=fourier,spline"]  # the two runs to compare
WINDOW = "1600,1000"


def wait_for(url: str, seconds: float) -> None:
    """Poll ``url`` until it answers 200, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {seconds:.0f} s")


def screenshot(chromium: str, url: str, path: Path, budget_ms: int) -> None:
    """Render ``url`` (the React app gets ``budget_ms`` of virtual time) and save a PNG."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={WINDOW}",
                        f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url],
                       check=True, timeout=180, capture_output=True)
    log.info("saved %s", path)


def api(base: str, endpoint: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--port", type=int, default=5077)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--budget-ms", type=int, default=20000, help="virtual time the page gets to render")
    parser.add_argument("--experiment", default="tamrun-ui")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(args.port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
             "--artifacts-destination", f"{tmp}/artifacts"],
            stdout=open(f"{tmp}/server.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(f"{base}/health", 120)
            env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
            subprocess.run([sys.executable, "-m", "tamrun", "-m", f"tracking.uri={base}",
                            f"tracking.experiment={args.experiment}", "progress=log", f"hydra.sweep.dir={tmp}/sweep",
                            *JOBS], check=True, timeout=600, env=env, cwd=tmp)
            with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                                        f"{args.experiment}", timeout=30) as answer:
                experiment = json.load(answer)["experiment"]["experiment_id"]
            runs = api(base, "runs/search", {"experiment_ids": [experiment],
                                              "filter": "tags.sweep_job != ''"})["runs"]
            ids = [r["info"]["run_id"] for r in runs]
            screenshot(args.chromium, f"{base}/#/experiments/{experiment}", args.out / "mlflow_runs.png",
                       args.budget_ms)
            compare = (f"{base}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([experiment])}"
                       .replace(" ", ""))
            screenshot(args.chromium, compare, args.out / "mlflow_compare.png", args.budget_ms)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
