"""One OOM guard for every allocating step: catch by type, free, shrink, back off, retry.

    size_0 = c, size_{i+1} = floor(size_i * size_factor), delay_i = delay_ms * 2^i

The step is re-run outside the ``except`` block (so the failed attempt's tensors can be freed),
each event is recorded, and after ``max_retries`` (or at size 1) a `MemoryBudgetError` names the
memory the step needed and the settings to change. Environment variables OOM_MAX_RETRIES,
OOM_SIZE_FACTOR, OOM_DELAY_MS and OOM_VERBOSE override the config.

`ChunkLoop` is the one loop over chunks of units (groups, windows) that every fit, prediction and
window batch runs through: each chunk is charged its planned footprint to the `MemoryTracker`,
guarded by `retry_on_oom`, then reported to the memory timeline (a snapshot label) and to the
progress callback ``(phase, done, total)`` (a step may report within its chunk: `ChunkLoop.report_within`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, Iterator, List, Optional, Protocol, Tuple, Type, TypeVar

import torch

from tamrun.config.schema import OomConfig, schema_default
from tamrun.errors import ConfigError, MemoryBudgetError
from tamrun.memory.footprint import data_step_bytes
from tamrun.machine.gpu import GPU_FIX, GpuMemory, is_device_oom
from tamrun.machine.host import release_freed_host_memory
from tamrun.machine.limits import HARD, WHAT, Limit, binding_limit
from tamrun.machine.tracker import MemoryTracker
from tamrun.config.units import format_size

log = logging.getLogger(__name__)
T = TypeVar("T")

# Progress of a chunked phase: (phase, units done, units in all).
ProgressCallback = Callable[[str, int, int], None]


# What torch's allocators say when they fail without a dedicated type (lower case): the CPU
# allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory: you tried to allocate ...",
# "... not enough memory ..."), MPS ("MPS backend out of memory") and XPU ("XPU out of memory").
OOM_MESSAGES = ("can't allocate memory", "not enough memory", "out of memory")


def oom_exception_types() -> Tuple[Type[BaseException], ...]:
    """Exception types that can mean out-of-memory on any backend (a RuntimeError only with one of
    `OOM_MESSAGES`, see `is_oom`)."""
    return (torch.OutOfMemoryError, MemoryError, RuntimeError)


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error: torch.OutOfMemoryError and MemoryError (the tracker's
    BudgetExceeded included) by type; a RuntimeError when its message is an allocator's failure
    (`OOM_MESSAGES`: the CPU allocator's "can't allocate memory", "not enough memory", MPS / XPU)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(message in text for message in OOM_MESSAGES)


def error_text(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}"


@contextmanager
def unplanned_oom_refused(margin: int, gpu_memory: Optional[Callable[[], GpuMemory]] = None) -> Iterator[None]:
    """Turn an out-of-memory outside the guarded chunks (loading the data, the features, evaluation,
    recording) into a `MemoryBudgetError` that names the limit binding now (``margin``:
    memory.safety_margin): exit 2 with a message, not a traceback. A GPU's (`is_device_oom`) names the
    GPU's memory instead (``gpu_memory``: what it holds now, read when the error comes)."""
    try:
        yield
    except oom_exception_types() as exc:
        if not is_oom(exc):
            raise
        error = error_text(exc)
        if is_device_oom(exc):  # a GPU's: the process's CPU limits are not what ran out
            if gpu_memory is not None:
                raise gpu_memory().out_of_memory("outside the planned chunks", error) from None
            raise MemoryBudgetError("GPU memory", None, f"out of GPU memory outside the planned chunks ({error})",
                                    GPU_FIX) from None
        bound = binding_limit(margin)
        raise MemoryBudgetError(
            bound.name, format_size(bound.size), f"out of memory outside the planned chunks ({error}) under "
            f"{bound.describe()}",
            f"raise {WHAT.get(bound.name, bound.name)} ({bound.howto}), or raise memory.safety_margin so that the "
            "plan leaves more room outside its chunks") from None


def require_room(bound: Optional[Limit], what: str, need: int = 0) -> None:
    """`MemoryBudgetError` (exit 2) when a hard limit (`HARD`) cannot hold ``what`` before it starts: a
    refusal, not the kernel's kill halfway through it. The step (``need`` bytes at its peak) must fit in
    what is left with the safety margin still free, ``size - used - margin - reserve >= need`` (and
    something left for a step of unknown size): the margin is for what no estimate counts (the
    interpreter, the allocator's arenas, library pages faulted in), not for the step itself."""
    if bound is None or bound.name not in HARD or (bound.left > 0 and bound.left >= need):
        return
    if bound.left == 0:
        reason = f"nothing is left for {what} under {bound.describe()}"
    else:
        reason = f"{what} needs about {format_size(need)} but {format_size(bound.left)} is left under {bound.describe()}"
    raise MemoryBudgetError(bound.name, format_size(bound.size), reason, bound.fix(max(bound.margin, need)))


class RoomCheck(Protocol):
    """A check called between the steps of work no plan covers: ``what`` is the step about to run,
    ``step`` its key in `DATA_STEP_COPIES` and ``nbytes`` the bytes it works on ("" and 0: a step
    the safety margin covers)."""

    def __call__(self, what: str, step: str = "", nbytes: int = 0) -> None: ...


def no_room_check(what: str, step: str = "", nbytes: int = 0) -> None:
    """A `RoomCheck` that checks nothing (tests, tools)."""


@dataclass(frozen=True)
class HostRoomWatch:
    """A `RoomCheck` over the host's real limits: before each step of the unplanned work (each block of
    the data read, its checks, the features) the tightest limit is read again, and `require_room`
    refuses (exit 2) when the step's estimated peak (`data_step_bytes`) does not fit under it with
    ``margin`` (memory.safety_margin) still free: a refusal, not the kernel's kill."""

    margin: int

    def __call__(self, what: str, step: str = "", nbytes: int = 0) -> None:
        release_freed_host_memory()  # the pages the last step freed are not in use: the kernel gets them back
        require_room(binding_limit(self.margin), what, data_step_bytes(step, nbytes) if step else 0)


def oom_settings(cfg: OomConfig, environ: Optional[dict] = None) -> OomConfig:
    """The config's retry settings, overridden by OOM_* environment variables when set."""
    env = os.environ if environ is None else environ
    settings = replace(cfg)
    parsers = {"OOM_MAX_RETRIES": ("max_retries", int), "OOM_SIZE_FACTOR": ("size_factor", float),
               "OOM_DELAY_MS": ("delay_ms", float),
               "OOM_VERBOSE": ("verbose", lambda v: v.strip().lower() not in ("0", "", "false", "no"))}
    for var, (name, parse) in parsers.items():
        if var in env:
            try:
                settings = replace(settings, **{name: parse(env[var])})
            except ValueError:
                raise ConfigError(var, env[var], "not a valid number", f"unset {var} or give a number") from None
    if not 0 < settings.size_factor < 1:
        raise ConfigError("OOM_SIZE_FACTOR", settings.size_factor, "must lie in (0, 1)",
                          f"use {schema_default('memory.oom.size_factor')}")
    if settings.max_retries < 0 or settings.delay_ms < 0:
        raise ConfigError("OOM_MAX_RETRIES/OOM_DELAY_MS", (settings.max_retries, settings.delay_ms),
                          "must be >= 0", f"use {schema_default('memory.oom.max_retries')} and "
                                          f"{schema_default('memory.oom.delay_ms'):g}")
    return settings


@dataclass
class OomEvent:
    phase: str
    attempt: int
    size_before: int
    size_after: int
    delay_ms: float
    error: str


@dataclass
class OomLog:
    """Every OOM event of a run, in order."""

    events: List[OomEvent] = field(default_factory=list)

    @property
    def retries(self) -> int:
        return len(self.events)

    def as_dicts(self) -> List[dict]:
        return [asdict(e) for e in self.events]


def retry_on_oom(step: Callable[[int], T], size: int, policy: OomConfig, phase: str, oom_log: OomLog,
                 free_memory: Callable[[], None] = lambda: None,
                 needed_bytes: Optional[Callable[[int], int]] = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``step(size)``; on OOM shrink ``size`` by ``policy.size_factor`` and retry.

    Args:
        step: the allocating work, parameterised by its chunk size (groups or rows).
        size: the first chunk size to try.
        free_memory: empties the device cache (called after leaving the except block).
        needed_bytes: the oracle's footprint at a chunk size, quoted when giving up.
        sleep: injected for tests (seconds).

    Raises:
        MemoryBudgetError: retries spent or the chunk is already 1.
    """
    attempt = 0
    while True:
        try:
            return step(size)
        except oom_exception_types() as exc:  # noqa: PERF203 - the retry loop is the point
            if not is_oom(exc):
                raise
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        # Out of the except block: the traceback no longer pins the failed attempt's tensors.
        gc.collect()
        free_memory()
        if attempt >= policy.max_retries or size <= 1:
            need = f" about {format_size(needed_bytes(size))}" if needed_bytes else ""
            raise MemoryBudgetError(
                "memory.limit", None,
                f"out of memory in phase '{phase}' at chunk size {size} after {attempt} retries; "
                f"this step needs{need} ({error})",
                "raise memory.limit (or free device memory), lower memory.chunk_fraction_*, "
                "or raise memory.oom.max_retries")
        new_size = max(1, int(math.floor(size * policy.size_factor)))
        delay = policy.delay_ms * (2 ** attempt)
        oom_log.events.append(OomEvent(phase, attempt + 1, size, new_size, delay, error))
        (log.warning if policy.verbose else log.info)(
            "OOM in %s (%s): chunk %d -> %d, retry %d/%d after %.0f ms", phase, error, size, new_size,
            attempt + 1, policy.max_retries, delay)
        sleep(delay / 1000.0)
        size, attempt = new_size, attempt + 1


class ChunkCost(Protocol):
    """A chunk's planned footprint: ``bytes(units, rows, overhead)``."""

    def bytes(self, units: int, rows: int, overhead: float) -> int: ...


def no_snapshot(label: str) -> None:
    """A memory-timeline callback that records nothing."""


def no_progress(phase: str, done: int, total: int) -> None:
    """A progress callback that reports nothing."""


class ChunkLoop:
    """Runs ``step(start, size)`` over ``total`` units in chunks, each under the tracker and the OOM
    guard; the chunk size an OOM taught a phase is kept for that phase's next call.

    Args:
        policy, oom_log: the retry settings (`oom_settings`) and the run's OOM event log.
        tracker: the budget each chunk is charged to (its overhead factor also prices the chunk
            quoted when the guard gives up).
        free_memory: empties the device's cache after an OOM.
        snapshot: called with a label after each chunk (the memory timeline).
        progress: called with (phase, done, total) after each chunk.
        release: called after each chunk to return its freed host memory (`release_freed_host_memory`).
    """

    def __init__(self, policy: OomConfig, oom_log: OomLog, tracker: MemoryTracker,
                 free_memory: Callable[[], None] = lambda: None, snapshot: Callable[[str], None] = no_snapshot,
                 progress: ProgressCallback = no_progress, release: Callable[[], None] = lambda: None) -> None:
        self.policy, self.oom_log, self.tracker = policy, oom_log, tracker
        self.free_memory, self.snapshot, self.progress, self.release = free_memory, snapshot, progress, release
        self.learned: Dict[str, int] = {}  # phase -> the chunk size an OOM taught

    def run(self, step: Callable[[int, int], None], total: int, chunk: int, phase: str, cost: ChunkCost,
            rows: int = 0, unit: str = "groups", label: str = "") -> int:
        """Run ``step`` over ``total`` units starting with chunks of ``chunk``, each charged
        ``cost.bytes(size, rows, 1.0)``; returns the chunk size that was kept. ``label`` names the
        chunks in the progress and the timeline (default: ``phase``, which keys the learned chunk size)."""
        chunk = min(chunk, self.learned.get(phase, chunk))
        label = label or phase
        start = 0
        while start < total:
            def attempt(size: int, start: int = start) -> Tuple[int, int]:
                take = min(size, total - start)
                with self.tracker.hold(cost.bytes(take, rows, 1.0), f"{label} of {take} {unit}"):
                    step(start, take)
                self.release()
                self.snapshot(f"{label} {unit} {start}..{start + take - 1}")
                self.progress(label, start + take, total)
                return take, size

            done, chunk = retry_on_oom(attempt, chunk, self.policy, phase, self.oom_log, free_memory=self.free_memory,
                                       needed_bytes=lambda size: cost.bytes(size, rows, self.tracker.overhead_factor))
            start += done
        self.learned[phase] = chunk
        return chunk

    def report_within(self, phase: str, done: int, total: int) -> None:
        """Progress from inside a chunk (a CG solve's converged groups), passed on while ``done`` is
        below ``total``: the chunk's own report ends the phase."""
        if done < total:
            self.progress(phase, done, total)
