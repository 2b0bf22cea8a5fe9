"""Checks of the loaded table against the config: columns present and numeric, NaN policy."""

from __future__ import annotations

import logging
from typing import Mapping

import numpy as np
import pandas as pd

from tamrun.config.schema import NanPolicy
from tamrun.data.load import require_columns, require_numeric
from tamrun.errors import DataError

log = logging.getLogger(__name__)


def check_table(frame: pd.DataFrame, numeric: Mapping[str, str], group_field: Mapping[str, str]) -> None:
    """``numeric`` and ``group_field`` map config field -> column; the numeric ones must hold numbers."""
    require_columns(frame, {**group_field, **numeric})
    require_numeric(frame, numeric)


def apply_nan_policy(frame: pd.DataFrame, columns: Mapping[str, str], policy: NanPolicy) -> pd.DataFrame:
    """Refuse (``error``) or drop (``drop``) rows with NaN or infinite values in the used columns."""
    used = list(dict.fromkeys(columns.values()))
    values = frame[used].to_numpy(dtype=np.float64)
    bad_rows = ~np.isfinite(values).all(axis=1)
    if not bad_rows.any():
        return frame
    if policy == NanPolicy.drop:
        log.warning("dropping %d row(s) with NaN/inf in %s (data.nan_policy=drop)", int(bad_rows.sum()), used)
        return frame[~bad_rows]
    counts = (~np.isfinite(values)).sum(axis=0)
    worst = int(np.argmax(counts))
    field = next(f for f, c in columns.items() if c == used[worst])
    raise DataError(field, used[worst], f"{int(counts[worst])} row(s) hold NaN or inf in this column "
                    f"({int(bad_rows.sum())} row(s) in all used columns)",
                    "clean the data, or set data.nan_policy=drop to drop those rows")
