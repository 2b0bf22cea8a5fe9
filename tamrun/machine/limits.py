"""The memory limits this process lives under, and the bytes it has left below the tightest one.

    left_l = size_l - used_l - memory.safety_margin - recording,   left = min_l left_l  (the binding limit)

    limit l                                   size_l                        used_l
    cgroup (SLURM --mem, docker --memory)     v2 memory.max, v1 memory.     the cgroup's usage (memory.current,
      its own cgroup and every ancestor       limit_in_bytes ("max" or      memory.usage_in_bytes) less the
      up to the mount root                    >= 2^62: none)                reclaimable cache: clean unmapped
                                                                            file pages (memory.stat)
    RLIMIT_AS (ulimit -v)                     resource.getrlimit            VmSize (/proc/self/status)
    RLIMIT_DATA (ulimit -d)                   resource.getrlimit            VmData (what the kernel counts)
    available RAM                             psutil's available            0 (already net of every process)

Mapped file pages (the code and data of the loaded libraries: 120 MiB of torch's when the page cache
was cold and the cgroup was charged for them) count as used even when inactive: the kernel can evict
them only for them to fault straight back in, and a cgroup that relies on that reclaim is killed.
Dirty and writeback pages count as used until they reach the disk; the other file pages, active or
not (the data file just read, the tracking store just written), are reclaimable.

The cgroup is found from /proc/self/cgroup and /proc/self/mountinfo (the usual /sys/fs/cgroup paths
otherwise; `cgroup_chain`, which `tamrun.machine.threads` also reads for the CPU quota). The parsing functions
take the files' paths, so tests run them on fake files. The CPU
`DeviceManager.memory` hands ``left`` to the oracle as the free memory: a plan fits under the real
limit without any setting (docs/memory.md, "The real budget").
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import psutil

from tamrun.config.units import format_size

log = logging.getLogger(__name__)

# A limit at or above this many bytes means "no limit" (cgroup v1 writes 2^63 - 4096 for none).
UNLIMITED = 2**62
CGROUP_ROOT = Path("/sys/fs/cgroup")

# limit name -> how a person raises it
HOWTO = {
    "cgroup": "SLURM --mem, docker run --memory, the Kubernetes limit",
    "RLIMIT_AS": "ulimit -v, prlimit --as; or lift it",
    "RLIMIT_DATA": "ulimit -d, prlimit --data; or lift it",
    "available RAM": "stop other processes, or use a larger machine",
    "memory.limit": "or free memory",
    "device memory": "free device memory held by other processes, or use a larger device",
}
WHAT = {"cgroup": "the cgroup limit", "RLIMIT_AS": "the address-space limit RLIMIT_AS",
        "RLIMIT_DATA": "the data-segment limit RLIMIT_DATA", "available RAM": "the available RAM",
        "memory.limit": "memory.limit", "device memory": "the device's free memory"}
# Limits the process cannot exceed (the others are what happens to be free now).
HARD = ("cgroup", "RLIMIT_AS", "RLIMIT_DATA", "memory.limit")


@dataclass(frozen=True)
class Limit:
    """One limit: ``size`` bytes of which ``used`` are taken; ``left`` keeps ``margin`` bytes free
    (memory.safety_margin) and ``reserve`` bytes for what the run records after its fit
    (`tamrun.memory.footprint.recording_bytes`)."""

    name: str  # a key of WHAT: "cgroup", "RLIMIT_AS", "RLIMIT_DATA", "available RAM", "memory.limit", ...
    size: int
    used: int
    where: str = ""  # the file or call it was read from
    margin: int = 0
    reserve: int = 0

    @property
    def left(self) -> int:
        """size - used - margin - reserve, at least 0."""
        return max(0, self.size - self.used - self.margin - self.reserve)

    def need(self, working: int) -> int:
        """The size this limit must have for ``working`` more bytes: used + margin + reserve + working."""
        return self.used + self.margin + self.reserve + working

    def describe(self) -> str:
        """E.g. "the cgroup limit of 600.00 MiB (/sys/fs/cgroup/memory/job; 250.00 MiB in use, 16.00 MiB
        safety margin, 30.00 MiB for the recording: 304.00 MiB left)"."""
        text = f"{WHAT.get(self.name, self.name)} of {format_size(self.size)}"
        if not (self.where or self.used or self.margin or self.reserve):
            return text
        where = f"{self.where}; " if self.where else ""
        reserve = f", {format_size(self.reserve)} for the recording" if self.reserve else ""
        return (f"{text} ({where}{format_size(self.used)} in use, {format_size(self.margin)} safety margin{reserve}: "
                f"{format_size(self.left)} left)")

    def fix(self, working: int) -> str:
        """What to change so that ``working`` more bytes fit under this limit."""
        return f"raise {WHAT.get(self.name, self.name)} to at least {format_size(self.need(working))} ({self.howto})"

    @property
    def howto(self) -> str:
        return HOWTO.get(self.name, "")


def read_size(path: Path) -> Optional[int]:
    """A cgroup size file's bytes; None when it is missing, unreadable, "max" or >= `UNLIMITED`."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text.split()[0])
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def read_lines(path: Path) -> List[str]:
    """The lines of a (kernel) text file, none when it cannot be read."""
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def read_keyed(path: Path) -> Dict[str, int]:
    """``key value`` lines (memory.stat, /proc/self/status with units dropped) as a dict."""
    out: Dict[str, int] = {}
    for line in read_lines(path):
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    return out


def parse_proc_cgroup(path: Path) -> Dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the v2 line ``0::/path`` under the key ""."""
    out: Dict[str, str] = {}
    for line in read_lines(path):
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                out[controller] = parts[2]
    return out


class Mount(NamedTuple):
    root: str  # the cgroup path mounted at mount_point
    mount_point: Path
    fstype: str
    options: Tuple[str, ...]  # the super options (v1: the controllers)


def parse_mountinfo(path: Path) -> List[Mount]:
    """The cgroup / cgroup2 mounts of /proc/self/mountinfo."""
    mounts = []
    for line in read_lines(path):
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if after and after[0] in ("cgroup", "cgroup2"):
            options = tuple(after[2].split(",")) if len(after) > 2 else ()
            mounts.append(Mount(fields[3], Path(fields[4].replace("\\040", " ")), after[0], options))
    return mounts


def cgroup_dirs(proc_cgroup: Path, mountinfo: Path, controller: str = "memory") -> List[Tuple[str, Path, Path]]:
    """(version, the process's ``controller`` cgroup directory, its mount point) candidates, v1 first."""
    groups, found = parse_proc_cgroup(proc_cgroup), []
    for mount in parse_mountinfo(mountinfo):
        version = "v1" if mount.fstype == "cgroup" else "v2"
        own = groups.get(controller if version == "v1" else "")
        if own is None or (version == "v1" and controller not in mount.options):
            continue
        relative = os.path.relpath(own, mount.root) if own.startswith(mount.root) else "."
        directory = (mount.mount_point / relative).resolve() if relative != "." else mount.mount_point
        found.append((version, directory, mount.mount_point))
    found.sort(key=lambda item: item[0])
    return found


def cgroup_chain(controller: str, proc_cgroup: Path = Path("/proc/self/cgroup"),
                 mountinfo: Path = Path("/proc/self/mountinfo"), root: Path = CGROUP_ROOT) -> Iterator[Tuple[str, Path]]:
    """(version, directory) of the process's ``controller`` cgroup and of each ancestor up to its mount
    point (a limit set on an ancestor binds too); the usual paths under ``root`` when /proc names none."""
    candidates = (cgroup_dirs(proc_cgroup, mountinfo, controller)
                  or [("v2", root, root), ("v1", root / controller, root / controller)])
    for version, directory, mount in candidates:
        while True:
            yield version, directory
            if directory == mount or directory.parent == directory or mount not in directory.parents:
                break
            directory = directory.parent


def cgroup_level(version: str, directory: Path) -> Optional[Limit]:
    """One cgroup directory's limit and working set: usage less the reclaimable cache (clean unmapped
    file pages, `reclaimable_cache`); None: no limit."""
    files = {"v1": ("memory.limit_in_bytes", "memory.usage_in_bytes"), "v2": ("memory.max", "memory.current")}[version]
    size = read_size(directory / files[0])
    usage = read_size(directory / files[1])
    if size is None or usage is None:
        return None
    return Limit("cgroup", size, max(0, usage - reclaimable_cache(version, read_keyed(directory / "memory.stat"))),
                 str(directory))


# memory.stat keys per cgroup version: the file LRU lists, and the file pages that cannot be dropped now
STAT_KEYS = {
    "v1": {"file": ("total_active_file", "total_inactive_file"),
           "kept": ("total_mapped_file", "total_dirty", "total_writeback")},
    "v2": {"file": ("active_file", "inactive_file"), "kept": ("file_mapped", "file_dirty", "file_writeback")},
}


def reclaimable_cache(version: str, stat: Dict[str, int]) -> int:
    """Bytes of a cgroup's page cache the kernel can drop for good: its file pages (active and inactive:
    reclaim deactivates the active ones) less the mapped ones (they would fault straight back in) and the
    dirty and writeback ones (they must reach the disk first)."""
    keys = STAT_KEYS[version]
    return max(0, sum(stat.get(key, 0) for key in keys["file"]) - sum(stat.get(key, 0) for key in keys["kept"]))


def cgroup_limit(proc_cgroup: Path = Path("/proc/self/cgroup"), mountinfo: Path = Path("/proc/self/mountinfo"),
                 root: Path = CGROUP_ROOT) -> Optional[Limit]:
    """The tightest memory limit of the process's cgroup and its ancestors (least left); None: none."""
    levels = [cgroup_level(version, directory)
              for version, directory in cgroup_chain("memory", proc_cgroup, mountinfo, root)]
    return min((level for level in levels if level is not None), key=lambda level: level.size - level.used,
               default=None)


def rlimit_limits(status: Path = Path("/proc/self/status"),
                  getrlimit: Callable[[int], Tuple[int, int]] = resource.getrlimit) -> List[Limit]:
    """RLIMIT_AS against VmSize and RLIMIT_DATA against VmData (VmRSS where a field is missing)."""
    values, out = read_keyed(status), []
    rss = values.get("VmRSS", 0)
    for name, key in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        soft = getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY and 0 <= soft < UNLIMITED:
            out.append(Limit(name, int(soft), values.get(key, rss), f"{key} of /proc/self/status"))
    return out


def process_limits(margin: int = 0, reserve: int = 0) -> List[Limit]:
    """Every limit this process lives under now (available RAM always), each keeping ``margin`` and
    ``reserve`` free (`Limit`)."""
    vm = psutil.virtual_memory()
    limits = [Limit("available RAM", int(vm.available), 0, "psutil")]
    cgroup = cgroup_limit()
    limits += ([cgroup] if cgroup is not None else []) + rlimit_limits()
    return [Limit(limit.name, limit.size, limit.used, limit.where, margin, reserve) for limit in limits]


def binding_limit(margin: int = 0, reserve: int = 0) -> Limit:
    """The limit with the least left (ties: the first of available RAM, cgroup, RLIMIT_AS, RLIMIT_DATA)."""
    return min(process_limits(margin, reserve), key=lambda limit: limit.left)
