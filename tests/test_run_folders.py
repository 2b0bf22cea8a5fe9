"""One Hydra folder per command (issue 35): two runs, or two sweeps, started together in one working
folder never share a run folder or a log. Each folder ends with its own process's tag (pid and 4 random
hex digits, `tamrun.process.run_folder`), so the tests hold whether or not the two processes start in the same
second. Real ``python -m tamrun`` processes, ``mode=plan`` (nothing fitted, nothing recorded)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

from tamrun.process.run_folder import RUN_TAG, new_run_tag

QUICK = ["mode=plan", "tracking=none", "model=spline"]


def start(cwd: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    return subprocess.Popen([sys.executable, "-m", "tamrun", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(processes: List[subprocess.Popen]) -> None:
    for process in processes:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output


def tagged(folder: Path, pid: int) -> bool:
    """Whether ``folder`` is ``<HH-MM-SS>-<pid>-<4 hex digits>``."""
    return re.fullmatch(rf"\d\d-\d\d-\d\d-{pid}-[0-9a-f]{{4}}", folder.name) is not None


def test_two_runs_started_together_have_a_folder_and_a_log_each(tmp_path):
    runs = [start(tmp_path, *QUICK, f"seed={seed}") for seed in (11, 22)]
    finish(runs)
    folders = sorted((tmp_path / "outputs").glob("*/*"))
    assert len(folders) == 2, folders
    for run in runs:
        (folder,) = [f for f in folders if tagged(f, run.pid)]
        seed = "11" if run is runs[0] else "22"
        assert (folder / ".hydra" / "overrides.yaml").read_text().count("seed=") == 1
        assert f"seed={seed}" in (folder / ".hydra" / "overrides.yaml").read_text()
        assert (folder / "tamrun.log").read_text().count("mode=plan: nothing fitted") == 1


def test_two_sweeps_started_together_have_a_folder_each_and_their_jobs_stay_in_it(tmp_path):
    """The parallel launcher's forked workers resolve the sweep folder as the launching process did:
    each job's folder and log lie under its own sweep's folder."""
    sweeps = [start(tmp_path, "-m", "hydra/launcher=parallel", *QUICK, "seed=1,2", "hw.threads=1") for _ in range(2)]
    finish(sweeps)
    folders = sorted((tmp_path / "outputs" / "multirun").glob("*/*"))
    assert len(folders) == 2, folders
    for sweep in sweeps:
        (folder,) = [f for f in folders if tagged(f, sweep.pid)]
        for job in ("0", "1"):
            assert (folder / job / "tamrun.log").read_text().count("mode=plan: nothing fitted") == 1


def test_a_new_tag_names_the_process_and_never_repeats_the_last(monkeypatch):
    seen = set()
    for _ in range(50):
        tag = new_run_tag()
        assert re.fullmatch(rf"-{os.getpid()}-[0-9a-f]{{4}}", tag) and tag != os.environ.get(RUN_TAG)
        monkeypatch.setenv(RUN_TAG, tag)
        seen.add(tag)
    assert len(seen) > 1
