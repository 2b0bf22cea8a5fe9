"""Phase timing, memory snapshots and per-phase peaks of a run.

A phase records its wall time, the memory held when it began and the peak reached during it (peak
RSS on the CPU via the Linux high-water mark, reset at the phase start; max_memory_allocated on
CUDA), and, when metered, the peak of the tensor bytes it created: its working peak. The tensor
meter counts it (`TensorMeter`, repeated work counted once: `tamrun.machine.sampling`), except on a
device whose allocator keeps its own peak (CUDA), where it is the allocator's peak above the phase's
start and no operation goes through Python. Snapshots (time, phase, label, allocated, reserved,
free) feed the memory timeline.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional

from tamrun.device.manager import DeviceManager
from tamrun.memory.meter import TensorMeter


@dataclass
class PhaseRecord:
    seconds: float
    start_bytes: int  # held when the phase began (RSS on the CPU, allocated on CUDA)
    peak_bytes: int  # peak during the phase (absolute)
    tensor_peak: int = -1  # peak of the tensor bytes the phase created (-1: not metered)

    @property
    def working_peak(self) -> int:
        """The metered tensor peak, else the peak above what was held when the phase began."""
        return self.tensor_peak if self.tensor_peak >= 0 else max(0, self.peak_bytes - self.start_bytes)


@dataclass
class Snapshot:
    seconds: float  # since the recorder was created
    phase: str
    label: str
    allocated: int
    reserved: int
    free: int
    working: int = -1  # peak tensor bytes since the previous snapshot (metered phases; CUDA: since the phase began)

    @property
    def utilisation(self) -> float:
        """allocated / (allocated + free)."""
        return self.allocated / max(1, self.allocated + self.free)


@dataclass
class PhaseRecorder:
    """``with recorder.phase("solve"): ...`` records a phase; ``recorder.snapshot(label)`` a point.
    ``sample``: the tensor meter counts repeated work once (memory.meter_sampling)."""

    devices: DeviceManager
    phases: Dict[str, PhaseRecord] = field(default_factory=dict)
    snapshots: List[Snapshot] = field(default_factory=list)
    current: str = ""
    started: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)  # the same moment, as a time stamp (the data phase's start)
    meter: Optional[TensorMeter] = None
    planning_baseline: int = -1  # held when the plan was made (-1: not planned yet)
    sample: bool = True
    _phase_peak: int = 0
    _allocator_start: int = -1  # a phase metered by the allocator's peak (CUDA): the bytes held as it began

    def snapshot(self, label: str) -> None:
        view = self.devices.memory()
        working = -1
        if self.meter is not None:  # the chunk's peak, then a fresh window for the next one
            working = self.meter.peak
            self._phase_peak = max(self._phase_peak, working)
            self.meter.reset_peak()
        elif self._allocator_start >= 0:  # the allocator's peak since the phase began
            working = max(0, self.devices.peak() - self._allocator_start)
        self.snapshots.append(Snapshot(time.perf_counter() - self.started, self.current, label,
                                       self.devices.allocated(), self.devices.reserved(), view.free, working))

    @contextmanager
    def phase(self, name: str, metered: bool = False) -> Iterator[None]:
        """Record a phase; ``metered`` also measures the tensor bytes it creates (`TensorMeter`, or the
        allocator's peak where it keeps one)."""
        self.devices.synchronize()
        self.devices.reset_peak()
        self.current = name
        start_bytes = self.devices.allocated()
        self.snapshot("begin")
        by_allocator = metered and self.devices.allocator_peaks
        meter = self.meter = TensorMeter(self.sample) if metered and not by_allocator else None
        self._allocator_start = start_bytes if by_allocator else -1
        self._phase_peak = 0
        began = time.perf_counter()
        try:
            if meter is None:
                yield
            else:
                with meter:
                    yield
        finally:
            self.devices.synchronize()
            peak = self.devices.peak()
            tensor_peak = max(meter.peak, self._phase_peak) if meter is not None else -1
            self.phases[name] = PhaseRecord(time.perf_counter() - began, start_bytes, peak,
                                            max(0, peak - start_bytes) if by_allocator else tensor_peak)
            self.snapshot("end")
            self.meter, self._allocator_start = None, -1

    def mark_planning(self) -> None:
        """Record what the process holds as the plan is made: the baseline the plan's budget lies above."""
        self.planning_baseline = self.devices.allocated()

    def peak_after_planning(self, phases: tuple = ("solve", "predict", "evaluate", "record")) -> int:
        """The highest memory held during the phases that follow the plan (absolute; 0 if none ran)."""
        return max((self.phases[p].peak_bytes for p in phases if p in self.phases), default=0)

    def working_peak(self, phases: tuple = ("solve", "predict")) -> int:
        """The largest peak above its phase's start among ``phases`` (the memory the plan governs)."""
        return max((self.phases[p].working_peak for p in phases if p in self.phases), default=0)

    def seconds(self) -> Dict[str, float]:
        """Each phase's seconds, by name."""
        return {name: record.seconds for name, record in self.phases.items()}

    def metrics(self) -> Dict[str, float]:
        """``<phase>_seconds``, ``peak_memory_<phase>_bytes`` (absolute), ``working_peak_<phase>_bytes``; the
        run's peak in bytes and in MiB (``peak_memory_mib``: the figure the runs table and
        `tamrun.compare` show)."""
        out: Dict[str, float] = {}
        for name in self.phases:
            out.update(self.phase_metrics(name))
        if self.phases:
            out["peak_memory_bytes"] = max(r.peak_bytes for r in self.phases.values())
            out["peak_memory_mib"] = out["peak_memory_bytes"] / 2**20
        out["working_peak_bytes"] = self.working_peak()
        if self.planning_baseline >= 0:
            out["planning_baseline_bytes"] = self.planning_baseline
        return out

    def phase_metrics(self, name: str) -> Dict[str, float]:
        """One phase's ``<phase>_seconds``, ``peak_memory_<phase>_bytes``, ``working_peak_<phase>_bytes``."""
        rec = self.phases[name]
        return {f"{name}_seconds": rec.seconds, f"peak_memory_{name}_bytes": rec.peak_bytes,
                f"working_peak_{name}_bytes": rec.working_peak}

    def as_dict(self) -> dict:
        """The phases, the snapshots and ``started_at`` (when the recorder began: `tamrun.bench.e2e` splits
        a command's time with it)."""
        return {"started_at": self.started_at,
                "phases": {k: {**asdict(v), "working_peak": v.working_peak} for k, v in self.phases.items()},
                "snapshots": [asdict(s) for s in self.snapshots]}
