"""Figures as people read them: 4 significant digits (a target around 1 shows ``rmse_test=0.1234``,
not ``0.1``), a large figure in full without an exponent (``16544``, not ``1.654e+04``)."""

from __future__ import annotations

import math

DIGITS = 4


def significant(value: float, digits: int = DIGITS) -> str:
    """``value`` to ``digits`` significant digits; at or above 10**digits, rounded to a whole number."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"
