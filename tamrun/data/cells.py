"""What one value of the table may be, checked once the table is read (CSV or Parquet, whole or a chunk of
groups): each refusal is a `DataError` naming the field, the column, the row (its date and group), the
value quoted cut short and escaped, and the fix.

- **Labels.** A group name (data.group) is at most `LONGEST_LABEL` characters and holds no control
  character: a run writes it in messages, logs, plots and the model's tables (a 1 MB name would be
  carried through all of them).
- **Numbers.** A numeric column holds numbers; the first value that is not one is quoted as it is in the
  file (``'3.82\\x1f1'``: a control character shown escaped), not an example of the column.
- **Magnitudes.** A value an effect reads lies within ``±LARGEST_VALUE``: past it float64 keeps no digit
  below the units and a float32 square overflows, and a range of such values (a spline's knots, a plot's
  axis) cannot be computed. The target is held by `tamrun.data.checks.check_target_outliers` instead.

A value is cut to `QUOTED_CHARS` before any message is built from it (`quoted`), so that a message never
carries the whole of a long value.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import pandas as pd

from tamrun.errors import DataError
from tamrun.redact import looks_like_credential, redacted, secret_name

LONGEST_LABEL = 1000  # characters of a group name
LARGEST_VALUE = 1e15  # the largest magnitude of a value an effect reads
QUOTED_CHARS = 40  # characters of a value a message quotes
CONTROL = "[\x00-\x1f\x7f]"  # control characters (C0 and DEL): not in a label


def quoted(value: object, column: Optional[str] = None) -> str:
    """``repr(value)`` (control characters escaped, ``'3.82\\x1f1'``), cut to `QUOTED_CHARS` characters of
    the value, its length said when cut: a value of the file (of ``column``) an error may quote, unless it
    looks like a password or token (`tamrun.redact.looks_like_credential`, or the redaction would mask part of
    it) or its column is named like a secret (`tamrun.redact.secret_name`: ``password``, ``api_key``, ...):
    then a phrase saying it is not quoted."""
    value = value.item() if isinstance(value, np.generic) else value
    shown = value[:QUOTED_CHARS] if isinstance(value, str) else str(value)
    if (column is not None and secret_name(str(column))) or redacted(shown) != shown \
            or any(looks_like_credential(word) for word in shown.split()):
        return "(not quoted: it looks like a password or a token)"
    if isinstance(value, str) and len(value) > QUOTED_CHARS:
        return f"{value[:QUOTED_CHARS]!r}... ({len(value)} characters)"
    return repr(value)


def row_named(frame: pd.DataFrame, index: object, date_column: str, group: Optional[str]) -> str:
    """The row at ``index`` of ``frame`` by its date and group: ``the row of 2020-01-05 04:00:00 in group 'a'``."""
    row = frame.loc[index]
    where = f" in group {quoted(row[group], group)}" if group and group in frame.columns else ""
    return f"the row of {row[date_column]}{where}" if date_column in frame.columns else f"row {index}"


def check_labels(frame: pd.DataFrame, group: Optional[str], date_column: str) -> None:
    """Each group name at most `LONGEST_LABEL` characters, without control characters (module doc)."""
    if not group or group not in frame.columns or pd.api.types.is_numeric_dtype(frame[group]):
        return
    names = frame[group].astype("string")
    lengths = names.str.len().fillna(0).to_numpy()
    if (lengths > LONGEST_LABEL).any():
        first = int(np.argmax(lengths > LONGEST_LABEL))
        raise DataError("data.group", group, f"{int((lengths > LONGEST_LABEL).sum())} row(s) hold a group name longer "
                        f"than {LONGEST_LABEL} characters (first: {row_named(frame, frame.index[first], date_column, None)}, "
                        f"a name of {int(lengths[first])} characters: {quoted(names.iloc[first], group)})",
                        f"shorten the group names to at most {LONGEST_LABEL} characters (e.g. map them to ids), or "
                        "set data.group to the column that names the groups")
    control = names.str.contains(CONTROL, regex=True).fillna(False).to_numpy(dtype=bool)
    if control.any():
        first = int(np.argmax(control))
        raise DataError("data.group", group, f"{int(control.sum())} row(s) hold a group name with a control character "
                        f"(first: {row_named(frame, frame.index[first], date_column, None)}: {quoted(names.iloc[first], group)})",
                        "remove the control characters (tabs, NUL, \\x1f, ...) from the group names")


def require_numeric(frame: pd.DataFrame, columns: Mapping[str, str], date_column: str, group: Optional[str]) -> None:
    """Every configured column (field -> column) holds numbers; else the first value that is not a number,
    quoted as the file has it, and its row."""
    for field, column in columns.items():
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values):
            continue
        text = values.dtype == object or pd.api.types.is_string_dtype(values)
        numbers = pd.to_numeric(values.astype(object), errors="coerce") if text else pd.Series(np.nan, values.index)
        bad = (numbers.isna() & values.notna()).to_numpy()
        kind = "are not numbers"
        if not bad.any():  # numbers stored as text (a Parquet string column), or every value blank
            bad, kind = values.notna().to_numpy(), f"are not stored as numbers (dtype {values.dtype})"
        first = int(np.argmax(bad))
        raise DataError(field, column, f"the column is not numeric: {int(bad.sum())} value(s) {kind} (first: "
                        f"{quoted(values.iloc[first], column)} at {row_named(frame, frame.index[first], date_column, group)})",
                        "correct or remove those values, choose a numeric column, or derive one in data.derived")


def check_magnitudes(frame: pd.DataFrame, columns: Mapping[str, str], date_column: str, group: Optional[str]) -> None:
    """Every finite value of ``columns`` (field -> column, the effects') within ``±LARGEST_VALUE``."""
    for field, column in columns.items():
        values = frame[column].to_numpy(dtype=np.float64)
        huge = np.isfinite(values) & (np.abs(values) > LARGEST_VALUE)
        if huge.any():
            first = int(np.argmax(huge))
            raise DataError(field, column, f"{int(huge.sum())} value(s) lie beyond ±{LARGEST_VALUE:g}, the largest "
                            f"magnitude an effect reads (first: {values[first]:g} at "
                            f"{row_named(frame, frame.index[first], date_column, group)})",
                            f"correct those values (a sentinel? a unit slip?), or rescale the column below "
                            f"{LARGEST_VALUE:g} (e.g. a data.derived expression dividing it)")
