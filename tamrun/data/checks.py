"""Checks of the loaded table against the config: columns present and numeric, NaN policy, missing
group keys, duplicated dates, constant features, target values far outside the rest (each a `DataError`
naming the field, the value and the fix, or a warning where the config's `CheckPolicy` says ``warn``)."""

from __future__ import annotations

import logging
from typing import Mapping, Optional

import numpy as np
import pandas as pd

from tamrun.config.schema import CheckPolicy, NanPolicy, OutlierPolicy
from tamrun.data.cells import check_labels, require_numeric
from tamrun.data.load import require_columns
from tamrun.errors import DataError

log = logging.getLogger(__name__)


def check_table(frame: pd.DataFrame, numeric: Mapping[str, str], group: Optional[str], date_column: str) -> None:
    """``numeric`` maps config field -> column: each must exist and hold numbers; the group column
    (data.group) must exist and hold names a run can carry (`tamrun.data.cells`)."""
    require_columns(frame, {**({"data.group": group} if group else {}), **numeric})
    check_labels(frame, group, date_column)
    require_numeric(frame, numeric, date_column, group)


def apply_nan_policy(frame: pd.DataFrame, columns: Mapping[str, str], policy: NanPolicy,
                     hints: Optional[Mapping[str, str]] = None) -> pd.DataFrame:
    """Refuse (``error``) or drop (``drop``) rows with NaN or infinite values in the used columns (``hints``:
    column -> the fix a refusal names, for the columns whose NaN have a cause of their own)."""
    used = list(dict.fromkeys(columns.values()))
    finite = {column: finite_values(frame[column]) for column in used}  # one column at a time: no (n, k) copy
    bad_rows = np.zeros(len(frame), dtype=bool)
    for column in used:
        bad_rows |= ~finite[column]
    if not bad_rows.any():
        return frame
    if policy == NanPolicy.drop and bad_rows.all():
        empty = [c for c in used if not finite[c].any()]
        raise DataError("data.nan_policy", policy.value, f"every one of the {len(frame)} row(s) holds NaN or inf in "
                        f"a used column (no finite value at all in {empty}): dropping them leaves no data",
                        "clean the data, or remove the effects on those columns")
    if policy == NanPolicy.drop:
        log.warning("dropping %d row(s) with NaN/inf in %s (data.nan_policy=drop)", int(bad_rows.sum()), used)
        return frame[~bad_rows]
    counts = [int((~finite[c]).sum()) for c in used]
    worst = int(np.argmax(counts))
    field = next(f for f, c in columns.items() if c == used[worst])
    raise DataError(field, used[worst], f"{int(counts[worst])} row(s) hold NaN or inf in this column "
                    f"({int(bad_rows.sum())} row(s) in all used columns)", (hints or {}).get(
                        used[worst], "clean the data, or set data.nan_policy=drop to drop those rows"))


def finite_values(column: pd.Series) -> np.ndarray:
    """(n,) bool: where ``column``'s values are finite numbers."""
    return np.isfinite(column.to_numpy(dtype=np.float64, na_value=np.nan))


def plain(value):
    """A numpy scalar as the Python value it holds (so that messages read 3, not np.int64(3))."""
    return value.item() if isinstance(value, np.generic) else value


def enforce(policy: CheckPolicy, setting: str, error: DataError) -> None:
    """Raise ``error`` under policy ``error``, its fix offering ``<setting>=warn``; log it as a warning
    under policy ``warn``, saying that ``<setting>=error`` refuses such data. Either way the message
    offers the value the config does not already hold."""
    if policy == CheckPolicy.error:
        raise DataError(error.field, error.value, error.problem, f"{error.fix}, or set {setting}=warn")
    log.warning("%s (%s=warn; %s=error refuses such data)", error, setting, setting)


def drop_missing_groups(frame: pd.DataFrame, group: Optional[str], policy: NanPolicy) -> pd.DataFrame:
    """Rows without a group key are refused (``error``) or dropped (``drop``)."""
    if not group:
        return frame
    missing = frame[group].isna()
    if not missing.any():
        return frame
    if policy == NanPolicy.drop and missing.all():
        raise DataError("data.nan_policy", policy.value, f"none of the {len(frame)} row(s) has a value in the group "
                        f"column {group!r}: dropping them leaves no data",
                        "fill the group column, or set data.group=null to fit the rows as one series")
    if policy == NanPolicy.drop:
        log.warning("dropping %d row(s) without a group in column %r (data.nan_policy=drop)", int(missing.sum()), group)
        return frame[~missing]
    raise DataError("data.group", group, f"{int(missing.sum())} row(s) have no group value (first at row "
                    f"{int(np.argmax(missing.to_numpy()))})",
                    "fill the group column, or set data.nan_policy=drop to drop those rows")


def check_duplicate_dates(frame: pd.DataFrame, date_column: str, group: Optional[str], policy: CheckPolicy,
                          timezone: Optional[str] = None) -> None:
    """Each (group, date) at most once. Without data.timezone, repeats that all fall early on Sundays of the
    months the clocks go back (March, April, October, November) are likely local times of the repeated
    hour: the fix then names data.timezone too."""
    keys = [date_column] + ([group] if group else [])
    duplicated = frame.duplicated(keys, keep="first")
    if duplicated.any():
        first = frame.loc[duplicated.idxmax()]
        where = f" in group {plain(first[group])!r} of column {group!r}" if group else ""
        dates = frame.loc[duplicated.to_numpy(), date_column]
        clocks = timezone is None and bool(((dates.dt.day_of_week == 6) & dates.dt.month.isin([3, 4, 10, 11])
                                            & (dates.dt.hour <= 3)).all())
        enforce(policy, "data.duplicate_dates", DataError(
            "data.date_column", date_column, f"{int(duplicated.sum())} row(s) repeat a date (first: "
            f"{first[date_column]}{where})", "aggregate or drop the duplicated rows, set data.group to the column "
            "that tells them apart" + (", set data.timezone to the table's zone if they are local times of the "
                                       "hour the clocks go back (e.g. data.timezone=Europe/Paris)" if clocks else "")))


def check_constant_columns(train: pd.DataFrame, columns: Mapping[str, str], policy: CheckPolicy) -> None:
    """No model column may hold a single value over the whole training split (``columns``: field -> column)."""
    for field, column in columns.items():
        values = train[column]
        if values.nunique(dropna=True) <= 1:
            enforce(policy, "data.constant_features", DataError(
                field, column, f"the column is constant over the training split (value {plain(values.iloc[0])!r} "
                f"in all {len(values)} rows): the effect learns nothing", "remove this effect, pick another column"))


def check_target_leakage(frame: pd.DataFrame, columns: Mapping[str, str], target: str) -> None:
    """No model column may be the target, or hold exactly the target's values (the model would read
    the answer: a near-zero error that means nothing)."""
    for field, column in columns.items():
        if column == target or frame[column].equals(frame[target]):
            how = "is the target column itself" if column == target else f"holds exactly the values of the target {target!r}"
            raise DataError(field, column, f"the column {how}: the model would read the answer",
                            "remove this effect, or give it a column known before the target (e.g. a lag)")


def check_constant_in_groups(train: pd.DataFrame, columns: Mapping[str, str], group: Optional[str],
                             policy: CheckPolicy) -> None:
    """A model column constant within a group (but not overall) leaves that group's effect unlearnt:
    a warning (or an error, per data.constant_in_group) naming the column and the groups."""
    if not group:
        return
    for field, column in columns.items():
        if column == group:
            continue
        values = train.groupby(group)[column]
        low, high = values.min(), values.max()  # a group whose least value is its largest (or has none) is constant
        varies = (low < high).to_numpy()  # (min and max: a million groups in a second, nunique in seconds more)
        constant = low.index[~varies].tolist()
        if constant and len(constant) < len(varies):
            enforce(policy, "data.constant_in_group", DataError(
                field, column, f"the column is constant within {len(constant)} of {len(varies)} group(s) of the "
                f"training split (e.g. {[plain(g) for g in constant[:5]]}): their effect learns nothing",
                "remove this effect, group differently"))


# A target value farther from the median than this many robust spreads is far outside the rest
# (data.target_outliers): four orders of magnitude, where a normal sample's largest of a billion values is
# 6 standard deviations out, the national load's farthest value 3.8 robust spreads and the largest of
# 100,000 draws of a lognormal of sigma 1.5 (a very heavy tail) 1,040.
OUTLIER_SPREADS = 10_000.0
MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample times this is its standard deviation
MEAN_AD_TO_SD = 1.2533  # the same for the mean absolute deviation (used when over half the values are equal)
SHOWN_ROWS = 5  # rows a message names


def robust_spread(values: np.ndarray, median: float) -> float:
    """The spread of ``values`` as a standard deviation that a few absurd values do not move: 1.4826 x the
    median absolute deviation, or, when that is 0 (over half the values equal), 1.2533 x the mean absolute
    deviation; 0 only when every value is the median."""
    deviation = np.abs(values - median)
    mad = float(np.median(deviation))
    return MAD_TO_SD * mad if mad > 0 else MEAN_AD_TO_SD * float(np.mean(deviation))


def check_target_outliers(frame: pd.DataFrame, target: str, date_column: str, group: Optional[str],
                          policy: OutlierPolicy) -> pd.DataFrame:
    """Refuse (``error``), warn about (``warn``) or drop (``drop``) the rows whose target lies farther from
    the median than `OUTLIER_SPREADS` robust spreads (`robust_spread`), naming the first of them."""
    values = frame[target].to_numpy(dtype=np.float64)
    if not len(values):
        return frame
    median = float(np.median(values))
    spread = robust_spread(values, median)
    far = np.abs(values - median) > OUTLIER_SPREADS * spread
    if not far.any():
        return frame
    rows = frame.loc[far]
    named = ", ".join(f"{row[date_column]}" + (f" in group {plain(row[group])!r}" if group else "") +
                      f" ({row[target]:.6g})" for _, row in rows.head(SHOWN_ROWS).iterrows())
    more = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    problem = (f"{len(rows)} row(s) lie far outside the rest (farther from the median {median:.6g} than "
               f"{OUTLIER_SPREADS:g} robust spreads of {spread:.3g}): {named}{more}")
    if policy == OutlierPolicy.drop:
        log.warning("dropping the rows of column %r: %s (data.target_outliers=drop)", target, problem)
        return frame.loc[~far]
    enforce(CheckPolicy(policy.value), "data.target_outliers", DataError(
        "data.target", target, problem, "correct or remove those values (a sentinel such as -999999? a unit slip?), "
        "or set data.target_outliers=drop to drop those rows"))
    return frame
