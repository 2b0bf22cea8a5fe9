"""The time model of the plan per class (docs/memory.md, "What a run needs and what it costs").

A run's measured work is split in two: the features phase (``fixed``: the design is built the same way
whatever the chunks) and the solve and predict phases (``chunked``: the work the plan's chunks cut up).
On a class c, measured on a machine of effective bandwidth B_ref with s_ref group steps,

    t_c = (fixed + chunked * O(s_c, route_c) / O(s_ref, route_ref)) * B_ref / B_c
    O(s, route) = 1 + CHUNK_STEP_OVERHEAD[route] * (s - 1),   s = ceil(G / groups per fit chunk)

and a CG fit that cannot keep W Phi between its products pays CG_REBUILD_FACTOR on top. The fit is
memory-bound (gathers, sparse and elementwise products), so its time scales with the bandwidth.
"""

from __future__ import annotations

import math
from typing import Mapping

# The time each extra group step adds, as a fraction of the uncapped chunked work, by route: the median of
# the rungs of `python -m tamrun.bench.tco --fractions 0.25,0.1,0.03` over every preset (docs/benchmarks.md,
# "What chunking costs in time": CG 0.006-0.013 on forest_big and forest_fourier, forest below its noise;
# direct -0.05-0.15 on the six fourier and spline presets, median 0.027). The factor a CG fit pays when it rebuilds W Phi at
# every product instead of keeping it, at the same chunks: model=forest, 1 group x 1,024 rows, 100 s rebuilt
# against 22.6 s kept (docs/memory.md, "CG's smallest chunk").
CHUNK_STEP_OVERHEAD: Mapping[str, float] = {"direct": 0.03, "cg": 0.008}
CG_REBUILD_FACTOR = 4.4


def group_steps(n_groups: int, groups_per_chunk: int) -> int:
    """The steps one pass over the groups takes: ceil(G / groups per chunk), at least 1."""
    return max(1, math.ceil(n_groups / max(1, groups_per_chunk)))


def chunked_seconds(metrics: Mapping[str, float]) -> float:
    """A run's chunked work: its solve and predict phases' seconds."""
    return float(metrics.get("solve_seconds", 0.0)) + float(metrics.get("predict_seconds", 0.0))


def fixed_seconds(metrics: Mapping[str, float]) -> float:
    """A run's work the chunks do not change: its features phase's seconds."""
    return float(metrics.get("features_seconds", 0.0))


def compute_seconds(metrics: Mapping[str, float]) -> float:
    """A run's measured work, the figure its cost prices: fixed + chunked seconds (metric compute_seconds)."""
    return fixed_seconds(metrics) + chunked_seconds(metrics)


def chunk_overhead(route: str, steps: int, design_kept: bool = True) -> float:
    """O(s, route) of the module's model: 1 + CHUNK_STEP_OVERHEAD[route] (s - 1), times CG_REBUILD_FACTOR
    for a CG fit that rebuilds W Phi."""
    factor = 1.0 + CHUNK_STEP_OVERHEAD[route] * (steps - 1)
    return factor * (CG_REBUILD_FACTOR if route == "cg" and not design_kept else 1.0)
