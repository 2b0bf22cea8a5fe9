"""TensorMeter: the exact peak of tensor bytes created inside a block, on any device.

Process RSS cannot tell a run's working memory apart (the C allocator recycles freed heap blocks
without growing the resident set), and CUDA's max_memory_allocated exists only on CUDA. This meter
sees every ATen operation through a TorchDispatchMode, charges each new storage it creates, drops
the charge when the storage is freed, and keeps the high-water mark:

    live(t) = sum of nbytes of the storages created since the block began and still alive at t
    peak    = max over the operations of live(t)

Tensors that existed before the block (the data) are not counted: the peak is the working memory.
The freed storages are found lazily: an operation adds its new storages to an upper bound of live
(deaths not yet seen); only when that bound passes the peak are the charged storages swept for the
freed ones. Sweeping only lowers live, so a bound at or below the peak cannot raise it: the peak is
exact, and a loop of many small operations (per-group products) does not pay one sweep of every
charged storage per operation.
"""

from __future__ import annotations

import logging
from typing import Dict, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tamrun.memory.guard import is_oom

log = logging.getLogger(__name__)


class TensorMeter(TorchDispatchMode):
    """``with TensorMeter() as meter: ...`` then ``meter.peak`` (bytes); ``meter.live`` is current."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would otherwise wrap `__torch_dispatch__` in ``torch._dynamo.disable``, whose
        first call imports torch._dynamo (about 68 MiB and a second or more); tamrun never compiles,
        so there is nothing for dynamo to skip. (TorchDispatchMode's documented opt-out.)"""
        return False

    def __init__(self) -> None:
        super().__init__()
        self._storages: Dict[Tuple[str, int], Tuple[StorageWeakRef, int]] = {}
        self._bound = 0  # live plus the bytes of charged storages freed since the last sweep
        self.peak = 0

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            # Release the weak references now: one left to the interpreter's exit (a run ended by a signal
            # keeps its frames) fails in torch's StorageWeakRef.__del__ with a traceback once torch is torn down.
            self._storages.clear()
            self._bound = 0

    @property
    def live(self) -> int:
        """The bytes of the charged storages alive now."""
        self._sweep()
        return self._bound

    def _sweep(self) -> None:
        dead = [key for key, (ref, _) in self._storages.items() if ref.expired()]
        for key in dead:
            self._bound -= self._storages.pop(key)[1]

    @staticmethod
    def _key(tensor: torch.Tensor) -> Tuple[str, int]:
        storage = tensor.untyped_storage()
        return str(storage.device), storage.data_ptr()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # An output that shares an input's storage is a view or an in-place result: nothing new.
        inputs = {self._key(t) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
                storage = leaf.untyped_storage()
                key = self._key(leaf)
                if key in self._storages and self._storages[key][0].expired():  # its address reused
                    self._bound -= self._storages.pop(key)[1]
                if key not in self._storages and key not in inputs and storage.nbytes() > 0:
                    self._storages[key] = (StorageWeakRef(storage), storage.nbytes())
                    self._bound += storage.nbytes()
        if self._bound > self.peak:
            self._sweep()
            self.peak = max(self.peak, self._bound)
        return out

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
