"""Derived columns declared in the data config (``data.derived``), computed before splitting."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from tamrun.config.schema import DerivedColumn
from tamrun.errors import DataError


def add_derived_columns(frame: pd.DataFrame, derived: Mapping[str, DerivedColumn], date_column: str) -> pd.DataFrame:
    """Return a copy of ``frame`` with each derived column appended, in config order.

    ``time_index``: (date - first date) / unit, a float; ``isin``: 1.0 where ``column`` is one of
    ``values``; ``expr``: ``frame.eval(expr)`` as float.
    """
    out = frame.copy()
    for name, spec in derived.items():
        field = f"data.derived.{name}"
        if spec.kind == "time_index":
            try:
                unit = pd.Timedelta(1, unit=spec.unit)
            except ValueError:
                raise DataError(f"{field}.unit", spec.unit, "not a time unit", "use D, h, min or s") from None
            dates = out[date_column]
            out[name] = ((dates - dates.min()) / unit).astype(np.float64)
        elif spec.kind == "isin":
            if spec.column not in out.columns:
                raise DataError(f"{field}.column", spec.column, "no such column in the data",
                                f"use one of: {', '.join(map(str, out.columns))}")
            out[name] = out[spec.column].isin(list(spec.values)).astype(np.float64)
        else:  # expr (kinds are checked by tamrun.config.checks)
            try:
                out[name] = pd.to_numeric(out.eval(spec.expr)).astype(np.float64)
            except Exception as exc:  # pandas raises many types for a bad expression
                raise DataError(f"{field}.expr", spec.expr, f"the expression cannot be evaluated ({exc})",
                                "write a pandas expression over existing columns, e.g. 'day_type_week >= 5'") from None
    return out
