"""A local Ray cluster on 127.0.0.1 for the cluster tests (the `mlflow server` they record into:
tests/servers.py), started in its own temporary folder and stopped, with every process it started,
even when the test fails.

Nothing here stops a process that these helpers did not start: `ray stop --force` would end every
Ray process of the machine (other users' clusters too), so the cluster is stopped through the
`ray start --block` processes it was started with and their own descendants."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import psutil

from servers import free_port

log = logging.getLogger(__name__)

START_DEADLINE_S = 120  # a Ray node starting on 2 busy cores


def stop_tree(processes: List[subprocess.Popen], grace_s: float = 20.0) -> None:
    """SIGTERM to each started process, then SIGKILL to it and every descendant still there."""
    family = []
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            family += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for proc in processes:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


def wait_until(check, what: str, deadline_s: float = START_DEADLINE_S) -> None:
    """Poll ``check()`` until it is true; AssertionError naming ``what`` after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {deadline_s} s")


def ray_executable() -> str:
    """The `ray` command of this interpreter's environment."""
    return str(Path(sys.executable).with_name("ray"))


@contextlib.contextmanager
def ray_cluster(head_cpus: int = 1, worker_cpus: int = 1) -> Iterator[Dict[str, str]]:
    """A head node and, with ``worker_cpus``, a worker node joining it (separate ``ray start --block``
    processes on 127.0.0.1, a fresh temp folder); yields {"address", "temp_dir", "pids" (of the
    `ray start` processes)}."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="tamrun-ray-", dir="/tmp")  # short: Ray's unix sockets live in it
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    started: List[subprocess.Popen] = []

    def start(*args: str, log_name: str) -> None:
        # the ports Ray would otherwise take at fixed numbers (10001, 52365): free ones, so that two
        # test suites on one machine can each run their cluster
        with open(Path(temp_dir) / log_name, "wb") as out:
            started.append(subprocess.Popen([ray_executable(), "start", "--block", "--disable-usage-stats",
                                             f"--dashboard-agent-listen-port={free_port()}", *args],
                                            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    try:
        start("--head", "--node-ip-address=127.0.0.1", f"--port={port}", *client_server_port(),
              f"--num-cpus={head_cpus}", "--num-gpus=0", "--include-dashboard=false", f"--temp-dir={temp_dir}",
              log_name="head.log")
        wait_until(lambda: nodes_alive(address, env) >= 1, f"the Ray head on {address} up")
        if worker_cpus:
            start(f"--address={address}", "--node-ip-address=127.0.0.1", f"--num-cpus={worker_cpus}", "--num-gpus=0",
                  log_name="worker.log")
            wait_until(lambda: nodes_alive(address, env) >= 2, "the Ray worker node joined")
        yield {"address": address, "temp_dir": temp_dir, "pids": [proc.pid for proc in started]}
    finally:
        stop_tree(list(reversed(started)))
        shutil.rmtree(temp_dir, ignore_errors=True)


def client_server_port() -> List[str]:
    """``--ray-client-server-port=<free>`` where Ray's client server starts (its dependency, grpc, is
    installed: ray[client]; Ray then takes 10001 by default); none with Ray's core alone (tamrun's
    ``ray`` extra), where Ray starts no client server and refuses the option."""
    return [f"--ray-client-server-port={free_port()}"] if importlib.util.find_spec("grpc") else []


def nodes_alive(address: str, env: Dict[str, str]) -> int:
    """How many nodes `ray status` sees alive on the cluster at ``address`` (0: none answers)."""
    done = subprocess.run([ray_executable(), "status", f"--address={address}"], capture_output=True, text=True,
                          env=env, timeout=60)
    if done.returncode != 0:
        return 0
    lines = done.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return sum(1 for line in lines.splitlines() if "node_" in line)
