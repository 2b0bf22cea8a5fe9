"""Screenshots of the MLflow UI, taken by headless Chromium against a real `mlflow server`.

Starts `mlflow server` on 127.0.0.1 with a fresh sqlite store in a temporary folder, records a
two-job sweep chosen on a validation period and a plain run into it over HTTP (python -m tamrun [-m]
tracking.uri=http://127.0.0.1:PORT ...), and saves as PNGs, 1600 pixels wide with MLflow's assistant
panel open as a new user finds it, the experiment's run list, opened at the link every run logs
(tamrun's shared view of the runs table: no column picked by hand), the best job's charts (its page's
Model metrics tab) and the comparison of the sweep's two runs:

    python docs/ui_screenshots.py --out docs/img [--port 5077] [--chromium chromium]

Needs Chromium (Debian: apt-get install chromium) and playwright (pip install 'tamrun[docs]'; it drives
the system's Chromium, no browser download). Everything it starts is stopped before it exits.
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

from tamrun.tracking.ui_view import run_url, runs_table_url

log = logging.getLogger("ui_screenshots")

JOBS = ["model=fourier,spline", "split.validation_start=2023-01-01"]  # the two runs to compare, the best crowned
PLAIN = ["model.effects.toy.m=8"]  # a plain run beside the sweep: its name says what it changed
WIDTH = 1600
# A tracking-only server: MLflow's job execution (GenAI scoring, trace archival) would keep both cores
# busy for about 6 s after /health answers, and the first job's fit_seconds would show it.
TRACKING_ONLY = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


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


METRICS = ["rmse_test", "fit_seconds", "peak_memory_mib", "oom_retries"]  # the compare view's plot


def open_page(browser, url: str, height: int):
    """A fresh browser page (no saved view: what a new user sees) at ``url``."""
    page = browser.new_page(viewport={"width": WIDTH, "height": height})
    page.goto(url)
    return page


def close_assistant(page) -> None:
    close = page.get_by_role("button", name="Close", exact=True)
    if close.count():
        close.first.click()
        page.wait_for_timeout(500)


def run_list(browser, base: str, experiment: str, path: Path) -> None:
    """The experiment's runs at the link every tamrun run logs (its columns are tamrun's shared view:
    nothing picked by hand), the sweep's parent expanded to list its jobs."""
    page = open_page(browser, runs_table_url(base, experiment), 560)
    page.locator('.ag-header-cell[col-id="tags.`best_job`"]').wait_for(timeout=60_000)
    row = page.locator(".ag-pinned-left-cols-container .ag-row", has_text="sweep-")
    row.locator('[col-id="attributes.`Run Name`"] button').click()  # the row's expand toggle
    page.wait_for_function("document.querySelectorAll('.ag-pinned-left-cols-container "
                           "[col-id=\"attributes.`Run Name`\"] a').length >= 4", timeout=60_000)  # its two jobs
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))
    log.info("saved %s", path)


def charts(browser, base: str, experiment: str, run_id: str, path: Path) -> None:
    """The best job's charts: its page's Model metrics tab, the model metrics' one section."""
    page = open_page(browser, f"{run_url(base, experiment, run_id)}/model-metrics", 1000)
    page.locator('[data-testid="experiment-view-compare-runs-section-header"]').first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))
    log.info("saved %s", path)


def comparison(browser, base: str, experiment: str, ids: List[str], path: Path) -> None:
    """The two runs side by side: run details, the parameters that differ and every metric."""
    url = f"{base}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([experiment])}".replace(" ", "")
    page = open_page(browser, url + "&workflowType=machine_learning", 1150)
    page.get_by_text("Run details", exact=True).wait_for(timeout=60_000)
    close_assistant(page)
    # The parallel coordinates plot: the metrics people compare instead of its default (rmse_train).
    metrics = page.locator("input[role=combobox]").nth(1)
    metrics.click()
    page.keyboard.press("Backspace")  # removes rmse_train
    for name in METRICS:
        metrics.fill(name)
        page.keyboard.press("Enter")
        page.wait_for_timeout(300)
    page.keyboard.press("Escape")
    page.get_by_text("Comparing", exact=False).first.click()
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))
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
            stdout=open(f"{tmp}/server.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **TRACKING_ONLY})
        try:
            wait_for(f"{base}/health", 120)
            env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
            for mode in (["-m", f"hydra.sweep.dir={tmp}/sweep", *JOBS], PLAIN):
                subprocess.run([sys.executable, "-m", "tamrun", *mode, f"tracking.uri={base}",
                                f"tracking.experiment={args.experiment}", "progress=log"], check=True, timeout=600,
                               env=env, cwd=tmp)
            with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                                        f"{args.experiment}", timeout=30) as answer:
                experiment = json.load(answer)["experiment"]["experiment_id"]
            runs = api(base, "runs/search", {"experiment_ids": [experiment],
                                              "filter": "tags.sweep_job != ''"})["runs"]
            ids = [r["info"]["run_id"] for r in runs]
            parent = api(base, "runs/search", {"experiment_ids": [experiment],
                                                "filter": "tags.sweep_role = 'parent'"})["runs"][0]
            best = next(t["value"] for t in parent["data"]["tags"] if t["key"] == "best_run")
            from playwright.sync_api import sync_playwright

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                try:
                    run_list(browser, base, experiment, args.out / "mlflow_runs.png")
                    charts(browser, base, experiment, best, args.out / "mlflow_run_charts.png")
                    comparison(browser, base, experiment, ids, args.out / "mlflow_compare.png")
                finally:
                    browser.close()
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
