"""A table artifact written to a local file: Parquet (zstd) or CSV.

A CSV of numbers and text (every column numeric, or text only) is written by pyarrow's CSV writer: the
same values (floats in their shortest round-trip form, NaN as an empty field) some ten times faster
than pandas' ``to_csv``, which formats every float in Python: a per-group table of a million groups
(coefficients, metrics) takes seconds, not minutes. Other tables (dates, booleans, mixed objects) keep
pandas' writer and its formatting.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def arrow_writable(frame: pd.DataFrame) -> bool:
    """Whether every column is numeric (not boolean) or holds only strings: pyarrow's CSV writes them as
    pandas would."""
    for _, column in frame.items():
        kind = column.dtype.kind
        if kind in "iuf":
            continue
        if kind == "O" and column.map(type).eq(str).all():
            continue
        if isinstance(column.dtype, pd.StringDtype):
            continue
        return False
    return True


def write_frame(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` (index not written) at ``path``: Parquet (zstd) when it ends in .parquet, else CSV."""
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False, compression="zstd")
    elif arrow_writable(frame):
        import pyarrow as pa  # imported only when used
        import pyarrow.csv as arrow_csv

        arrow_csv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), str(path),
                            arrow_csv.WriteOptions(quoting_style="needed"))
    else:
        frame.to_csv(path, index=False)
