"""Property tests (hypothesis) of the batched solvers over random shapes, ragged groups, effects and
penalties, against a per-group float64 dense reference (np.linalg.solve of the normal equations).

Tolerances (relative, per group, 2-norm): batched direct vs reference 1e-7 (the penalties reach
1e-6 * I, so the systems' condition numbers reach ~1e8 at most: 1e8 * eps = 2e-8); chunked vs
unchunked direct max(1e-9, 64 eps kappa) with kappa the largest condition number of the groups'
systems (another summation order of Phi'Phi perturbs A by a few eps |A|, and the solution by kappa
times that: a group of one row with a tiny penalty reaches kappa ~ 1e8); CG (tol 1e-13) vs direct 1e-6.

The examples are derandomised (a fixed sequence per test, no example database), so that the suite
draws the same cases on every machine and in every fresh clone: it cannot pass or fail by luck.
``HYPOTHESIS_PROFILE=explore`` draws new random cases, 1,000 per test, for exploration apart from CI.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tamrun.config.effects import CategoricalSpec, FourierSpec, LinearSpec, SplineSpec
from tamrun.data.batch import build_batch
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign
from tamrun.effects.fourier import FourierEffect
from tamrun.effects.linear import LinearEffect
from tamrun.effects.spline import SplineEffect

from test_dispatcher import fit, max_rel, reference_coefficients

PROFILES = {
    "ci": settings(max_examples=100, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow]),
    "explore": settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
}
SETTINGS = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
penalties = st.floats(min_value=-6.0, max_value=1.0, allow_nan=False)


@st.composite
def problems(draw):
    """A ragged batch (1-5 groups of 1-60 rows) and a design of 1-4 random effects with random ap."""
    seed = draw(st.integers(0, 2**31 - 1))
    counts = draw(st.lists(st.integers(1, 60), min_size=1, max_size=5))
    rng = np.random.default_rng(seed)
    rows = sum(counts)
    frame = pd.DataFrame({"g": np.repeat(np.arange(len(counts)), counts), "x": rng.uniform(-3, 7, rows),
                          "dow": rng.integers(0, 7, rows).astype(float)})
    frame["y"] = np.sin(frame["x"]) + 0.2 * frame["dow"] + rng.normal(0, 0.3, rows)
    makers = {
        "lin": lambda ap: LinearEffect("lin", LinearSpec(column="x", ap=ap)),
        "fx": lambda ap: FourierEffect("fx", FourierSpec(column="x", m=draw(st.integers(1, 3)), s=2.0, ap=ap)),
        "sx": lambda ap: SplineEffect("sx", SplineSpec(column="x", k=draw(st.integers(2, 6)), ap=ap)),
        "dow": lambda ap: CategoricalEffect("dow", CategoricalSpec(
            column="dow", topo=draw(st.sampled_from(["nominal", "difference", "cyclic"])), ap=ap)),
    }
    names = draw(st.lists(st.sampled_from(sorted(makers)), min_size=1, max_size=4, unique=True))
    effects = [makers[name](draw(penalties)) for name in names]
    batch = build_batch(frame, ["x", "dow"], "y", "g", torch.float64)
    design = AdditiveDesign(effects, ["x", "dow"], intercept=True, intercept_ap=draw(penalties)).fit(batch)
    return batch, design


def _whole(batch, design):
    return fit(batch, design, "direct", groups=len(batch.groups), rows=batch.x.shape[1])[0]


def largest_condition_number(batch, design, jitter=1e-6) -> float:
    """max over groups of cond(Phi'Phi / n + P + jitter I), in numpy float64 on the real rows."""
    penalty = design.penalty().numpy()
    worst = 1.0
    for g in range(len(batch.groups)):
        real = batch.weight[g].numpy() > 0
        phi = design.design(batch.x[g:g + 1], slice(g, g + 1))[0].numpy()[real]
        a = phi.T @ phi / real.sum() + penalty + jitter * np.eye(phi.shape[1])
        worst = max(worst, float(np.linalg.cond(a)))
    return worst


@SETTINGS
@given(problems())
def test_batched_direct_equals_the_per_group_float64_reference(problem):
    batch, design = problem
    assert max_rel(_whole(batch, design), reference_coefficients(batch, design)) <= 1e-7


@SETTINGS
@given(problems(), st.data())
def test_chunked_equals_unchunked_for_any_chunk_size(problem, data):
    batch, design = problem
    groups = data.draw(st.integers(1, len(batch.groups)), label="group chunk")
    rows = data.draw(st.integers(1, batch.x.shape[1]), label="row chunk")
    chunked, stats, _ = fit(batch, design, "direct", groups=groups, rows=rows)
    assert stats.group_chunk == groups
    tolerance = max(1e-9, 64 * np.finfo(np.float64).eps * largest_condition_number(batch, design))
    assert max_rel(chunked, _whole(batch, design)) <= tolerance


@SETTINGS
@given(problems(), st.integers(1, 5), st.booleans())
def test_cg_equals_direct(problem, groups, cache):
    batch, design = problem
    cg, stats, _ = fit(batch, design, "cg", groups=min(groups, len(batch.groups)), rows=17, cache=cache, tol=1e-13)
    assert stats.cg_unconverged_groups == 0
    assert max_rel(cg, _whole(batch, design)) <= 1e-6
