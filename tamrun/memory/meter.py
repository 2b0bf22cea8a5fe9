"""TensorMeter: the exact peak of tensor bytes created inside a block, on any device.

Process RSS cannot tell a run's working memory apart (the C allocator recycles freed heap blocks
without growing the resident set). This meter sees every ATen operation through a TorchDispatchMode,
charges each new storage it creates, drops the charge when the storage is freed, and keeps the
high-water mark:

    live(t) = sum of nbytes of the storages created since the block began and still alive at t
    peak    = max over the operations of live(t)

Tensors that existed before the block (the data) are not counted: the peak is the working memory.
The freed storages are found lazily: an operation adds its new storages to an upper bound of live
(deaths not yet seen); only when that bound passes the peak are the charged storages swept for the
freed ones. Sweeping only lowers live, so a bound at or below the peak cannot raise it: the peak is
exact, and a loop of many small operations does not pay one sweep of every charged storage per
operation. An operation whose every result aliases an input (a view, an in-place update) creates
nothing and is passed through at once.

The hook costs Python work per operation, so the meter counts repeated work once
(`tamrun.machine.sampling`): the first block of each key is metered and its rise kept, a later block of
that key runs without the hook and is charged that rise above the bytes alive when it began;
``steady()`` takes the hook off until the innermost block ends. The peak stays exact as long as the
blocks of a key allocate alike; ``TensorMeter(sample=False)`` meters every operation (the check).
On CUDA the allocator's own peak statistics replace the meter (`tamrun.device.profiler`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Hashable, Iterator, List, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from tamrun.memory.guard import is_oom
from tamrun.machine.sampling import ACTIVE

log = logging.getLogger(__name__)


@dataclass
class Scope:
    """An open metered block: whether `TensorMeter.steady` took the hook off in it, and the bytes that
    repeated blocks inside it kept (counted as alive until it ends)."""

    paused: bool = False
    kept: int = 0


@dataclass(frozen=True)
class Rise:
    """A metered block: its extent, its peak above the bytes alive as it began, and what it kept."""

    size: int
    rise: int
    kept: int


def creates_storage(func) -> bool:
    """True when some result of the ATen operation ``func`` is a tensor that aliases no input (its
    schema's return without alias annotation): views, in-place and ``out=`` forms create nothing."""
    return any(ret.alias_info is None and "Tensor" in str(ret.type) for ret in func._schema.returns)


class TensorMeter(TorchDispatchMode):
    """``with TensorMeter() as meter: ...`` then ``meter.peak`` (bytes); ``meter.live`` is current.
    ``sample``: count repeated blocks once (`tamrun.machine.sampling`); False meters every operation.
    ``device_type``: count only the storages on devices of that type ("cuda"); None: every device."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would otherwise wrap `__torch_dispatch__` in ``torch._dynamo.disable``, whose
        first call imports torch._dynamo (about 68 MiB and a second or more); tamrun never compiles,
        so there is nothing for dynamo to skip. (TorchDispatchMode's documented opt-out.)"""
        return False

    def __init__(self, sample: bool = True, device_type: Optional[str] = None) -> None:
        super().__init__()
        self.sample, self.device_type = sample, device_type
        self._storages: Dict[Tuple[torch.device, int], Tuple[StorageWeakRef, int]] = {}
        self._bound = 0  # live plus the bytes of charged storages freed since the last sweep
        self.peak = 0
        self._creates: Dict[object, bool] = {}  # operation -> creates_storage
        self._rises: Dict[Hashable, Rise] = {}  # block key -> what its metered block rose and kept
        self._scopes: List[Scope] = []  # the open metered blocks
        self._paused = False
        self._token = None

    def __enter__(self):
        self._token = ACTIVE.set(self)
        return super().__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            if not self._paused:  # a pause has already left the mode stack
                return super().__exit__(exc_type, exc_value, traceback)
            return None
        finally:
            ACTIVE.reset(self._token)
            # Release the weak references now: one left to the interpreter's exit (a run ended by a signal
            # keeps its frames) fails in torch's StorageWeakRef.__del__ with a traceback once torch is torn down.
            self._storages.clear()
            self._bound, self._paused = 0, False
            self._scopes.clear()

    @property
    def live(self) -> int:
        """The bytes of the charged storages alive now."""
        self._sweep()
        return self._bound

    def _sweep(self) -> None:
        expired = torch.UntypedStorage._expired  # what StorageWeakRef.expired calls, without its frame
        dead = [key for key, (ref, _) in self._storages.items() if expired(ref.cdata)]
        for key in dead:
            self._bound -= self._storages.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        creates = self._creates.get(func)
        if creates is None:
            creates = self._creates[func] = creates_storage(func)
        if creates:
            self._charge(out if isinstance(out, (tuple, list)) else (out,))
        return out

    def _charge(self, results) -> None:
        for leaf in results:
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided and (
                    self.device_type is None or leaf.device.type == self.device_type):
                storage = leaf.untyped_storage()
                nbytes = storage.nbytes()
                key = (storage.device, storage.data_ptr())
                known = self._storages.get(key)
                if known is not None and known[0].expired():  # its address reused
                    self._bound -= self._storages.pop(key)[1]
                    known = None
                if known is None and nbytes > 0:
                    self._storages[key] = (StorageWeakRef(storage), nbytes)
                    self._bound += nbytes
        if self._bound > self.peak:
            self._sweep()
            self.peak = max(self.peak, self._bound)

    # --- sampling (tamrun.machine.sampling) ----------------------------------------------------------

    def _pause(self) -> None:
        """Take the hook off (leave the mode stack; tamrun runs no other dispatch mode inside it)."""
        super().__exit__(None, None, None)
        self._paused = True

    def _resume(self) -> None:
        self._paused = False
        super().__enter__()

    @contextmanager
    def block(self, key: Hashable, size: int = 0, keeps: bool = False) -> Iterator[None]:
        """A block of work keyed by ``key``, of extent ``size``, closed unless it ``keeps`` what it makes
        (`tamrun.machine.sampling.repeating`)."""
        known = self._rises.get(key)
        if self._paused or not self.sample:
            yield
        elif known is not None and known.size >= size:
            yield from self._repeated(known)
        else:
            yield from self._first(key, size, keeps)

    def _first(self, key: Hashable, size: int, keeps: bool) -> Iterator[None]:
        """Meter the block; its rise (and what it keeps) is recorded for the key once it has ended
        without an error. What repeated blocks kept inside it ends with it, or, when it keeps what it
        makes, goes on with the block around it."""
        start = self.live
        outer, self.peak = self.peak, start
        scope = Scope()
        self._scopes.append(scope)
        try:
            yield
            self._rises[key] = Rise(size, self.peak - start, self.live - start if keeps else 0)
        finally:
            self._scopes.pop()
            if scope.paused:
                self._resume()
            if not keeps:
                self._bound -= scope.kept
            elif self._scopes:
                self._scopes[-1].kept += scope.kept
            self.peak = max(outer, self.peak)

    def _repeated(self, known: "Rise") -> Iterator[None]:
        """Run the block without the hook and charge its rise above the bytes alive as it began, and
        what it keeps until the block around it ends."""
        start = self._bound  # an upper bound of live: swept only when it could raise the peak
        if start + known.rise > self.peak:
            start = self.live
        self._pause()
        try:
            yield
            self._keep(known.kept)
        finally:
            self._resume()
            self.peak = max(self.peak, start + known.rise)

    def _keep(self, nbytes: int) -> None:
        """Count ``nbytes`` that a block made without the hook as alive until the block around it ends."""
        self._bound += nbytes
        if self._scopes:
            self._scopes[-1].kept += nbytes

    def steady(self) -> None:
        """Take the hook off until the innermost open block ends (none open: until the meter's end)."""
        if self._paused or not self.sample:
            return
        if self._scopes:
            self._scopes[-1].paused = True
        self._pause()

    @classmethod
    def warm_up(cls) -> bool:
        """Enter and leave a meter once, so that whatever a first dispatch mode loads is not charged
        to the first metered phase (torch._dynamo is not: see `_should_skip_dynamo`). Never
        fails the run: out of memory here (a MemoryError or an allocator's RuntimeError, e.g. under
        ``ulimit -v``) is logged and False returned, the run then goes unmetered."""
        try:
            with cls():
                torch.zeros(1).add_(1)
        except (MemoryError, RuntimeError) as exc:
            if not is_oom(exc):
                raise
            log.warning("the tensor meter is off for this run: out of memory while warming it up (%s: %s)",
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return False
        return True

    def reset_peak(self) -> None:
        self.peak = self.live
