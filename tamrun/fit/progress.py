"""Progress of long work (group chunks, CG iterations): a tqdm bar on a terminal, plain log lines
(at most one every ``interval`` seconds, and the last) when stderr is not a TTY (CI, SLURM logs).
Log lines look like

    fit/cg: 30/48 groups, 12 s elapsed, about 7 s left
    CG: 40 iterations, residual 3.2e-05 / tol 1e-06, 31/48 groups converged, about 25 iterations (6 s) left
    CG: 65 iterations, residual 8.10e-07 / tol 1e-06, 48/48 groups converged

The time left of a counted task is its pace so far (`time_left`); a CG solve has no total (it stops at
the tolerance, not at solver.max_iter), so its iterations left are its residual's mean decrease per
iteration so far, extended to the tolerance (`cg_left`)."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Dict, Optional

if TYPE_CHECKING:
    from tamrun.solve.cg import CgProgress

log = logging.getLogger(__name__)


def time_left(done: int, total: Optional[int], elapsed: float) -> str:
    """``, <elapsed> s elapsed, about <left> s left`` at the pace so far; only the elapsed part when the
    total is unknown or nothing is done yet; empty at the end."""
    if total is not None and done >= total:
        return ""
    said = f", {elapsed:.0f} s elapsed"
    if total is None or done <= 0:
        return said
    return f"{said}, about {elapsed * (total - done) / done:.0f} s left"


def cg_left(first: float, residual: float, tol: float, iteration: int, elapsed: float) -> str:
    """``, about <n> iterations (<s> s) left``: log10(residual / tol) over the mean decrease of
    log10(residual) per iteration since ``first`` (the residual at iteration 0); empty when the residual has
    not decreased yet or is at the tolerance."""
    if iteration <= 0 or residual <= tol or first <= residual or residual <= 0:
        return ""
    rate = (math.log10(first) - math.log10(residual)) / iteration
    left = math.ceil((math.log10(residual) - math.log10(tol)) / rate)
    return f", about {left} iterations ({elapsed / iteration * left:.0f} s) left"


def use_bar(mode: str) -> bool:
    """auto: a bar when stderr is a terminal; bar / log / off: as said."""
    return mode == "bar" or (mode == "auto" and sys.stderr.isatty())


class Progress:
    """Counts ``done`` out of ``total`` ``unit``s of ``desc`` (None: open-ended, no ETA);
    ``update(done, note)`` sets the count."""

    def __init__(self, desc: str, total: Optional[int], unit: str, mode: str = "auto",
                 interval: float = 5.0) -> None:
        self.desc, self.total, self.unit, self.interval = desc, total, unit, interval
        self.enabled = mode != "off"
        self.done = 0
        self._start = self._last_log = time.monotonic()
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
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        log.info("%s: %s %s%s%s", self.desc, count, self.unit, f", {note}" if note else "",
                 "" if note else time_left(self.done, self.total, self._last_log - self._start))


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
    """The CG's progress callback (`tamrun.solve.cg.CgProgress`): one open-ended count of iterations per
    solve, noting the worst relative residual against the tolerance and the converged groups; the
    solve's last line is its final state."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.bar: Optional[Progress] = None
        self.note = ""
        self.first, self.started = 0.0, time.monotonic()

    def __call__(self, state: CgProgress) -> None:
        if state.iteration == 0 and not state.final:  # a new solve (the next chunk of groups, or a retry)
            self.close()
            self.bar = Progress("CG", None, "iterations", self.mode)
            self.first, self.started = state.residual, time.monotonic()
        left = "" if state.final else cg_left(self.first, state.residual, state.tol, state.iteration,
                                              time.monotonic() - self.started)
        self.note = (f"residual {state.residual:.2e} / tol {state.tol:g}, "
                     f"{state.converged}/{state.groups} groups converged{left}")
        if self.bar is not None:
            self.bar.update(state.iteration, self.note)
            if state.final:
                self.close()

    def close(self) -> None:
        """Log the open solve's last state (if any) and end its bar."""
        if self.bar is not None:
            self.bar.close(self.note)
            self.bar = None
