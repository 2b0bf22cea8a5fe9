"""Per-phase timing and memory peaks of a run."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, Iterator

from tamrun.device import DeviceManager


@dataclass
class PhaseRecord:
    seconds: float
    peak_bytes: int  # peak since the phase began (peak RSS on the CPU, max allocated on CUDA)
    start_bytes: int  # held when the phase began


@dataclass
class PhaseRecorder:
    """``with recorder.phase("fit"): ...`` records the phase's wall time and memory peak."""

    devices: DeviceManager
    phases: Dict[str, PhaseRecord] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.devices.synchronize()
        self.devices.reset_peak()
        start_bytes = self.devices.allocated()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.devices.synchronize()
            self.phases[name] = PhaseRecord(time.perf_counter() - began, self.devices.peak(), start_bytes)

    def metrics(self) -> Dict[str, float]:
        """``<phase>_seconds`` and ``peak_memory_<phase>_bytes`` for every phase, plus the overall peak."""
        out: Dict[str, float] = {}
        for name, rec in self.phases.items():
            out[f"{name}_seconds"] = rec.seconds
            out[f"peak_memory_{name}_bytes"] = rec.peak_bytes
        if self.phases:
            out["peak_memory_bytes"] = max(r.peak_bytes for r in self.phases.values())
        return out
