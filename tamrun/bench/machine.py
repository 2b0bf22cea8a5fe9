"""The machine a benchmark ran on, for the header of its report: two hosts that both call their CPU
"AMD EPYC" ran the same recorded tamrun run in about 9 s (without AVX-512) and 4 s (family 26), and a
loaded machine gives meaningless timings, so the CPU's family and model and the load average at the
start are part of every figure. So are the CPU's vector extensions (`VECTOR_EXTENSIONS`, from its
flags) and the kernels torch picks for it (``torch.backends.cpu.get_cpu_capability()``): the same code
was 72 times the peer's speed on one host and 25 times on another (issue 63). And the cores' layout and
caches (`topology_description`, from sysfs): two logical cores may be two cores or one core's two
hyperthreads, and a memory-bound product runs from the last-level cache or from memory by its size."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

# The SIMD extensions a benchmark's header names, in this order, when the CPU's flags list them (x86:
# /proc/cpuinfo "flags"; Arm: "Features").
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
                     "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")
CAPABILITY_TIMEOUT = 120.0  # seconds for a fresh python to import torch and name its CPU capability


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> str:
    """``"<model name> (family F, model M)"`` from ``cpuinfo`` (Linux), else the platform's processor name."""
    fields = cpu_fields(cpuinfo)
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def cpu_fields(cpuinfo: str = "/proc/cpuinfo") -> Dict[str, str]:
    """The first processor's ``key: value`` fields of ``cpuinfo`` (Linux), empty when it cannot be read."""
    fields: Dict[str, str] = {}
    try:
        with open(cpuinfo) as info:
            for line in info:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def vector_extensions(cpuinfo: str = "/proc/cpuinfo") -> Tuple[str, ...]:
    """The `VECTOR_EXTENSIONS` the first processor's flags (or Arm's features) list, in that tuple's order."""
    fields = cpu_fields(cpuinfo)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return tuple(name for name in VECTOR_EXTENSIONS if name in flags)


def torch_capability() -> str:
    """``torch.backends.cpu.get_cpu_capability()`` (the kernels torch dispatches to: DEFAULT, AVX2,
    AVX512, ...): from the loaded torch, else from a fresh python, so that a benchmark's own process
    stays lean; "unknown" when that fails."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    if "torch" in sys.modules:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=CAPABILITY_TIMEOUT, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def cpu_list_size(cpu_list: str) -> int:
    """How many CPUs a sysfs list such as ``"0-3,6"`` names."""
    count = 0
    for part in filter(None, cpu_list.strip().split(",")):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def read_text(path: Path) -> str:
    """A sysfs file's stripped text, "" when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def topology_description(sysfs: str = "/sys/devices/system/cpu") -> str:
    """``"1 thread per core; L2 1024K per 1 CPU, L3 32768K per 2 CPUs"``: the first CPU's hyperthreads
    (``topology/thread_siblings_list``) and its unified or data caches from level 2 up, each with the CPUs
    that share it (``cache/index*``); "unknown" where sysfs says nothing (not Linux)."""
    cpu0 = Path(sysfs) / "cpu0"
    siblings = read_text(cpu0 / "topology" / "thread_siblings_list")
    parts = []
    if siblings:
        threads = cpu_list_size(siblings)
        parts.append(f"{threads} thread{'s' if threads > 1 else ''} per core")
    caches = []
    for index in sorted((cpu0 / "cache").glob("index*")):
        level, kind = read_text(index / "level"), read_text(index / "type")
        size, shared = read_text(index / "size"), read_text(index / "shared_cpu_list")
        if level.isdigit() and int(level) >= 2 and kind in ("Unified", "Data") and size and shared:
            sharing = cpu_list_size(shared)
            caches.append(f"L{level} {size} per {sharing} CPU{'s' if sharing > 1 else ''}")
    if caches:
        parts.append(", ".join(caches))
    return "; ".join(parts) or "unknown"


def vector_description(cpuinfo: str = "/proc/cpuinfo") -> str:
    """``"avx avx2 ... (torch: AVX512)"``: the CPU's vector extensions and torch's view of them."""
    return f"{' '.join(vector_extensions(cpuinfo)) or 'none named'} (torch: {torch_capability()})"


def machine_info(device: str = "cpu") -> Dict[str, str]:
    """CPU (model name, family and model, logical cores), its threads per core and caches, its vector
    extensions and torch's view of them, memory, GPU name, torch and Python versions, and the 1-minute load average when it is read. torch is
    imported only to name a CUDA device (its CPU capability comes from a fresh python unless it is
    loaded): the benchmarks' own process stays lean while the timed runs go on beside it."""
    import psutil

    gpu = "none"
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    info = {"cpu": f"{cpu_description()}, {psutil.cpu_count()} logical cores",
            "cores and caches": topology_description(),
            "vector extensions": vector_description(), "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
            "gpu": gpu,
            "torch": importlib.metadata.version("torch"), "python": platform.python_version()}
    if hasattr(os, "getloadavg"):
        info["load average at start"] = f"{os.getloadavg()[0]:.2f}"
    return info


def header_lines(info: Dict[str, str]) -> List[str]:
    """``- key: value`` markdown lines, one per entry of ``info``."""
    return [f"- {key}: {value}" for key, value in info.items()]
