"""What a GPU's memory holds, for the message of a run that does not fit on it.

    total = free + other processes' use + this process's (CUDA context + PyTorch's reserved blocks)

Read from torch (``mem_get_info``, which needs this process's CUDA context) and, for the other
processes and the context itself, from ``nvidia-smi`` (no context needed: it also answers when the
context could not be created). A figure nothing could read is None and left out of the message.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from tamrun.errors import MemoryBudgetError
from tamrun.config.units import format_size

log = logging.getLogger(__name__)

MIB = 2**20
# What creating a CUDA context costs on a recent NVIDIA GPU (about 500 MiB measured on an H100 with
# torch 2.11, lazy module loading), said when the context itself could not be created.
CUDA_CONTEXT_ESTIMATE = 512 * MIB
NVIDIA_SMI_TIMEOUT_S = 10
GPU_FIX = ("free the GPU (nvidia-smi lists the processes that hold its memory), or run on the CPU with hw=cpu; "
           "memory.limit bounds this run's tensors, not what other processes hold")


@dataclass
class GpuMemory:
    """A GPU's memory in bytes (None: unread): ``free`` and ``total``; ``others``: (pid, bytes) of the other
    processes on it; ``context``: this process's CUDA context (its use less PyTorch's reserved blocks);
    ``tensors``: what this process's tensors take."""

    name: str
    free: Optional[int] = None
    total: Optional[int] = None
    others: List[Tuple[int, int]] = field(default_factory=list)
    context: Optional[int] = None
    tensors: Optional[int] = None

    def describe(self) -> str:
        """One sentence: free of total, the other processes' share, this process's context and tensors."""
        parts = [f"the GPU {self.name}" + (f" has {format_size(self.free)} free of {format_size(self.total)}"
                                           if self.free is not None and self.total is not None else "")]
        if self.others:
            held = sum(nbytes for _, nbytes in self.others)
            listed = ", ".join(f"pid {pid}: {format_size(nbytes)}" for pid, nbytes in self.others[:5])
            parts.append(f"other processes hold {format_size(held)} ({listed})")
        if self.context is not None:
            parts.append(f"this process's CUDA context takes {format_size(self.context)}")
        else:
            parts.append(f"a CUDA context takes about {format_size(CUDA_CONTEXT_ESTIMATE)} before any tensor")
        if self.tensors is not None:
            parts.append(f"its tensors {format_size(self.tensors)}")
        return "; ".join(parts)

    def out_of_memory(self, where: str, error: str) -> MemoryBudgetError:
        """The run's refusal (exit 2): ``where`` it ran out (a phase), ``error`` the allocator's words."""
        value = (f"{format_size(self.free)} free of {format_size(self.total)}"
                 if self.free is not None and self.total is not None else "unknown")
        return MemoryBudgetError("GPU memory", value, f"out of GPU memory {where} ({error}): {self.describe()}",
                                 GPU_FIX)


def nvidia_smi(*query: str) -> List[List[str]]:
    """Rows of ``nvidia-smi --query-...=... --format=csv,noheader,nounits`` ([] without the tool)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        out = subprocess.run([tool, *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("nvidia-smi did not answer (%s)", exc)
        return []
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def processes_on_gpu() -> List[Tuple[int, int]]:
    """(pid, bytes) of every compute process nvidia-smi sees (all GPUs of the machine: nvidia-smi names
    processes by GPU UUID, which torch does not give for every version)."""
    rows = nvidia_smi("--query-compute-apps=pid,used_memory")
    return [(int(pid), int(float(used)) * MIB) for pid, used in (row[:2] for row in rows if len(row) >= 2)
            if pid.isdigit() and used.replace(".", "", 1).isdigit()]


def read_gpu_memory(device: torch.device) -> GpuMemory:
    """What ``device`` (indexed) holds now, as far as torch and nvidia-smi can tell."""
    memory = GpuMemory(torch.cuda.get_device_name(device))
    try:
        free, total = torch.cuda.mem_get_info(device)
        memory.free, memory.total = int(free), int(total)
        memory.tensors = int(torch.cuda.memory_allocated(device))
    except RuntimeError as exc:  # no context: it could not be created
        log.debug("torch could not read the GPU's memory (%s)", exc)
        total = torch.cuda.get_device_properties(device).total_memory
        used = sum(nbytes for _, nbytes in processes_on_gpu())
        memory.total, memory.free = int(total), max(0, int(total) - used) if used else None
    processes = processes_on_gpu()
    memory.others = [(pid, nbytes) for pid, nbytes in processes if pid != os.getpid()]
    own = [nbytes for pid, nbytes in processes if pid == os.getpid()]
    if own and memory.tensors is not None:
        memory.context = max(0, own[0] - int(torch.cuda.memory_reserved(device)))
    return memory


def is_device_oom(exc: BaseException) -> bool:
    """Whether an out-of-memory error is a GPU's: torch's OutOfMemoryError (CUDA's allocator) or an
    accelerator error saying so ("CUDA error: out of memory" when a context or a library's workspace
    cannot be created)."""
    text = str(exc).lower()
    return isinstance(exc, torch.OutOfMemoryError) or ("out of memory" in text and ("cuda" in text or
                                                                                     "accelerator" in text))
