"""Progress of long work (group chunks, CG iterations): a tqdm bar on a terminal, plain log lines
(at most one every ``interval`` seconds, and the last) when stderr is not a TTY (CI, SLURM logs)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Dict, Optional

log = logging.getLogger(__name__)


def use_bar(mode: str) -> bool:
    """auto: a bar when stderr is a terminal; bar / log / off: as said."""
    return mode == "bar" or (mode == "auto" and sys.stderr.isatty())


class Progress:
    """Counts ``done`` out of ``total`` ``unit``s of ``desc``; ``update(done, note)`` sets the count."""

    def __init__(self, desc: str, total: int, unit: str, mode: str = "auto", interval: float = 5.0) -> None:
        self.desc, self.total, self.unit, self.interval = desc, total, unit, interval
        self.enabled = mode != "off"
        self.done = 0
        self._last_log = time.monotonic()
        self._bar = None
        if self.enabled and use_bar(mode):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        step, self.done = done - self.done, done
        if self._bar is not None:
            self._bar.update(step)
            if note:
                self._bar.set_postfix_str(note, refresh=False)
        elif time.monotonic() - self._last_log >= self.interval:
            self._log(note)

    def close(self, note: str = "") -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled:
            self._log(note)
            self.enabled = False

    def _log(self, note: str) -> None:
        self._last_log = time.monotonic()
        log.info("%s: %d/%d %s%s", self.desc, self.done, self.total, self.unit, f" ({note})" if note else "")


class ChunkProgress:
    """The chunk loop's progress callback ``(phase, done, total)`` (`tamrun.memory.guard.ProgressCallback`):
    one `Progress` of ``unit`` per phase, closed when the phase is done."""

    def __init__(self, mode: str, unit: str = "groups") -> None:
        self.mode, self.unit = mode, unit
        self.bars: Dict[str, Progress] = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        bar = self.bars.get(phase) or self.bars.setdefault(phase, Progress(phase, total, self.unit, self.mode))
        bar.update(done)
        if done >= total:
            bar.close()
            self.bars.pop(phase)


class IterationProgress:
    """A CG iteration callback ``(iteration, worst relative residual)`` over at most ``max_iter``."""

    def __init__(self, max_iter: int, mode: str) -> None:
        self.max_iter, self.mode = max_iter, mode
        self.bar: Optional[Progress] = None
        self.last = float("nan")

    def __call__(self, iteration: int, residual: float) -> None:
        self.last = residual
        if self.bar is None or iteration < self.bar.done:  # a new CG solve (the next chunk of groups)
            self.close()
            self.bar = Progress("CG", self.max_iter, "iterations", self.mode)
        self.bar.update(iteration, f"residual {residual:.2e}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close(f"residual {self.last:.2e}")
            self.bar = None
