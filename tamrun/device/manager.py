"""DeviceManager: picks the device, probes its capabilities, reads its memory.

Created by the runner from ``cfg.hw`` and passed to the parts that need it; there is no module-level
instance and nothing happens at import.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import psutil
import torch

from tamrun.errors import ConfigError, DeviceError
from tamrun.machine.gpu import GpuMemory, is_device_oom, read_gpu_memory
from tamrun.memory.guard import error_text, unplanned_oom_refused
from tamrun.machine.limits import Limit, binding_limit
from tamrun.machine.placement import CHECK_DEVICE, HOST, PlacementCheck
from tamrun.machine.threads import Threads, job_threads

log = logging.getLogger(__name__)


def device_available(kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def resolved_kind(requested: str, preference: Sequence[str]) -> str:
    """The device kind a run asking for ``requested`` computes on: the first available of ``preference``
    for ``auto``, else ``requested`` itself (`DeviceManager` refuses it when it is absent)."""
    if requested == "auto":
        return next((k for k in preference if device_available(k)), "cpu")
    return requested


def _read_status_kib(field: str) -> Optional[int]:
    """A ``VmXXX`` line of /proc/self/status, in bytes (Linux only)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# Device kinds whose backend has no float64 tensors.
NO_FLOAT64 = ("mps",)


def require_dtype(kind: str, dtype: torch.dtype) -> None:
    """`DeviceError` naming ``dtype`` when device ``kind`` cannot hold ``dtype``."""
    if kind in NO_FLOAT64 and dtype == torch.float64:
        raise DeviceError("dtype", "float64", f"the {kind.upper()} backend has no float64 support",
                          f"use dtype=float32 with hw={kind}, or hw=cpu")


# What torch says when deterministic algorithms are on and an operation has no such kernel.
NO_DETERMINISTIC_KERNEL = "does not have a deterministic implementation"


@contextmanager
def deterministic_algorithms(device: torch.device) -> Iterator[None]:
    """torch's deterministic algorithms while the run computes (CUDA's float ``index_add_`` otherwise sums
    with atomics in a varying order; tamrun's leaf sums follow the switch, `tamrun.effects.indexed`),
    the process's previous setting restored after; cuBLAS needs a fixed workspace, set before its first
    use. torch's RuntimeError for an operation without a deterministic kernel becomes a `ConfigError`
    naming hw.deterministic and the operation (exit 2): a run that cannot repeat bitwise is refused,
    never finished as if it did."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    log.info("deterministic algorithms on (hw.deterministic=true)")
    try:
        yield
    except RuntimeError as exc:
        if NO_DETERMINISTIC_KERNEL not in str(exc):
            raise
        operation = str(exc).split(NO_DETERMINISTIC_KERNEL)[0].strip() or "an operation"
        raise ConfigError("hw.deterministic", True, f"{operation} has no deterministic kernel on {device}, so this "
                          "run cannot repeat bitwise", "set hw.deterministic=false (runs then agree to about "
                          "1e-10), or run on the CPU (hw=cpu), which repeats bitwise") from None
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def compute_device(kind: str, check_placement: bool = False) -> torch.device:
    """The compute device of ``kind``, always with an index (torch.cuda's calls need one): the current
    CUDA / XPU device, ``mps:0``; on the CPU the host itself, or `CHECK_DEVICE` (``cpu:0``) under
    hw.check_placement."""
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    if kind == "xpu":
        return torch.device("xpu", torch.xpu.current_device())
    if kind == "mps":
        return torch.device("mps", 0)
    return CHECK_DEVICE if check_placement else HOST


def warm_libraries(device: torch.device, dtype: torch.dtype) -> None:
    """Run each dense GPU library call a fit makes once on a few KiB: the first use of cuBLAS and cuSOLVER
    creates their handles and loads their kernels (fourier's first fit in a process took 0.58 s on an H200,
    0.14 s with this warm-up, 0.06 s warm). Products, batched products, Cholesky, triangular and general
    solves, inverses, the scatters and sorts of the forests and the reductions of CG. No sparse product:
    building a CSR tensor off the main thread made torch warn on the terminal (its sparse invariant
    checks, on an H200), and the warning filters cannot be changed from a thread safely."""
    a = torch.linspace(0, 1, 2 * 32 * 32, dtype=dtype, device=device).view(2, 32, 32)  # no random draw: the
    spd = a @ a.mT + 32 * torch.eye(32, dtype=dtype, device=device)  # run's random state stays as it was
    b = torch.linspace(-1, 1, 2 * 32, dtype=dtype, device=device).view(2, 32, 1)
    factor, _ = torch.linalg.cholesky_ex(spd)
    torch.linalg.solve_triangular(factor, b, upper=False)
    torch.cholesky_inverse(factor)
    torch.linalg.solve(spd, b)
    torch.matmul(a, b).squeeze(-1).sum(-1)
    a[0] @ b[0]
    index = torch.arange(64, device=device) * 5 % 8
    sorted_index = torch.sort(index, stable=True).values
    torch.searchsorted(sorted_index, index)
    torch.cumsum(torch.bincount(index, minlength=8), 0)
    torch.zeros(8, dtype=dtype, device=device).index_add_(0, index, torch.ones(64, dtype=dtype, device=device))
    float(torch.linalg.vector_norm(a, dim=-1).max())  # waits for the device (a synchronisation on any device)


@contextmanager
def libraries_warming(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """`warm_libraries` in a thread while the block runs (its first part reads the data), joined when it
    ends; a failure there is logged and left to the fit, which makes the same calls."""
    def warm() -> None:
        try:
            warm_libraries(device, dtype)
        except Exception as exc:  # the fit meets the same problem and reports it
            log.debug("warming the GPU libraries failed: %s", exc)

    thread = threading.Thread(target=warm, name="tamrun-gpu-warm-up", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


@dataclass
class MemoryView:
    """The device's memory in bytes: ``free`` (what new tensors can still take), ``total``, and
    ``held``: what this process already holds that memory.limit counts (allocated tensors on a GPU;
    0 on the CPU, where the limit bounds the working memory, not the data); ``bound``: the limit
    ``free`` was read under (None: the device's free memory)."""

    free: int
    total: int
    held: int = 0
    bound: Optional[Limit] = None


class DeviceManager:
    """The compute device of one run.

    Args:
        requested: ``auto`` (first available of ``preference``) or a device kind; an explicit kind
            that is absent raises `DeviceError` (no silent fallback).
        preference: order tried by ``auto``.
        dtype: the run's dtype, checked against the device's capabilities.
        threads: torch intra-op threads on the CPU and why (`tamrun.machine.threads.resolve_threads`; None:
            torch's setting is left as it is); ``self.threads`` is what was applied (None off the CPU).
        deterministic: torch's deterministic algorithms in `session` (see `deterministic_algorithms`).
        check_placement: on the CPU, compute on `CHECK_DEVICE` under a `PlacementCheck` (`session`).

    ``device`` is the compute device, with its index (`compute_device`); every ``torch.cuda`` call
    here passes it.
    """

    def __init__(self, requested: str = "auto", preference: Sequence[str] = ("cuda", "mps", "xpu", "cpu"),
                 dtype: torch.dtype = torch.float64, threads: Optional[Threads] = None,
                 deterministic: bool = False, check_placement: bool = False) -> None:
        kind = resolved_kind(requested, preference)
        if not device_available(kind):
            raise DeviceError("hw", requested, f"no {requested} device is available on this machine",
                              "use hw=auto or hw=cpu, or run on a machine with that device")
        self.kind = kind
        self.check = PlacementCheck() if check_placement and kind == "cpu" else None
        self.device = compute_device(kind, self.check is not None)
        if kind == "cuda":
            self._open_context()
        self.deterministic = deterministic
        require_dtype(kind, dtype)
        self.dtype = dtype
        self.threads = threads if kind == "cpu" else None
        if self.threads is not None:
            torch.set_num_threads(self.threads.count)
            log.info("threads: %d (%s)", self.threads.count, self.threads.reason)
        log.info("device: %s (%s%s)", self.name, kind, ", placement checked" if self.check else "")

    @classmethod
    def from_config(cls, hw, dtype: torch.dtype) -> "DeviceManager":
        """From the ``hw`` config group (device, preference, threads) and the run's dtype; the threads
        by `tamrun.machine.threads.job_threads` (hw.threads, else the CPUs a job of this process's Hydra
        multirun has, else all usable cores; at most OMP_NUM_THREADS)."""
        return cls(hw.device.value, hw.preference, dtype, job_threads(hw.threads), hw.deterministic,
                   hw.check_placement)

    def _open_context(self) -> None:
        """Create this process's CUDA context now (about 500 MiB of the GPU), so that a GPU too full for
        it is refused at once, naming the GPU's memory (`tamrun.machine.gpu`), not at the first tensor."""
        try:
            torch.cuda.mem_get_info(self.device)
        except RuntimeError as exc:
            if not is_device_oom(exc):
                raise
            raise self.gpu_memory().out_of_memory("creating this process's CUDA context", error_text(exc)) from None

    def gpu_memory(self) -> GpuMemory:
        """What the GPU holds now: free and total, other processes, this process's context and tensors."""
        return read_gpu_memory(self.device)

    def oom_refused(self, margin: int):
        """`unplanned_oom_refused` for this device: a GPU's out-of-memory names the GPU's memory."""
        return unplanned_oom_refused(margin, self.gpu_memory if self.kind == "cuda" else None)

    @contextmanager
    def session(self) -> Iterator[None]:
        """The context a run computes in: the `PlacementCheck` under hw.check_placement, an operation
        without a deterministic kernel refused as a `ConfigError` under hw.deterministic, and on CUDA the
        allocator's cap (memory.limit, `enforce_limit`) lifted at the end and the GPU libraries warmed
        while the data loads (`libraries_warming`)."""
        with ExitStack() as stack:
            if self.kind == "cuda":
                stack.callback(self.enforce_limit, None)
                stack.enter_context(libraries_warming(self.device, self.dtype))
            if self.deterministic:
                stack.enter_context(deterministic_algorithms(self.device))
            if self.check is not None:
                stack.enter_context(self.check)
            yield

    @contextmanager
    def serial(self) -> Iterator[None]:
        """One intra-op thread on the CPU for a recursion of small operations (the Kalman filters' days, the
        aggregation's): their tensors are too small to share, and with two threads on a busy CPU each
        operation waits for the other thread to be scheduled (a Kalman burn-in, 48 groups x 6 pairs x 4,017
        days, 2 cores at load 8-10: 3-4 s with one thread, 40-67 s with two spinning ones, OpenMP's default;
        at load 4.5 with OMP_WAIT_POLICY=PASSIVE, 1.1 s against 1.0 s). The
        run's count comes back after; nothing changes off the CPU."""
        if self.kind != "cpu":
            yield
            return
        count = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(count)

    @property
    def name(self) -> str:
        """Human-readable device name (GPU model or CPU brand)."""
        if self.kind == "cuda":
            return torch.cuda.get_device_name(self.device)
        if self.kind == "cpu":
            import platform

            return f"cpu ({platform.processor() or platform.machine()}, {psutil.cpu_count()} cores)"
        return self.kind

    def memory(self, margin: int = 0, reserve: int = 0) -> MemoryView:
        """Free/total bytes of the device, as the oracle caps them with memory.limit.

        CUDA: free = device free + reserved - allocated (mem_get_info does not see PyTorch's
        cached-but-free blocks), held = allocated. CPU: what is left under the tightest real limit
        (cgroup, RLIMIT_AS, RLIMIT_DATA, available RAM; `tamrun.machine.limits`) less ``margin``
        (memory.safety_margin) and ``reserve`` (what the run records after its fit: host memory, so a
        GPU's view ignores it), held = 0.
        """
        if self.kind == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            allocated = torch.cuda.memory_allocated(self.device)
            free = int(free + torch.cuda.memory_reserved(self.device) - allocated)
            return MemoryView(free=max(0, free), total=int(total), held=int(allocated))
        bound = binding_limit(margin, reserve)
        return MemoryView(free=bound.left, total=int(psutil.virtual_memory().total), bound=bound)

    def allocated(self) -> int:
        """Bytes held now: tensors on CUDA, the process's resident set on the CPU."""
        if self.kind == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return int(psutil.Process().memory_info().rss)

    def reserved(self) -> int:
        """Bytes reserved by the allocator: PyTorch's cache on CUDA, the resident set on the CPU."""
        if self.kind == "cuda":
            return int(torch.cuda.memory_reserved(self.device))
        return self.allocated()

    @property
    def allocator_peaks(self) -> bool:
        """The device's allocator keeps the peak of its tensor bytes (CUDA): a metered phase reads it
        instead of running the tensor meter's hook on every operation."""
        return self.kind == "cuda"

    def reset_peak(self) -> None:
        """Start a new peak window (CUDA: peak allocated; Linux CPU: the VmHWM high-water mark)."""
        if self.kind == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif sys.platform.startswith("linux"):
            try:
                with open("/proc/self/clear_refs", "w") as refs:
                    refs.write("5")
            except OSError:
                log.debug("cannot reset the RSS high-water mark; the peak covers the whole process")

    def peak(self) -> int:
        """Peak bytes since the last `reset_peak`: max_memory_allocated on CUDA, peak RSS on the CPU."""
        if self.kind == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        hwm = _read_status_kib("VmHWM")
        if hwm is not None:
            return hwm
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)

    def empty_cache(self) -> None:
        """Return cached blocks to the device (no-op on the CPU)."""
        if self.kind == "cuda":
            torch.cuda.empty_cache()
        elif self.kind == "mps":
            torch.mps.empty_cache()
        elif self.kind == "xpu":
            torch.xpu.empty_cache()

    def synchronize(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)

    def enforce_limit(self, limit_bytes: Optional[int]) -> None:
        """On CUDA, make the allocator itself refuse more than memory.limit (set_per_process_memory_fraction;
        no limit: the whole device, so that a cap of an earlier run in this process does not hold);
        elsewhere nothing: the oracle's plan and the tracker keep the run under it. The cap is the run's:
        `session` lifts it when the run ends (a sweep's jobs in one process, tests)."""
        if self.kind != "cuda":
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        fraction = 1.0 if limit_bytes is None else min(1.0, limit_bytes / total)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
