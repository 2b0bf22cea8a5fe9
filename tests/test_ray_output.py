"""A Ray sweep's terminal (issue 44; docs/reliability.md): the sweep's last line is last, and each line is
printed once. Ray forwards its workers' output on a thread of its own, late and unordered (it came after
the last line); the launcher turns that off (conf/hydra/launcher/ray_cluster.yaml) and says each job's end
itself, in job order, a failed job's own error line with it. A real local Ray instance (started by the
sweep, ``ray.init.address=null``) runs 3 jobs, one of them refused by its config."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from conftest import RAY_TEST_ENV, csv_overrides

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray: pip install 'tamrun[ray]'")]


def test_the_sweeps_last_line_is_last_and_every_line_is_printed_once(tmp_path, csv_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_", "MLFLOW_", "RAY_"))}
    env.update(RAY_TEST_ENV)  # tests/conftest.py: no token of Ray's in the home folder
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-m", "tamrun", "-m", "hydra/launcher=ray_cluster",
                           "hydra.launcher.ray.init.address=null", "hydra.launcher.ray.remote.num_cpus=1",
                           *csv_overrides(csv_path), "model.effects.sx.k=6,8,0", f"tracking.uri={store}",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}", "tracking.log_plots=false",
                           "tracking.log_model=false", "progress=off"],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 2, done.stdout[-5000:]
    assert lines[-1].startswith("tamrun: 1 of 3 sweep job(s) did not finish (job 2: config error ConfigError)")
    assert not any("(run_job_in_ray" in line for line in lines), done.stdout[-5000:]
    stamped = [line for line in lines if re.match(r"\[\d{4}-\d\d-\d\d ", line)]
    assert len(stamped) == len(set(stamped)), "a line printed twice"
    ends = [re.search(r"sweep job #(\d): (rmse_test=|did not finish)", line) for line in lines]
    assert [(m.group(1), m.group(2)) for m in ends if m] == [("0", "rmse_test="), ("1", "rmse_test="),
                                                            ("2", "did not finish")]
    (error,) = [line for line in lines if "sweep job #2: tamrun: config error: model.effects.sx.k=0" in line]
    assert lines.index(error) < len(lines) - 1
