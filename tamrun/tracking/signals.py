"""Signals as interrupts, and never in the middle of a store call.

While a run is open, SIGTERM and SIGHUP raise `Terminated`, a `KeyboardInterrupt` (Python already turns
SIGINT into one), so every ``except Exception`` lets it through and the run's context manager sees an
interrupt. A signal must not explode inside SQLAlchemy or a half-copied artifact, though: inside
`signals_deferred` (every `MlflowClient` call made through `SignalSafe`, the opening and the end of a
run) SIGINT, SIGTERM and SIGHUP are recorded and raised when the block ends, once the I/O is complete.
A wait that changes nothing (the store's lock) stays `interruptible`. A signal the process ignores
(nohup's SIGHUP) stays ignored.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Sequence, Tuple

CATCHABLE = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
ALL = CATCHABLE + (signal.SIGINT,)


class Terminated(KeyboardInterrupt):
    """The process received ``signum`` (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")

    def __reduce__(self) -> Tuple[Any, ...]:
        """Pickled with its signal number and attributes (Exception's own pickling would call ``cls(message)``)."""
        return type(self), (self.signum,), dict(self.__dict__)


def exit_code(interrupt: BaseException) -> int:
    """The shell's convention: 128 + the signal's number (SIGINT: 130, SIGTERM: 143)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def interrupt(signum: int) -> KeyboardInterrupt:
    """The exception signal ``signum`` raises: KeyboardInterrupt for SIGINT, else `Terminated`."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raise(signum: int, frame) -> None:
    raise Terminated(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal.signal works there only


@contextlib.contextmanager
def _handlers(handler, signums: Sequence[int]) -> Iterator[None]:
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in signums if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def signals_as_interrupts(signums: Sequence[int] = CATCHABLE):
    """While active, SIGTERM/SIGHUP raise `Terminated` in the main thread."""
    return _handlers(_raise, signums)


def signals_ignored(signums: Sequence[int] = ALL):
    """While active, SIGINT/SIGTERM/SIGHUP are ignored."""
    return _handlers(signal.SIG_IGN, signums)


class Deferral:
    """What a `signals_deferred` block recorded: ``received``, the first signal (None: none yet)."""

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self.waiting = 0  # > 0 inside an `interruptible` wait


_ACTIVE: List[Deferral] = []  # the outermost block's record, shared by nested blocks


def _record(signum: int, frame) -> None:
    deferral = _ACTIVE[0] if _ACTIVE else None
    if deferral is None or deferral.waiting:
        raise interrupt(signum)
    if deferral.received is None:
        deferral.received = signum


@contextlib.contextmanager
def signals_deferred(reraise: bool = True) -> Iterator[Deferral]:
    """While active, SIGINT/SIGTERM/SIGHUP are recorded, not raised, so the I/O inside completes. When
    the outermost block ends the first one is raised as its interrupt, also over an exception the block
    raised (``reraise=False``: dropped, the caller acted on ``Deferral.received``)."""
    if _ACTIVE or not _main_thread():
        yield _ACTIVE[0] if _ACTIVE else Deferral()
        return
    deferral = Deferral()
    _ACTIVE.append(deferral)
    try:
        with _handlers(_record, ALL):
            yield deferral
    except Exception as error:
        if reraise and deferral.received is not None:
            raise interrupt(deferral.received) from error
        raise
    finally:
        _ACTIVE.clear()
    if reraise and deferral.received is not None:
        raise interrupt(deferral.received)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside `signals_deferred`, a wait that changes nothing (a lock's): a signal recorded before it is
    raised now, one during it at once. Elsewhere a no-op."""
    deferral = _ACTIVE[0] if _ACTIVE and _main_thread() else None
    if deferral is None:
        yield
        return
    if deferral.received is not None:
        signum, deferral.received = deferral.received, None
        raise interrupt(signum)
    deferral.waiting += 1
    try:
        yield
    finally:
        deferral.waiting -= 1


class SignalSafe:
    """``target`` (an `MlflowClient`) with every method call inside `signals_deferred`: a store call
    completes, then the signal that arrived meanwhile is raised. ``around(name)``, when given, is a
    context every call also runs in (`tamrun.tracking.store.store_wait.StoreWatch.call`)."""

    def __init__(self, target: Any, around: Optional[Callable[[str], ContextManager[Any]]] = None) -> None:
        self.target = target
        self.around = around or (lambda name: contextlib.nullcontext())

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def deferred(*args, **kwargs):
            with signals_deferred(), self.around(name):
                return value(*args, **kwargs)

        return deferred
