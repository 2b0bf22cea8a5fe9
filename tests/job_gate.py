"""A Hydra callback of the tests' own, added on a sweep's command line, that starts each job when the test
says: job n waits, as it starts, until the file ``go-<n>`` exists in the folder `FOLDER_ENV` names
(tests/test_team_cluster.py kills and restarts the tracking server between two jobs of a sweep, whatever the
machine's speed):

    JOB_GATE_FOLDER=<folder> python -c "import job_gate; job_gate.main()" -m ... \
        +hydra.callbacks.gate._target_=job_gate.JobGate

with this file's folder on PYTHONPATH (the folder is no argument of the callback: tamrun refuses a callback's
arguments, tamrun/config/trusted.py). `main` is ``python -m tamrun`` with this callback added, in its own process,
to the callbacks tamrun's allow-list names (a config is data: tamrun/config/trusted.py refuses any other).
Nothing of tamrun, Hydra or MLflow is replaced: the jobs run as they do.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

WAIT_S = 600  # a test that never opens the gate fails on its own deadline first
GATE = "job_gate.JobGate"
RUN = "import job_gate; job_gate.main()"  # ``python -c RUN <tamrun's arguments>``
FOLDER_ENV = "JOB_GATE_FOLDER"  # the folder of the gates' files


class JobGate(Callback):
    def __init__(self) -> None:
        self.folder = Path(os.environ[FOLDER_ENV])

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        gate = self.folder / f"go-{config.hydra.job.num}"
        deadline = time.monotonic() + WAIT_S
        while not gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} never appeared")
            time.sleep(0.05)


def open_gate(folder: Path, job: int) -> None:
    """Let job ``job`` start."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"go-{job}").touch()


def main() -> None:
    """``python -m tamrun`` with the arguments after ``-c``, `GATE` allowed as a callback (module doc)."""
    from tamrun.__main__ import main as tamrun_main
    from tamrun.config import trusted

    where = ("hydra", "callbacks", "*")
    trusted.TARGETS[where] = (*trusted.TARGETS[where], GATE)
    tamrun_main()
