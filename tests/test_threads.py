"""The thread rule (tamrun.machine.threads): hw.threads, else the CPUs a job has under its launcher, else all
usable cores; launchers composed by Hydra from the packaged configs, cgroup quotas from fake files."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from tamrun.machine.threads import cgroup_cpus, omp_threads, resolve_threads, usable_cores

from conftest import csv_overrides
from test_cli import tamrun
from test_limits import write
from test_sweeps import compose_hydra

CORES = (8, "affinity")


def launcher(*overrides: str) -> dict:
    """hydra.launcher as a job of that multirun sees it (a plain mapping)."""
    return OmegaConf.to_container(compose_hydra(*overrides).hydra.launcher, resolve=True)


@pytest.mark.parametrize("n_jobs,count", [(2, 4), (4, 2), (-1, 1), (-2, 1), (16, 1)])
def test_joblib_jobs_share_the_usable_cores(n_jobs, count):
    """8 cores: n_jobs=2 -> 4 each, 4 -> 2, -1 (joblib: all cores, 8 at once) -> 1, -2 (7 at once) -> 1,
    more jobs than cores -> still 1."""
    threads = resolve_threads(None, launcher("hydra/launcher=parallel", f"hydra.launcher.n_jobs={n_jobs}"), CORES)
    assert threads.count == count
    assert f"joblib n_jobs={n_jobs}" in threads.reason and "8 usable cores (affinity)" in threads.reason


def test_the_packaged_parallel_launcher_halves_the_cores():
    threads = resolve_threads(None, launcher("hydra/launcher=parallel"), CORES)
    assert (threads.count, threads.reason) == (4, "2 jobs at once (joblib n_jobs=2) on 8 usable cores (affinity)")


def test_hw_threads_wins_over_the_launcher():
    threads = resolve_threads(3, launcher("hydra/launcher=parallel"), CORES)
    assert (threads.count, threads.reason) == (3, "hw.threads=3")


def test_a_single_run_takes_every_usable_core():
    threads = resolve_threads(None, None, CORES)
    assert (threads.count, threads.reason) == (8, "single run: all 8 usable cores (affinity)")


def test_omp_num_threads_caps_the_rule_but_not_hw_threads():
    """OMP_NUM_THREADS=1 python -m tamrun stays on one thread (as with torch's default)."""
    assert [omp_threads(env) for env in ({}, {"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "0"},
                                         {"OMP_NUM_THREADS": "two"})] == [None, 2, None, None]
    threads = resolve_threads(None, None, CORES, cap=2)
    assert (threads.count, threads.reason) == (2, "OMP_NUM_THREADS=2 caps 8 (single run: all 8 usable cores (affinity))")
    assert resolve_threads(None, launcher("hydra/launcher=parallel"), CORES, cap=4).reason.startswith("2 jobs at once")
    assert resolve_threads(6, None, CORES, cap=2).count == 6


def test_the_basic_launchers_jobs_one_after_another_take_every_core():
    threads = resolve_threads(None, launcher(), CORES)  # no hydra/launcher: Hydra's basic launcher
    assert (threads.count, threads.reason) == (8, "multirun under BasicLauncher: all 8 usable cores (affinity)")


@pytest.mark.parametrize("overrides,count,key", [
    (["hydra/launcher=ray_cluster"], 4, "ray.remote.num_cpus=4"),
    (["hydra/launcher=ray_cluster", "hydra.launcher.ray.remote.num_cpus=32"], 8, "ray.remote.num_cpus=32"),
    (["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=2"], 2, "cpus_per_task=2"),
    (["hydra/launcher=submitit_local"], 8, "without cpus_per_task"),
])
def test_ray_and_submitit_jobs_take_the_cpus_they_reserve(overrides, count, key):
    """Capped at the machine's usable cores; all of them when the launcher reserves no number."""
    threads = resolve_threads(None, launcher(*overrides), CORES)
    assert threads.count == count and key in threads.reason


def test_cgroup_v2_quota_in_a_container_namespace(tmp_path):
    """docker --cpus=1.5: cpu.max "150000 100000" at the container's own cgroup (mounted at root /)."""
    mount = tmp_path / "sys"
    write(tmp_path / "cgroup", "0::/\n")
    write(tmp_path / "mountinfo", f"29 23 0:26 / {mount} rw - cgroup2 cgroup2 rw,nsdelegate\n")
    write(mount / "cpu.max", "150000 100000\n")
    assert cgroup_cpus(tmp_path / "cgroup", tmp_path / "mountinfo", tmp_path / "none") == (1.5, str(mount))
    write(mount / "cpu.max", "max 100000\n")
    assert cgroup_cpus(tmp_path / "cgroup", tmp_path / "mountinfo", tmp_path / "none") is None


def test_cgroup_v1_quota_of_an_ancestor_binds(tmp_path):
    """The job's own cgroup has no quota (-1), its parent allows 3 CPUs (300000 / 100000)."""
    mount = tmp_path / "v1"
    write(tmp_path / "cgroup", "4:cpu,cpuacct:/slurm/job\n2:memory:/slurm/job\n")
    write(tmp_path / "mountinfo", f"30 25 0:27 / {mount} rw - cgroup cgroup rw,cpu,cpuacct\n")
    write(mount / "slurm/job/cpu.cfs_quota_us", "-1\n")
    write(mount / "slurm/job/cpu.cfs_period_us", "100000\n")
    write(mount / "slurm/cpu.cfs_quota_us", "300000\n")
    write(mount / "slurm/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpus(tmp_path / "cgroup", tmp_path / "mountinfo", tmp_path / "none") == (3.0, str(mount / "slurm"))


def test_usable_cores_round_a_quota_down_and_never_reach_zero(tmp_path):
    """The usual root path (no /proc files): a 2.5-CPU quota leaves 2 threads (or the affinity mask's
    count if smaller), a 0.5-CPU one 1."""
    proc = tmp_path / "no-proc"
    write(tmp_path / "root/cpu.max", "250000 100000\n")
    cores, source = usable_cores(tmp_path / "root", proc)
    affinity = usable_cores(tmp_path / "none", proc)
    assert affinity[1] == "affinity" and cores == min(2, affinity[0])
    assert affinity[0] <= 2 or source == f"cgroup CPU quota 2.5 in {tmp_path / 'root'}"
    write(tmp_path / "root/cpu.max", "50000 100000\n")
    assert usable_cores(tmp_path / "root", proc)[0] == 1


def test_a_parallel_sweep_gives_each_job_half_the_cores(tmp_path, csv_path, monkeypatch):
    """2 jobs at once (hydra/launcher=parallel, joblib n_jobs=2): each job's log records cores // 2
    (without an OMP_NUM_THREADS of the caller's, which would cap it)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    sweep_dir = tmp_path / "sweep"
    done = tamrun("-m", "hydra/launcher=parallel", "tracking=none", "hw=cpu", f"hydra.sweep.dir={sweep_dir}",
                  *csv_overrides(csv_path), "seed=1,2", cwd=tmp_path)  # threads are the CPU's
    assert done.returncode == 0, done.stdout + done.stderr
    cores, where = usable_cores()
    expected = f"threads: {max(1, cores // 2)} (2 jobs at once (joblib n_jobs=2) on {cores} usable cores ({where}))"
    for job in (0, 1):
        logged = re.findall(r"threads: .*", (sweep_dir / str(job) / "tamrun.log").read_text())
        assert logged == [expected]
    # the jobs' console lines interleave: each starts with its job's number and run name (its swept value)
    console = [line for line in (done.stdout + done.stderr).splitlines() if "rmse_test=" in line or "threads: " in line]
    for job, seed in ((0, 1), (1, 2)):
        mine = [line for line in console if line.startswith(f"[#{job} seed={seed}] ")]
        assert len(mine) == 2 and any("rmse_test=" in line for line in mine), console
    assert len(console) == 4, console
