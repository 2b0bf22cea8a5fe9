"""The README's commands, as written, in a fresh copy of the repository (the files git tracks, or would):
the set-up line (a virtual environment of its own, tamrun installed, the default run), every example
(`python -m tamrun ...`, `python -m tamrun.compare`), and `mlflow ui` serving the store they wrote at
the link the README names. The runs they record are all named apart.

Two commands are not run, and `NOT_RUN` must list exactly those: the test suite's own (CI's `.ci/run`
runs it as written; here it would run this test inside itself) and the benchmark against the peer (the
peer installed from PyPI, then hours of fits). Nothing is shortened: this test is slow (minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest
from mlflow import MlflowClient

from tamrun.tracking.ui_view import DEFAULT_UI, runs_table_url

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMAND_STARTS = ("python ", "python3 ", ".venv/bin/python ", "mlflow ", "bash ")
TEST_COMMAND = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]  # the README's, as CI runs it
NOT_RUN = {
    TEST_COMMAND,
    "python3 -m venv ../peer-venv && ../peer-venv/bin/pip install torch==2.13.0 && ../peer-venv/bin/pip install "
    "tam-ml==1.5.0",
    ".venv/bin/python -m tamrun.bench --peer-python ../peer-venv/bin/python",
}
COMMAND_TIMEOUT_S = 1800  # the set-up line installs tamrun and its dependencies
UI_START_S = 120


def readme_commands() -> List[str]:
    """The commands of the README's indented code blocks, continuation lines joined, in page order."""
    commands, pending = [], ""
    for line in README.read_text(encoding="utf-8").splitlines():
        if not line.startswith("    "):
            continue
        text = pending + line.strip()
        pending = text[:-1] if text.endswith("\\") else ""
        if not pending and text.startswith(COMMAND_STARTS):
            commands.append(text)
    return commands


def without_comment(command: str) -> str:
    """A command without its trailing ``# ...`` comment (for comparing with `NOT_RUN`)."""
    return re.sub(r"\s+#[^'\"]*$", "", command).strip()


def fresh_copy(target: Path) -> Path:
    """The files a fresh clone would have (tracked, or untracked and not ignored), copied to ``target``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot tell which files a fresh clone has")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def environment(clone: Path) -> Dict[str, str]:
    """The shell of someone who set up the README's virtual environment in the clone (its bin first on
    PATH, as `source .venv/bin/activate` does), else this test's interpreter's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "MLFLOW_", "VIRTUAL_ENV"))}
    bins = [str(clone / ".venv" / "bin"), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every README command but `mlflow ui` and `NOT_RUN`, in order, in one fresh copy: (copy, results)."""
    clone = fresh_copy(tmp_path_factory.mktemp("clone"))
    results = {}
    for command in readme_commands():
        if without_comment(command) in NOT_RUN or command.startswith("mlflow ui"):
            continue
        results[command] = subprocess.run(["bash", "-c", command], cwd=clone, env=environment(clone),
                                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return clone, results


def test_the_commands_left_out_are_exactly_the_two_named():
    commands = [without_comment(c) for c in readme_commands()]
    assert NOT_RUN <= set(commands), NOT_RUN - set(commands)
    assert any(c.startswith("python -m tamrun data=csv") for c in commands)  # continuation lines joined
    assert sum(c.startswith("mlflow ui") for c in commands) == 1


@pytest.mark.index
def test_every_readme_command_runs_as_written_in_a_fresh_copy(ran):
    clone, results = ran
    failed = {c: (r.returncode, (r.stdout + r.stderr)[-3000:]) for c, r in results.items() if r.returncode != 0}
    assert not failed, json.dumps(failed, indent=1)
    assert len(results) == len(readme_commands()) - len(NOT_RUN) - 1
    metrics = re.findall(r"rmse_test=(\S+)", "".join(r.stdout + r.stderr for r in results.values()))
    assert metrics and all(len(re.sub(r"\D", "", value).lstrip("0")) >= 4 for value in metrics)  # 4 digits at least
    client = MlflowClient(f"sqlite:///{clone / 'outputs' / 'mlflow.db'}")
    names = [run.info.run_name for run in client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])]
    assert len(names) >= 7 and len(set(names)) == len(names), names  # every run named apart


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.index
def test_mlflow_ui_serves_the_runs_at_the_link_the_readme_names(ran):
    clone, _ = ran
    command = next(c for c in readme_commands() if c.startswith("mlflow ui"))
    if not port_free(5000):
        pytest.skip("127.0.0.1:5000, the port `mlflow ui` takes, is in use by another program")
    server = subprocess.Popen(["bash", "-c", command], cwd=clone, env=environment(clone), start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + UI_START_S
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{DEFAULT_UI}/health", timeout=2):
                break
            assert server.poll() is None and time.monotonic() < deadline, "mlflow ui did not start"
            time.sleep(0.5)
        with urllib.request.urlopen(f"{DEFAULT_UI}/api/2.0/mlflow/experiments/get-by-name?experiment_name=tamrun",
                                    timeout=30) as answer:
            experiment_id = json.load(answer)["experiment"]["experiment_id"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert f"    {runs_table_url('sqlite:///outputs/mlflow.db', experiment_id)}\n" in README.read_text(encoding="utf-8")
