"""Where each metric shows in MLflow: the decisive ones at the top level, the internal ones grouped.

MLflow's chart view groups a run's metrics by the prefix before a ``/`` and shows the top-level ones
first ("Model metrics"). tamrun's code names metrics plainly (``cg_iterations``, ``solve_seconds``);
`metric_key` gives the key a metric is logged under, read back by `metric_key` too (the same function
on both sides), and `metric_name` strips it:

    rmse_*, mape_*, fit_seconds, peak_memory_mib, cost_*, sweep_*, best_*,  top level (what runs are compared on;
    groups_unsupported                                                       the groups the metrics leave out)
    coverage_*, width_*, pinball_*                                         interval/   (prediction intervals)
    *_seconds, seconds_per_refit                                           time/
    *_bytes, *_mib, working_peak_ratio, oom_retries, chunk and batch sizes memory/
    cg_*, gcv_*, kalman_*, aggregate_*, refits and windows                 solver/
    n_*_rows                                                               data/
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Tuple

# (prefix, pattern of the plain names it holds), the first match wins; names no pattern matches stay at the
# top level.
GROUPS: Tuple[Tuple[str, str], ...] = (
    ("", r"(rmse|mape)_.*|fit_seconds|peak_memory_mib|cost_.*|sweep_.*|best_.*|groups_unsupported"),
    ("interval/", r"(coverage|width|pinball)_.*"),
    ("time/", r".*_seconds|seconds_per_refit"),
    ("memory/", r".*_bytes|.*_mib|working_peak_ratio|oom_retries|(predict_)?chunk_.*|groups_per_batch|"
                r"windows_per_batch|window_batches|kalman_groups_per_chunk"),
    ("solver/", r"cg_.*|gcv_.*|kalman_.*|aggregate_.*|n_refits|window_rows"),
    ("data/", r"n_.*_rows"),
)
_COMPILED = tuple((prefix, re.compile(pattern)) for prefix, pattern in GROUPS)


def metric_key(name: str) -> str:
    """The key ``name`` is logged under in MLflow (``cg_iterations`` -> ``solver/cg_iterations``); a key
    that already has a prefix is returned as it is."""
    if "/" in name:
        return name
    for prefix, pattern in _COMPILED:
        if pattern.fullmatch(name):
            return prefix + name
    return name


def metric_name(key: str) -> str:
    """The plain name of a logged key (``solver/cg_iterations`` -> ``cg_iterations``)."""
    return key.rsplit("/", 1)[-1]


def logged_value(metrics: Mapping[str, float], name: str) -> Optional[float]:
    """A run's value of the metric ``name`` (plain or a key) from its logged ``metrics``: under its key, or
    under its plain name for a run logged before the keys had prefixes; None when it has neither."""
    key = metric_key(name)
    return metrics.get(key, metrics.get(metric_name(key)))
