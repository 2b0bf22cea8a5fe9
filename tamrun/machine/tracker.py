"""MemoryTracker: a byte budget that every planned allocation is charged to.

Makes ``memory.limit`` work the same on the CPU and on a GPU: a step charges its footprint (times
the overhead factor) before it allocates; one that would exceed the budget raises `BudgetExceeded`
(a MemoryError, so the OOM guard shrinks the step and retries).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from tamrun.config.units import format_size


class BudgetExceeded(MemoryError):
    """A charge would take the tracker past its budget."""


class MemoryTracker:
    """Charges against ``budget`` bytes (None = unlimited); peak and current are in bytes."""

    def __init__(self, budget: Optional[int], overhead_factor: float) -> None:
        self.budget = budget
        self.overhead_factor = overhead_factor
        self.current = 0
        self.peak = 0

    def charge(self, n_bytes: int) -> int:
        """The bytes a request of ``n_bytes`` is charged (overhead included)."""
        return int(n_bytes * self.overhead_factor)

    def would_fit(self, n_bytes: int) -> bool:
        return self.budget is None or self.current + self.charge(n_bytes) <= self.budget

    def allocate(self, n_bytes: int, label: str = "") -> int:
        """Charge ``n_bytes``; returns the charge, to be released later."""
        charge = self.charge(n_bytes)
        if self.budget is not None and self.current + charge > self.budget:
            raise BudgetExceeded(f"{label or 'allocation'} of {format_size(charge)} exceeds the budget: "
                                 f"{format_size(self.current)} of {format_size(self.budget)} already held")
        self.current += charge
        self.peak = max(self.peak, self.current)
        return charge

    def release(self, charge: int) -> None:
        self.current = max(0, self.current - charge)

    @contextmanager
    def hold(self, n_bytes: int, label: str = "") -> Iterator[None]:
        """Charge for the duration of a block."""
        charge = self.allocate(n_bytes, label)
        try:
            yield
        finally:
            self.release(charge)

    def reset(self) -> None:
        """Forget the peak (the current charges stay)."""
        self.peak = self.current
