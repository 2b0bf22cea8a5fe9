"""Groups whose forecasts the training data cannot support: found, withheld, counted (docs/reliability.md,
"One bad group does not sink the run").

    find_unsupported(splits, train, width) -> Unsupported
        the groups with a forecast of a split (validation, test) farther than `SUPPORT_FACTOR` spreads from
        the training target's median (`tamrun.fit.evaluate.support`), and why: one row per (group, split)
    withhold(batch, indices) -> GroupedBatch
        the batch with those groups' rows marked as padding: every metric, table and interval skips them
    require_share(table, n_groups, share, fix)
        `NumericalError` when more than ``share`` of the run's groups are withheld (a single group's run: always)
    log_unsupported(table, n_groups, share)
        the warning naming them, why, and the table (`ARTIFACT`) that says why for each

A group with a forecast that is not finite is never withheld: its metrics stay non-finite and the run fails.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import pandas as pd
import torch

from tamrun.data.batch import GroupedBatch
from tamrun.errors import NumericalError
from tamrun.fit.evaluate import SUPPORT_FACTOR, support

log = logging.getLogger(__name__)

# The reasons a group's forecast is not supported (the table's ``reason``).
FEWER_ROWS = "fewer training rows than coefficients: the penalties alone decide the rest, and are too weak for that"
BEYOND = "the penalties are too weak for this group's data, or its features lie far outside the training range"
COLUMNS = ["group", "split", "reason", "forecast", "training_median", "training_spread", "spreads", "training_rows",
           "coefficients"]
# What to check when a group has the rows its coefficients need (`BEYOND`): the features it is forecast at.
FEATURES_FIX = ("; check those groups' features where they are forecast (a value far outside their training range: "
                "a unit, a sentinel)")
SHOWN = 8  # groups named in a message or a log line
ARTIFACT = "predictions/groups_unsupported.csv"  # the table a run logs (`tamrun.jobs.record`)


@dataclass
class Unsupported:
    """The unsupported groups of one batch of groups: the table (`COLUMNS`, one row per group and split) and
    their indices in the batch's group order (each once)."""

    table: pd.DataFrame
    indices: List[int]


def farthest(batch: GroupedBatch, predicted: torch.Tensor, center: float) -> Tuple[np.ndarray, np.ndarray]:
    """Per group of ``batch`` (G,): its real rows' forecast farthest from ``center`` (NaN without rows) and
    whether every forecast of the group is finite."""
    values = predicted.detach().cpu().double()
    real = batch.weight.cpu() > 0
    if not values.shape[1]:
        return np.full(values.shape[0], np.nan), np.ones(values.shape[0], dtype=bool)
    distance = (values - center).abs_().nan_to_num_(nan=np.inf).masked_fill_(~real, -1.0)  # one (G, N) temporary
    forecast = values.gather(1, distance.argmax(dim=1, keepdim=True)).flatten()
    forecast = torch.where(real.any(dim=1), forecast, torch.full_like(forecast, float("nan")))
    return forecast.numpy(), (torch.isfinite(values) | ~real).all(dim=1).numpy()


def find_unsupported(splits: Dict[str, Tuple[GroupedBatch, torch.Tensor]], train: GroupedBatch, width: int
                     ) -> Unsupported:
    """The groups with a forecast of a split of ``splits`` (name -> (batch, predictions (G, N))) farther than
    `SUPPORT_FACTOR` x the training target's spread from its median, every forecast of theirs finite; the
    batches hold the training batch's groups in its order; ``width``: the model's coefficients per group."""
    real = train.weight.cpu() > 0
    center, spread = support(train.y.cpu().numpy()[real.numpy()])
    counts = train.counts.cpu().numpy().astype(np.int64)
    parts, indices = [], set()
    for split, (batch, predicted) in splits.items():
        forecast, finite = farthest(batch, predicted, center)
        spreads = np.abs(forecast - center) / spread
        found = np.flatnonzero(finite & (spreads > SUPPORT_FACTOR))
        if not found.size:
            continue
        indices.update(found.tolist())
        parts.append(pd.DataFrame({
            "group": [batch.groups[i] for i in found], "split": split,
            "reason": np.where(counts[found] < width, FEWER_ROWS, BEYOND), "forecast": forecast[found],
            "training_median": center, "training_spread": spread, "spreads": spreads[found],
            "training_rows": counts[found], "coefficients": width}))
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    return Unsupported(table[COLUMNS], sorted(indices))


def withhold(batch: GroupedBatch, indices: List[int]) -> GroupedBatch:
    """``batch`` with the rows of the groups at ``indices`` marked as padding (weight 0, row index -1), so
    that what reads its real rows (metrics, the predictions table, intervals) skips them."""
    if not indices:
        return batch
    weight = batch.weight.clone()
    weight[indices] = 0
    row_index = batch.row_index.copy()
    row_index[indices] = -1
    return GroupedBatch(batch.groups, batch.columns, batch.x, batch.y, weight, row_index)


def n_unsupported(table: pd.DataFrame) -> int:
    """The distinct groups of an unsupported table (a group may be in it once per split)."""
    return int(table["group"].nunique()) if len(table) else 0


def cause(table: pd.DataFrame) -> str:
    """Why the groups of ``table`` are unsupported, in words."""
    short = table[table["reason"] == FEWER_ROWS]
    if short.empty:
        return BEYOND.replace("this group's data, or its features lie", "these groups' data, or their features lie")
    return (f"{short['group'].nunique()} of them have fewer training rows (as few as {int(short['training_rows'].min())}) "
            f"than the model's {int(short['coefficients'].iloc[0])} coefficients: the penalties alone decide the rest, "
            "and are too weak for that")


def describe(table: pd.DataFrame, shown: str = "") -> str:
    """"the test forecasts of N group(s) reach X from the training target's median M, K times its spread (S):
    not supported by the training data (<cause>)" (the farthest row's figures)."""
    worst = table.loc[table["spreads"].idxmax()]
    splits = " and ".join(dict.fromkeys(table["split"]))
    distance = abs(float(worst["forecast"]) - float(worst["training_median"]))
    return (f"the {splits} forecasts of {n_unsupported(table)} group(s){shown} reach {distance:.4g} "
            f"from the training target's median {float(worst['training_median']):.4g}, {float(worst['spreads']):.0f} "
            f"times its spread ({float(worst['training_spread']):.4g}): not supported by the training data "
            f"({cause(table)})")


SETTING = "evaluate.max_unsupported_share"


def allowed(n_groups: int, share: float) -> int:
    """The most groups of ``n_groups`` a run may withhold: floor(``share`` x ``n_groups``), rounding aside."""
    return int(np.floor(share * n_groups * (1 + 1e-12)))


def require_share(table: pd.DataFrame, n_groups: int, share: float, fix: str) -> None:
    """`NumericalError` naming the unsupported groups of ``table`` when they are more than ``share`` of the
    run's ``n_groups`` groups (every group, e.g. a run of one group, always: ``share`` < 1)."""
    count = n_unsupported(table)
    if count <= allowed(n_groups, share):
        return
    groups = list(dict.fromkeys(table["group"]))[:SHOWN]
    found = count / n_groups
    enough = float(np.ceil(found * 1e4) / 1e4)  # 4 decimals, rounded up: it lets these groups through
    enough = enough if enough < 1 else found
    raise NumericalError("data.group", groups, f"{describe(table, f' (the first {SHOWN} shown)')}; {count} of "
                         f"{n_groups} group(s) ({found:.2%}) are more than {SETTING}={share:g} lets a run withhold "
                         "from its forecast and metrics",
                         fix + FEATURES_FIX * bool((table["reason"] == BEYOND).any())
                         + ("" if count == n_groups else f"; or set {SETTING}={enough:g} to withhold them and finish "
                            "with the other groups"))


def log_unsupported(table: pd.DataFrame, n_groups: int, share: float) -> None:
    """The warning naming the withheld groups (the first `SHOWN`), why, and the table that says why for each."""
    count = n_unsupported(table)
    if count:
        groups = ", ".join(map(repr, list(dict.fromkeys(table["group"]))[:SHOWN])) + (", ..." if count > SHOWN else "")
        log.warning("%d of %d group(s) withheld from the forecast and the metrics (metric groups_unsupported; %s=%g "
                    "lets a run withhold up to %d): %s; %s; %s says why for each", count, n_groups, SETTING, share,
                    allowed(n_groups, share), groups, describe(table), ARTIFACT)
