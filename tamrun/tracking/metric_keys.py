"""Where each metric shows in MLflow: the model metrics at the top level, the internal ones under ``system/``.

MLflow's charts (3.17) group a run's metrics by the prefix before the last ``/``: its "Model metrics" tab
holds every metric outside ``system/``, its sections the prefixes in alphabetical order, and the top-level
metrics ("Model metrics") after them all; its "System metrics" tab holds the ``system/`` ones. So the
model metrics are the only top-level ones, and a run's charts open with them; the internal ones are
grouped under ``system/`` (sections ``system/interval``, ``system/time``, ...). tamrun's code names metrics
plainly (``cg_iterations``, ``solve_seconds``); `metric_key` gives the key a metric is logged under, read
back by `metric_key` too (the same function on both sides), and `metric_name` strips it:

    rmse_*, mape_*, fit_seconds, peak_memory_mib, cost_*, sweep_*,    top level (what runs are compared on;
    best_*, groups_unsupported                                        the groups the metrics leave out)
    coverage_*, width_*, pinball_*                                    system/interval/ (prediction intervals)
    *_seconds, seconds_per_refit                                      system/time/
    *_bytes, *_mib, working_peak_ratio, oom_retries, chunk and batch  system/memory/
    cg_*, gcv_*, kalman_*, aggregate_*, refits and windows            system/solver/
    n_*_rows                                                          system/data/

Runs logged before (tamrun of 2026-11-28 and earlier) have them under ``interval/``, ``time/``,
``memory/``, ``solver/`` and ``data/`` (`LEGACY_PREFIXES`): `metric_key` maps such a key to today's, and
`logged_value` reads them too.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Tuple

# (prefix, pattern of the plain names it holds), the first match wins; names no pattern matches stay at the
# top level.
GROUPS: Tuple[Tuple[str, str], ...] = (
    ("", r"(rmse|mape)_.*|fit_seconds|peak_memory_mib|cost_.*|sweep_.*|best_.*|groups_unsupported"),
    ("system/interval/", r"(coverage|width|pinball)_.*"),
    ("system/time/", r".*_seconds|seconds_per_refit"),
    ("system/memory/", r".*_bytes|.*_mib|working_peak_ratio|oom_retries|(predict_)?chunk_.*|groups_per_batch|"
                       r"windows_per_batch|window_batches|kalman_groups_per_chunk"),
    ("system/solver/", r"cg_.*|gcv_.*|kalman_.*|aggregate_.*|n_refits|window_rows"),
    ("system/data/", r"n_.*_rows"),
)
# The prefixes of runs logged before the internal metrics moved under system/.
LEGACY_PREFIXES = ("interval/", "time/", "memory/", "solver/", "data/")
_COMPILED = tuple((prefix, re.compile(pattern)) for prefix, pattern in GROUPS)


def metric_key(name: str) -> str:
    """The key ``name`` is logged under in MLflow (``cg_iterations`` -> ``system/solver/cg_iterations``); a
    key with an earlier prefix (``solver/cg_iterations``) gives today's; any other key is returned as it is."""
    if "/" in name:
        return metric_key(metric_name(name)) if name.startswith(LEGACY_PREFIXES) else name
    for prefix, pattern in _COMPILED:
        if pattern.fullmatch(name):
            return prefix + name
    return name


def metric_name(key: str) -> str:
    """The plain name of a logged key (``system/solver/cg_iterations`` -> ``cg_iterations``)."""
    return key.rsplit("/", 1)[-1]


def logged_value(metrics: Mapping[str, float], name: str) -> Optional[float]:
    """A run's value of the metric ``name`` (plain or a key) from its logged ``metrics``: under its key, or
    under the plain name or an earlier prefix (`LEGACY_PREFIXES`) for a run logged before; None when none."""
    key = metric_key(name)
    plain = metric_name(key)
    for candidate in (key, plain, *(prefix + plain for prefix in LEGACY_PREFIXES)):
        if candidate in metrics:
            return metrics[candidate]
    return None
