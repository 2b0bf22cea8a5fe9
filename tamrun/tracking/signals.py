"""SIGTERM (and SIGHUP) raised as an exception in the main thread, so that a run ends KILLED.

Python already turns SIGINT into `KeyboardInterrupt`; `Terminated` is a `KeyboardInterrupt` too, so
every ``except Exception`` lets it through and the run's context manager sees an interrupt.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator, Sequence

CATCHABLE = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


class Terminated(KeyboardInterrupt):
    """The process received ``signum`` (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")


def exit_code(interrupt: BaseException) -> int:
    """The shell's convention: 128 + the signal's number (SIGINT: 130, SIGTERM: 143)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def _raise(signum: int, frame) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def _handlers(handler, signums: Sequence[int]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # signal.signal works there only
        yield
        return
    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def signals_as_interrupts(signums: Sequence[int] = CATCHABLE):
    """While active, SIGTERM/SIGHUP raise `Terminated` in the main thread."""
    return _handlers(_raise, signums)


def signals_ignored(signums: Sequence[int] = CATCHABLE + (signal.SIGINT,)):
    """While active, SIGINT/SIGTERM/SIGHUP are ignored (a run's end is being recorded)."""
    return _handlers(signal.SIG_IGN, signums)
