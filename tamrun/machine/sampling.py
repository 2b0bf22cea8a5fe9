"""Where a phase's work repeats, so that the tensor meter counts it once (`tamrun.memory.meter`).

The work of a fit repeats itself: every row chunk of a design, every group of a Gram, every chunk of
groups of the same size and every CG iteration allocates the same tensors as the one before. The code
that knows it says so, and the active meter (if any) meters the first instance only:

    with repeating(("gram", dense.shape)):   # a closed block, keyed by what fixes its allocations
        for group in range(n):
            ...                               # the first group metered
            steady()                          # the rest of the block repeats it: the hook comes off

A block is **closed**: what it creates is gone when it ends (its results are written into tensors that
existed before it). The first block of a key is metered and its rise (its peak above the bytes alive
when it began) kept; a later block of that key runs without the dispatch hook and is charged that rise
above the bytes alive when it began. A block may state its ``size`` (the rows of a row chunk) when its
allocations grow with it and its key names one loop (whose closed blocks all begin with the same bytes
alive): a block no larger than one metered under its key is then charged that one's rise, which its own
peak cannot exceed (the shorter last row chunk). A block that ``keeps`` what it makes (a design chunk
kept for the products) is not closed: what its metered instance kept is counted as alive, for each later
one, until the block around it ends (it must not outlive that block). `steady` takes the hook off until
the innermost open block ends (without one, until the meter's end); a block that keeps what it makes
must not call it. Without an active meter both cost one context-variable read.
"""

from __future__ import annotations

from contextlib import nullcontext
from contextvars import ContextVar
from typing import ContextManager, Hashable, Optional, Protocol


class Sampler(Protocol):
    """What a meter offers the code it meters (`tamrun.memory.meter.TensorMeter`)."""

    def block(self, key: Hashable, size: int = 0, keeps: bool = False) -> ContextManager[None]: ...

    def steady(self) -> None: ...


ACTIVE: ContextVar[Optional[Sampler]] = ContextVar("tamrun_active_meter", default=None)
NOTHING = nullcontext()


def repeating(key: Hashable, size: int = 0, keeps: bool = False) -> ContextManager[None]:
    """A block of work that repeats under ``key`` (a tuple of what fixes its allocations: its shapes,
    its route; with a ``size``, one loop's token too), closed unless it ``keeps`` what it makes: metered
    the first time, charged the first one's rise (and what it kept) the next times."""
    sampler = ACTIVE.get()
    return NOTHING if sampler is None else sampler.block(key, size, keeps)


def steady() -> None:
    """The rest of the innermost open block repeats what was metered so far (CG's later iterations,
    a Gram's later groups): meter none of it."""
    sampler = ACTIVE.get()
    if sampler is not None:
        sampler.steady()
