"""docs/scale.md's walk-through, as written: every ```sh block of the page, in page order, each run after
the first one (its variables) in a fresh ``bash -euo pipefail``, from the repository's root, as root (the
page's PostgreSQL commands switch user with runuser).

What differs per machine is given the way the page says, through the environment its first block reads: ROOT
(a fresh folder, under a temporary one the postgres user may enter), VENV (this interpreter's virtual
environment), PGPORT, PORT and RAYPORT (free ports). Nothing else of the page is changed or left out: its
blocks install tamrun with the extras they name, start PostgreSQL, `mlflow server` on it locked (MLflow's
basic-auth app, TLS with a self-signed certificate, an admin, alice who may EDIT, bob who may READ), two
sweeps against it as alice, a 2-node Ray cluster and a sweep on it, the runs compared by bob and a job of his
refused; the "Stop" block stops them. The test checks what the sweeps recorded (every job FINISHED under its
parent and alice's, the Ray jobs on both nodes with the shell's tracking variables, no password in Ray's
folder), what bob saw, then runs the "Stop" block and checks that nothing it started is left; then the page's
"Restart" block and the server's and the cluster's blocks again, as the page says (issue 61: the server's
block failed on a second start), bob sees the same runs, and the "Stop" block stops them. Whatever a failing
block leaves running is stopped by the fixture: the process groups of the blocks, the processes the page's pid
files name, and PostgreSQL (pg_ctl stop).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from conftest import RAY_TEST_ENV, sh_blocks
from mlflow.tracking import MlflowClient

from local_cluster import wait_until
from servers import free_port, postgres_binaries

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "scale.md"
BLOCK_TIMEOUT_S = 900  # the install block may build tamrun's wheel; a sweep on 2 busy cores takes a minute
STOP, RESTART = -2, -1  # the page's last two blocks: "Stop", then "Restart" after it


def page_blocks() -> List[str]:
    """The page's ```sh blocks, in order."""
    return sh_blocks(PAGE)


def block_with(text: str) -> int:
    """The index of the page's first block that holds ``text``."""
    return next(index for index, block in enumerate(page_blocks()) if text in block)


class Walkthrough:
    """The page's blocks run one after the other in the environment of a machine of its own; every
    block's result, and the process group of each (what it left running is in it)."""

    def __init__(self, top: Path) -> None:
        self.top, self.root = top, top / "team"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("HYDRA_", "MLFLOW_", "TAMRUN_", "RAY_", "VIRTUAL_ENV"))}
        self.env.update(ROOT=str(self.root), VENV=sys.prefix, PGPORT=str(free_port()), PORT=str(free_port()),
                        RAYPORT=str(free_port()), **RAY_TEST_ENV)  # tests/conftest.py
        self.blocks = page_blocks()
        self.results: List[subprocess.CompletedProcess] = []
        self.groups: List[int] = []

    def run(self, index: int) -> subprocess.CompletedProcess:
        """Block ``index`` after the first (the first alone for index 0)."""
        index %= len(self.blocks)
        script = self.blocks[index] if index == 0 else f"{self.blocks[0]}\n{self.blocks[index]}"
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=self.env, text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.groups.append(proc.pid)
        started = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        done = subprocess.CompletedProcess(script, proc.returncode, out, "")
        # a record of each block's wall time (docs/scale.md states them), never a condition of a test
        log.info("page block %d (%s): exit %s, %.1f s", index, self.blocks[index].splitlines()[0][:60],
                 proc.returncode, time.monotonic() - started)
        self.results.append(done)
        return done

    def left_running(self) -> List[psutil.Process]:
        """The processes still alive of the blocks' process groups and of the page's pid files."""
        pids = {int(p.read_text()) for p in self.root.glob("*.pid") if p.read_text().strip().isdigit()}
        found = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid in pids or os.getpgid(proc.pid) in self.groups:
                    found.append(proc)
        return found

    def stop_everything(self) -> None:
        """SIGTERM, then SIGKILL after a grace, to whatever the blocks left; PostgreSQL stopped."""
        pg_data = self.root / "postgres" / "data"
        if (pg_data / "postmaster.pid").exists():
            subprocess.run(["runuser", "-u", "postgres", "--", str(postgres_binaries() / "pg_ctl"), "-D", str(pg_data),
                            "-m", "immediate", "-w", "stop"], capture_output=True, timeout=120)
        left = self.left_running()
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(left, timeout=20)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)


def shown(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}\n--- block ---\n{done.args}\n--- output ---\n{done.stdout[-6000:]}"


@pytest.fixture(scope="module")
def walkthrough():
    """Every block of the page before "Stop", stopping at the first that fails."""
    if os.geteuid() != 0:
        pytest.skip("the page's PostgreSQL commands run as root (runuser -u postgres)")
    if sys.prefix == sys.base_prefix:
        pytest.skip("the page installs into a virtual environment: run the tests from one (VENV)")
    postgres_binaries()  # a skip, saying what is missing, without PostgreSQL's binaries or its driver
    top = Path(tempfile.mkdtemp(prefix="tamrun-page-", dir="/tmp"))  # short: Ray's sockets live under it
    top.chmod(0o755)  # the postgres user enters it (tempfile makes it 0700)
    page = Walkthrough(top)
    try:
        for index in range(len(page.blocks) + STOP):
            if page.run(index).returncode != 0:
                break
        yield page
    finally:
        page.stop_everything()
        shutil.rmtree(top, ignore_errors=True)


def test_the_page_is_a_walkthrough_of_sh_blocks_that_read_its_first_one():
    blocks = page_blocks()
    assert len(blocks) == 12, [b.splitlines()[0] for b in blocks]
    assert blocks[STOP].startswith("kill ") and " start" in blocks[RESTART] and "initdb" not in blocks[RESTART]
    assert all(f"{name}=${{{name}:-" in blocks[0] for name in ("ROOT", "VENV", "PGPORT", "PORT", "RAYPORT"))
    assert "/srv" not in "\n".join(blocks) and "pip install 'tamrun[" not in "\n".join(blocks)
    for block in blocks[1:]:  # the venv's executables, never a bare python, mlflow or ray
        for line in block.splitlines():
            assert not line.lstrip().startswith(("python ", "mlflow ", "ray ", "pip ")), line


def test_every_block_of_the_page_runs_as_written(walkthrough, monkeypatch):
    """Every block exits 0; the locked server on PostgreSQL holds both sweeps, as bob (READ) sees them: the
    parallel one's 3 jobs and the Ray one's 4, each FINISHED under its FINISHED parent, the Ray jobs on both
    nodes, each handed the shell's MLFLOW_TRACKING_URI and alice's credentials (the password by name only,
    in no file of Ray's folder), the artifacts served by the server; bob's compare listed the Ray sweep, his
    job was refused with one line."""
    page = walkthrough
    assert len(page.results) == len(page.blocks) + STOP, shown(page.results[-1])
    for done in page.results:
        assert done.returncode == 0, shown(done)
    secrets = page.root / "secrets"
    runs = runs_as_bob(page, monkeypatch)
    parents = {r.data.tags["sweep_id"]: r for r in runs if r.data.tags.get("sweep_role") == "parent"}
    assert len(parents) == 2 and {r.info.status for r in parents.values()} == {"FINISHED"}
    jobs = {sweep: [r for r in runs if r.data.tags.get("sweep_id") == sweep and r.info.run_id != parent.info.run_id]
            for sweep, parent in parents.items()}
    by_size = sorted(jobs.values(), key=len)
    assert [len(j) for j in by_size] == [3, 4], {k: len(v) for k, v in jobs.items()}
    parallel, on_ray = by_size
    for run in parallel + on_ray:
        assert run.info.status == "FINISHED" and run.info.artifact_uri.startswith("mlflow-artifacts:")
        assert run.info.user_id == run.data.tags["mlflow.user"] == "alice"  # the account, not root (issue 61)
        assert run.data.tags["mlflow.parentRunId"] == parents[run.data.tags["sweep_id"]].info.run_id
    assert sorted(r.data.params["model.effects.toy.ap"] for r in on_ray) == ["-3", "-4", "-5", "-6"]
    assert len({r.data.tags["ray.node_id"] for r in on_ray}) == 2
    assert all({"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME"} <= set(r.data.tags["ray.env"].split(", "))
               for r in on_ray)
    alice = (secrets / "alice").read_text().strip()
    assert not [path for path in (page.root / "ray").rglob("*") if path.is_file() and not path.is_socket()
                and alice.encode() in path.read_bytes()]
    compared = page.results[-1].stdout
    assert all(r.data.tags["mlflow.runName"] in compared for r in on_ray), compared
    assert "tamrun: config error: MLFLOW_TRACKING_USERNAME='bob'" in compared and alice not in compared
    assert {Path(r.data.tags["sweep_dir"]).name for r in parents.values()} == {"penalties", "ray-penalties"}


def runs_as_bob(page: Walkthrough, monkeypatch) -> list:
    """Every run of the experiment ``tamrun`` on the page's server, as bob (READ) reads them."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", (page.root / "secrets" / "bob").read_text().strip())
    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(page.root / "tls" / "server.crt"))
    client = MlflowClient(tracking_uri=f"https://127.0.0.1:{page.env['PORT']}")
    return client.search_runs([client.get_experiment_by_name("tamrun").experiment_id], max_results=100)


def stopped(page: Walkthrough) -> None:
    """The page's "Stop" block stops the Ray nodes, the server and PostgreSQL: none of them is left."""
    done = page.run(STOP)
    assert done.returncode == 0, shown(done)
    started = time.monotonic()
    wait_until(lambda: not page.left_running(), "every process the page started ended", 120)
    log.info("after the Stop block, the last process the page started ended in %.1f s", time.monotonic() - started)
    assert not (page.root / "postgres" / "data" / "postmaster.pid").exists()


def test_the_stop_block_stops_what_the_page_started(walkthrough):
    page = walkthrough
    if len(page.results) < len(page.blocks) + STOP or page.results[-1].returncode != 0:
        pytest.fail("an earlier block of the page failed (test_every_block_of_the_page_runs_as_written)")
    stopped(page)


def test_the_restart_block_and_the_server_s_block_again_bring_back_what_was_stopped(walkthrough, monkeypatch):
    """Issue 61: the server's block, run again after the first start, failed (``cat: .../admin-first: No
    such file or directory``). After "Stop": "Restart", then the server's and the cluster's blocks as
    written, each exit 0; bob reads the 2 sweeps' 9 runs again; "Stop" stops everything again."""
    page = walkthrough
    if len(page.results) != len(page.blocks) + STOP + 1 or page.results[-1].returncode != 0:
        pytest.fail("the page's Stop block did not run first (test_the_stop_block_stops_what_the_page_started)")
    for index in (RESTART, block_with("mlflow server --app-name basic-auth"), block_with("ray start --head")):
        done = page.run(index)
        assert done.returncode == 0 and "No such file" not in done.stdout, shown(done)
    runs = runs_as_bob(page, monkeypatch)
    assert len(runs) == 9 and {r.info.status for r in runs} == {"FINISHED"}
    stopped(page)
