"""Byte sizes written by people ("2GiB", "512MB", "1.5e9") and back."""

from __future__ import annotations

import math
import re
from typing import Optional, Union

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: Union[str, int, float, None]) -> Optional[int]:
    """Parse a size into bytes; ``None`` stays ``None``.

    Raises:
        ValueError: the text is not a finite number with an optional unit (B, KB, MB, GB, TB, KiB, MiB,
            GiB, TiB).
    """
    if text is None:
        return None
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    number = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(number):
        raise ValueError(f"not a finite size: {text!r}")
    return int(number)


def format_size(n_bytes: float) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
