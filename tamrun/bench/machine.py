"""The machine a benchmark ran on, for the header of its report: two hosts that both call their CPU
"AMD EPYC" ran the same recorded tamrun run in about 9 s (without AVX-512) and 4 s (family 26), and a
loaded machine gives meaningless timings, so the CPU's family and model and the load average at the
start are part of every figure."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Dict, List


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> str:
    """``"<model name> (family F, model M)"`` from ``cpuinfo`` (Linux), else the platform's processor name."""
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
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def machine_info(device: str = "cpu") -> Dict[str, str]:
    """CPU (model name, family and model, logical cores), memory, GPU name, torch and Python versions,
    and the 1-minute load average when it is read. torch is imported only to name a CUDA device: the
    benchmarks' own process stays lean while the timed runs go on beside it."""
    import psutil

    gpu = "none"
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    info = {"cpu": f"{cpu_description()}, {psutil.cpu_count()} logical cores",
            "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB", "gpu": gpu,
            "torch": importlib.metadata.version("torch"), "python": platform.python_version()}
    if hasattr(os, "getloadavg"):
        info["load average at start"] = f"{os.getloadavg()[0]:.2f}"
    return info


def header_lines(info: Dict[str, str]) -> List[str]:
    """``- key: value`` markdown lines, one per entry of ``info``."""
    return [f"- {key}: {value}" for key, value in info.items()]
