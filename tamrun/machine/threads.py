"""How many intra-op threads torch gets on the CPU: the CPUs one job has, so that jobs run at once do
not fight over the cores (`resolve_threads`).

    hw.threads set                                         hw.threads
    a multirun's jobs at once under the joblib launcher    usable cores // jobs at once (at least 1); jobs at
      (hydra/launcher=parallel, joblib)                      once = n_jobs, or joblib's usable + 1 + n_jobs
                                                             when n_jobs < 0 (-1: all cores, 1 thread each)
    the Ray launcher                                       ray.remote.num_cpus (the CPUs Ray reserves a job)
    the submitit launchers (slurm, submitit_local)         cpus_per_task (the CPUs SLURM gives a job)
    anything else: a single run, the basic launcher's      all usable cores
      jobs (one after another), an unknown launcher

The counts of Ray and submitit are capped at the usable cores of the machine the job runs on, and left
to the usable cores when unset. An OMP_NUM_THREADS in the environment caps the rule's count (not
hw.threads): ``OMP_NUM_THREADS=1 python -m tamrun`` stays on one thread, as it did with torch's default,
and in a joblib worker it holds joblib's own cores // n_jobs (loky sets it, or keeps the parent's). Usable cores: the CPUs of the process's affinity mask
(os.sched_getaffinity: taskset, a cpuset, SLURM's binding), fewer under a CPU quota of its cgroup or an
ancestor's (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us: docker --cpus, a Kubernetes CPU limit),
rounded down: a thread more than the quota is throttled at every period's end.

A joblib sweep of fewer jobs than n_jobs still counts n_jobs at once (a job cannot see its sweep's
size): set hydra.launcher.n_jobs to the number of jobs, or hw.threads. `tamrun.device.manager.DeviceManager`
applies the count on the CPU and logs it and its reason at INFO; the runner records them as the run's
tags ``threads`` and ``threads_reason``.

How a thread waits (`wait_policy`, applied by ``python -m tamrun`` before torch loads). torch's CPU
wheels run their parallel regions (and MKL's) on GNU OpenMP, whose threads spin on the CPU for
``GOMP_SPINCOUNT`` pause instructions between regions before they sleep: 300,000 by default, 10-20 ms,
longer than the scheduler's time slice. On cores of its own a spinning thread starts the next region
at once; on cores another process shares, a region ends only when every one of its threads has run,
and a thread spinning for its partner holds the core that partner needs, so each of a fit's thousands
of regions waits out time slices (docs/benchmarks.md: the default fit 15-30 times slower beside two busy
processes). ``OMP_WAIT_POLICY=PASSIVE`` (no spin) pays a sleep and a wake-up at every region instead
(20-30 % slower on idle cores). tamrun chooses as the command starts (`wait_policy`, applied before torch
loads): cores another process keeps busy from the command's start to the moment torch loads (at least
`BUSY_AT_START` of a core, read from /proc/stat less the command's own CPU time), or a parallel sweep's
job (its siblings share the cores): ``GOMP_SPINCOUNT`` = `WAIT_SPINS`, long enough to bridge the gap
between two operations of a fit, short enough that a thread whose partner is not running gives the core
back within a fraction of a time slice; idle cores: OpenMP's default spin, the fastest there. The thread
count is not changed by the load: a count changes a fit's sums (its bits), a wait policy never does. An
environment that sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` itself keeps its own. The runner records
the choice as the run's tag ``omp_wait``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, MutableMapping, Optional, Tuple

from tamrun.machine.limits import CGROUP_ROOT, cgroup_chain, read_lines

log = logging.getLogger(__name__)

# A cgroup v2 cpu.max without a period, and v1's default period (microseconds).
DEFAULT_PERIOD = 100_000

# GOMP_SPINCOUNT tamrun sets when the environment chooses no wait policy: spins of a pause instruction
# (about 30-140 cycles each) before an idle OpenMP thread sleeps, i.e. some 15-70 us (docs/benchmarks.md,
# "Shared cores", for the values measured and why this one).
WAIT_SPINS = 1000
# Cores kept busy by other processes, as the command started, from which `WAIT_SPINS` is chosen; and the
# shortest window (seconds) over which that load is read.
BUSY_AT_START = 0.5
LOAD_WINDOW_S = 0.2
# The variables through which a user chooses OpenMP's wait policy; either one set: tamrun sets nothing.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True)
class Threads:
    """``count`` intra-op threads, and why (e.g. "hw.threads=4", "2 jobs at once (joblib n_jobs=2) on
    2 usable cores (affinity)")."""

    count: int
    reason: str


def cpu_quota(version: str, directory: Path) -> Optional[float]:
    """The CPUs one cgroup directory's quota allows (1.5 for ``150000 100000``); None: no quota."""
    if version == "v2":
        fields = (read_lines(directory / "cpu.max") or [""])[0].split()
        if not fields or fields[0] == "max":
            return None
        quota, period = fields[0], fields[1] if len(fields) > 1 else str(DEFAULT_PERIOD)
    else:
        quota = (read_lines(directory / "cpu.cfs_quota_us") or ["-1"])[0].strip()
        period = (read_lines(directory / "cpu.cfs_period_us") or [str(DEFAULT_PERIOD)])[0].strip()
    try:
        cpus = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return cpus if cpus > 0 else None


def cgroup_cpus(proc_cgroup: Path = Path("/proc/self/cgroup"), mountinfo: Path = Path("/proc/self/mountinfo"),
                root: Path = CGROUP_ROOT) -> Optional[Tuple[float, str]]:
    """The tightest CPU quota of the process's cgroup and its ancestors, in CPUs, with the directory
    it was read from; None: no quota."""
    quotas = [(cpus, str(directory)) for version, directory in cgroup_chain("cpu", proc_cgroup, mountinfo, root)
              if (cpus := cpu_quota(version, directory)) is not None]
    return min(quotas, default=None)


def usable_cores(root: Path = CGROUP_ROOT, proc: Path = Path("/proc/self")) -> Tuple[int, str]:
    """(cores this process may use, where that number comes from): the affinity mask's CPUs, or fewer
    under a cgroup CPU quota (rounded down, at least 1). ``root`` and ``proc`` are parameters for tests."""
    try:
        cores, source = len(os.sched_getaffinity(0)), "affinity"
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        cores, source = os.cpu_count() or 1, "cpu_count"
    quota = cgroup_cpus(proc / "cgroup", proc / "mountinfo", root)
    if quota is not None and max(1, math.floor(quota[0])) < cores:
        cores, source = max(1, math.floor(quota[0])), f"cgroup CPU quota {quota[0]:g} in {quota[1]}"
    return cores, source


def joblib_jobs_at_once(n_jobs: Any, cores: int) -> int:
    """Jobs joblib runs at once for ``n_jobs`` on ``cores`` (n < 0: cores + 1 + n, so -1 is all cores;
    joblib refuses 0, and None runs them one by one)."""
    if n_jobs is None:
        return 1
    n_jobs = int(n_jobs)
    return max(1, cores + 1 + n_jobs if n_jobs < 0 else n_jobs or cores)


def launcher_threads(launcher: Mapping[str, Any], cores: int, where: str) -> Optional[Threads]:
    """The threads of one job under a multirun ``launcher`` (hydra.launcher as a plain mapping) on
    ``cores`` usable cores (``where``: their source); None: the launcher runs jobs one after another
    or is unknown (all usable cores)."""
    target = str(launcher.get("_target_", "")).rsplit(".", 1)[-1]
    if target == "JoblibLauncher":
        at_once = joblib_jobs_at_once(launcher.get("n_jobs"), cores)
        return Threads(max(1, cores // at_once), f"{at_once} jobs at once (joblib n_jobs={launcher.get('n_jobs')}) "
                                                 f"on {cores} usable cores ({where})")
    if target.startswith("Ray"):
        asked, key = ((launcher.get("ray") or {}).get("remote") or {}).get("num_cpus"), "ray.remote.num_cpus"
    elif target in ("SlurmLauncher", "LocalLauncher"):
        asked, key = launcher.get("cpus_per_task"), "cpus_per_task"
    else:
        return None
    if asked is None:
        return Threads(cores, f"{target} without {key}: all {cores} usable cores ({where})")
    count = max(1, min(int(asked), cores))
    return Threads(count, f"{target} {key}={asked} on {cores} usable cores ({where})")


def resolve_threads(requested: Optional[int], launcher: Optional[Mapping[str, Any]],
                    cores: Tuple[int, str], cap: Optional[int] = None) -> Threads:
    """The rule of the module doc: ``requested`` (hw.threads) wins; else the CPUs a job of a multirun
    under ``launcher`` has; else (``launcher`` None: a single run) all ``cores`` ((count, source) as
    `usable_cores` gives them); at most ``cap`` (OMP_NUM_THREADS) but for ``requested``."""
    if requested is not None:
        return Threads(int(requested), f"hw.threads={requested}")
    count, where = cores
    threads = Threads(count, f"single run: all {count} usable cores ({where})")
    if launcher is not None:
        name = str(launcher.get("_target_", "")).rsplit(".", 1)[-1]
        threads = (launcher_threads(launcher, count, where)
                   or Threads(count, f"multirun under {name}: all {count} usable cores ({where})"))
    if cap is not None and cap < threads.count:
        return Threads(cap, f"OMP_NUM_THREADS={cap} caps {threads.count} ({threads.reason})")
    return threads


def omp_threads(environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """OMP_NUM_THREADS as a positive count; None when unset or not one."""
    try:
        count = int(environ.get("OMP_NUM_THREADS", "").strip())
    except ValueError:
        return None
    return count if count > 0 else None


def job_threads(requested: Optional[int]) -> Threads:
    """`resolve_threads` for this process: hw.threads, its Hydra multirun's launcher, its usable cores
    and OMP_NUM_THREADS."""
    return resolve_threads(requested, multirun_launcher(), usable_cores(), omp_threads())


def multirun_launcher() -> Optional[Mapping[str, Any]]:
    """hydra.launcher as a plain mapping inside a multirun's job; None in a single run or outside a
    Hydra app (Hydra is imported here, not at the module's import)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN or hydra_cfg.get("launcher") is None:
        return None
    return OmegaConf.to_container(hydra_cfg.launcher, resolve=True)



@dataclass(frozen=True)
class CpuClock:
    """A reading of the clocks `others_busy` compares: wall seconds, the CPU seconds every core of the
    machine has spent busy (/proc/stat: all but idle and iowait) and this process's own CPU seconds (all
    its threads)."""

    wall: float
    machine_busy: float
    own: float

    @classmethod
    def read(cls, stat: Path = Path("/proc/stat")) -> Optional["CpuClock"]:
        """Now; None where /proc/stat cannot be read (not Linux)."""
        fields = (read_lines(stat) or [""])[0].split()
        if len(fields) < 6 or fields[0] != "cpu":
            return None
        ticks = [int(value) for value in fields[1:9]]  # guest time, after these, is already in user's
        busy = sum(ticks) - ticks[3] - ticks[4]  # user nice system idle iowait irq softirq steal
        times = os.times()
        return cls(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), times.user + times.system)


def others_busy(start: CpuClock, end: CpuClock) -> Optional[float]:
    """Cores other processes kept busy between two readings: (machine busy - own) / wall; None for a
    window too short to tell (`LOAD_WINDOW_S`)."""
    wall = end.wall - start.wall
    if wall < LOAD_WINDOW_S:
        return None
    return max(0.0, ((end.machine_busy - start.machine_busy) - (end.own - start.own)) / wall)


def wait_policy(environ: Mapping[str, str] = os.environ, others: Optional[float] = None,
                jobs_at_once: bool = False) -> Tuple[Dict[str, str], str]:
    """(variables to set before torch loads, the policy in words), the rule of the module doc: the
    environment's own policy when it sets one of `WAIT_VARIABLES`; ``GOMP_SPINCOUNT`` = `WAIT_SPINS`
    for a job that shares the cores with other jobs of its sweep (``jobs_at_once``) or when ``others``
    (cores other processes kept busy as the command started, `others_busy`) is at least `BUSY_AT_START`;
    else nothing (OpenMP's default spin: the fastest on idle cores)."""
    given = {name: environ[name] for name in WAIT_VARIABLES if environ.get(name, "").strip()}
    if given:
        return {}, "the environment's: " + " ".join(f"{name}={value}" for name, value in given.items())
    short = {"GOMP_SPINCOUNT": str(WAIT_SPINS)}
    if jobs_at_once:
        return short, f"GOMP_SPINCOUNT={WAIT_SPINS}: the sweep's jobs share the cores"
    if others is None:
        return {}, "OpenMP's default spin: no load measured at start"
    if others >= BUSY_AT_START:
        return short, f"GOMP_SPINCOUNT={WAIT_SPINS}: {others:.1f} cores busy with other processes at start"
    return {}, f"OpenMP's default spin: cores idle at start ({others:.1f} busy with other processes)"


def apply_wait_policy(start: Optional[CpuClock], jobs_at_once: bool = False,
                      environ: MutableMapping[str, str] = os.environ) -> str:
    """Choose the wait policy (`wait_policy`, the load measured since ``start``: the command's first
    reading) and set its variables in ``environ`` (this process's, before torch loads, and so its child
    processes'); the policy in words is kept for the run's tag (`applied_wait_policy`). Once per process:
    a policy already applied, or torch already loaded (OpenMP read its variables then), is left as it is."""
    if environ.get(WAIT_REASON):
        return environ[WAIT_REASON]
    if "torch" in sys.modules:
        reason = applied_wait_policy(environ) + " (torch was loaded before tamrun could choose)"
    else:
        end = CpuClock.read() if start is not None else None
        variables, reason = wait_policy(environ, others_busy(start, end) if end is not None else None, jobs_at_once)
        environ.update(variables)
    environ[WAIT_REASON] = reason
    log.info("OpenMP wait policy: %s", reason)
    return reason


# Where `apply_wait_policy` leaves its reason for the run's tag (inherited by a sweep's local workers).
WAIT_REASON = "TAMRUN_OMP_WAIT"


def applied_wait_policy(environ: Mapping[str, str] = os.environ) -> str:
    """The wait policy this process's torch threads follow, in words: `apply_wait_policy`'s, or the
    environment's as OpenMP reads it (torch loaded by a program of the user's, not ``python -m tamrun``)."""
    if environ.get(WAIT_REASON):
        return environ[WAIT_REASON]
    given = [f"{name}={environ[name]}" for name in WAIT_VARIABLES if environ.get(name, "").strip()]
    return "the environment's: " + " ".join(given) if given else "OpenMP's default (GOMP_SPINCOUNT=300000)"
