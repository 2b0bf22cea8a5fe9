"""The dispatcher's batched fit against a per-group float64 dense reference, across chunkings and routes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tamrun.config.effects import CategoricalSpec, FourierSpec, LinearSpec, SplineSpec
from tamrun.config.schema import CountDType, OomConfig, Preconditioner, SolverConfig
from tamrun.data.batch import build_batch
from tamrun.device.manager import DeviceManager
from tamrun.effects.categorical import CategoricalEffect
from tamrun.effects.design import AdditiveDesign
from tamrun.effects.fourier import FourierEffect
from tamrun.effects.linear import LinearEffect
from tamrun.effects.spline import SplineEffect
from tamrun.fit.fitted import predict_rows
from tamrun.memory.footprint import StepCost
from tamrun.memory.guard import ChunkLoop, OomLog
from tamrun.memory.oracle import ChunkPlan, Plan
from tamrun.machine.tracker import MemoryTracker
from tamrun.fit.dispatcher import Dispatcher

from conftest import synthetic_frame


@pytest.fixture(scope="module")
def problem():
    frame = synthetic_frame(days=60, groups=4, seed=3)
    frame = frame[~((frame["g"] == 2) & (frame.index % 5 == 0))]  # ragged: group 2 has fewer rows
    effects = [LinearEffect("lin", LinearSpec(column="x", ap=-4.0)),
               FourierEffect("fx", FourierSpec(column="x", m=3, s=2.0, ap=-3.0)),
               SplineEffect("sx", SplineSpec(column="x", k=8, deg=3, p=2, ap=-5.0)),
               CategoricalEffect("dow", CategoricalSpec(column="dow", topo="difference", ap=-3.0))]
    batch = build_batch(frame, ["x", "dow"], "y", "g", torch.float64)
    design = AdditiveDesign(effects, ["x", "dow"], intercept=True, intercept_ap=-9.0).fit(batch)
    return batch, design


def reference_coefficients(batch, design, jitter=1e-6):
    """Per group, in numpy float64: (Phi'Phi/n + P + jitter I) beta = Phi'y/n on the real rows."""
    penalty = design.penalty().numpy()
    out = []
    for g in range(len(batch.groups)):
        real = batch.weight[g].numpy() > 0
        phi = design.design(batch.x[g:g + 1], slice(g, g + 1))[0].numpy()[real]
        y = batch.y[g].numpy()[real]
        n = real.sum()
        a = phi.T @ phi / n + penalty + jitter * np.eye(phi.shape[1])
        out.append(np.linalg.solve(a, phi.T @ y / n))
    return np.stack(out)


def plan_of(route, fit_chunk, predict_chunk, cache, dual=False) -> Plan:
    """A plan with the given route and chunks (the byte figures do not matter to the dispatcher)."""
    return Plan(route=route, reason="test", fit=fit_chunk, predict=predict_chunk, cache_design=cache, budget=0,
                free=0, predicted_peak=0, minimal_limit=0, fit_cost=StepCost(0, 0), predict_cost=StepCost(0, 0),
                overhead=1.1, chunk_fraction=0.7, predict_output=0, dual=dual)


def dispatcher_of(design, plan, solver) -> Dispatcher:
    """A CPU dispatcher with an unlimited tracker."""
    loop = ChunkLoop(OomConfig(), OomLog(), MemoryTracker(None, 1.1))
    return Dispatcher(design, DeviceManager("cpu"), plan, solver, loop)


def fit(batch, design, route, groups, rows, cache=True, tol=None):
    plan = plan_of(route, ChunkPlan(groups, rows, 0), ChunkPlan(groups, rows, 0), cache)
    solver = SolverConfig(tol=tol, max_iter=5000)
    dispatcher = dispatcher_of(design, plan, solver)
    coef, stats = dispatcher.fit(batch)
    return coef.numpy(), stats, dispatcher


def max_rel(a, b):
    return float((np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)).max())


def test_batched_direct_matches_float64_reference(problem):
    batch, design = problem
    coef, stats, _ = fit(batch, design, "direct", groups=len(batch.groups), rows=batch.x.shape[1])
    assert stats.route == "direct"
    assert max_rel(coef, reference_coefficients(batch, design)) <= 1e-8


@pytest.mark.parametrize("groups,rows", [(1, 10_000), (3, 37), (1, 1)])
def test_chunked_and_per_group_loops_equal_the_batch(problem, groups, rows):
    batch, design = problem
    whole, _, _ = fit(batch, design, "direct", groups=len(batch.groups), rows=batch.x.shape[1])
    chunked, stats, _ = fit(batch, design, "direct", groups=groups, rows=rows)
    # other row chunks sum Phi'Phi in another order: float64 rounding times the system's conditioning
    assert max_rel(chunked, whole) <= 1e-8
    assert stats.group_chunk == groups


@pytest.mark.parametrize("cache", [True, False])
def test_cg_matches_direct(problem, cache):
    batch, design = problem
    direct, _, _ = fit(batch, design, "direct", groups=len(batch.groups), rows=batch.x.shape[1])
    cg, stats, _ = fit(batch, design, "cg", groups=2, rows=100, cache=cache, tol=1e-13)
    assert stats.cg_unconverged_groups == 0 and stats.cg_iterations > 0
    assert stats.cg_history[0] > stats.cg_history[-1]
    assert max_rel(cg, direct) <= 1e-6


def test_predict_equals_design_times_coefficients(problem):
    batch, design = problem
    coef, _, _ = fit(batch, design, "direct", groups=2, rows=50)
    predicted = predict_rows(design, torch.tensor(coef), batch.x, torch.device("cpu"), group_chunk=2, row_chunk=50,
                             weight=batch.weight)
    phi = design.design(batch.x).numpy()
    expected = np.einsum("gnd,gd->gn", phi, coef) * batch.weight.numpy()
    np.testing.assert_allclose(predicted.numpy(), expected, rtol=1e-12, atol=1e-9)


@pytest.fixture(scope="module")
def forest_problem():
    from tamrun.config.effects import CrossingSpec, ForestSpec
    from tamrun.effects.registry import build_effects

    frame = synthetic_frame(days=40, groups=3, seed=5)
    frame["x2"] = np.cos(frame["x"]) + 0.1 * np.arange(len(frame)) / len(frame)
    specs = {"lin": LinearSpec(column="x", ap=-4.0),
             "forest": ForestSpec(column="x", others=["x2"], n_trees=6, max_depth=3, ap=-2.0),
             "cross": CrossingSpec(left=FourierSpec(column="x2", m=2, s=2.0),
                                   right=ForestSpec(column="x", n_trees=3, max_depth=2), ap=-2.0),
             "dow": CategoricalSpec(column="dow", topo="nominal", ap=-3.0)}
    effects = build_effects(specs, seed=7)
    batch = build_batch(frame, ["x", "x2", "dow"], "y", "g", torch.float64)
    design = AdditiveDesign(effects, ["x", "x2", "dow"], intercept=True, intercept_ap=-9.0).fit(batch)
    return batch, design


def test_forest_direct_matches_the_dense_reference_and_cg_matches_direct(forest_problem):
    batch, design = forest_problem
    assert design.indexed_effects and design.width == 1 + 1 + 7 + 6 * 8 + 3 * 4 * 4
    direct, _, _ = fit(batch, design, "direct", groups=2, rows=100)
    assert max_rel(direct, reference_coefficients(batch, design)) <= 1e-8
    for preconditioner in ("jacobi", "block_jacobi", "none"):
        plan = plan_of("cg", ChunkPlan(2, 100, 0), ChunkPlan(2, 100, 0), cache=True)
        solver = SolverConfig(tol=1e-12, max_iter=20_000, preconditioner=Preconditioner(preconditioner))
        coef, stats = dispatcher_of(design, plan, solver).fit(batch)
        assert stats.cg_unconverged_groups == 0
        assert max_rel(coef.numpy(), direct) <= 1e-6, preconditioner


@pytest.mark.parametrize("groups", [1, 2])
def test_cg_per_group_arithmetic_does_not_depend_on_the_group_chunk(forest_problem, groups):
    """A memory cap changes how many groups share a chunk; each group's CG must not notice (bitwise),
    so that a capped run reproduces the uncapped coefficients exactly, not just to the CG tolerance."""
    batch, design = forest_problem
    whole, _, _ = fit(batch, design, "cg", groups=len(batch.groups), rows=97, tol=1e-8)
    chunked, _, _ = fit(batch, design, "cg", groups=groups, rows=97, tol=1e-8)
    np.testing.assert_array_equal(chunked, whole)


def test_dual_form_matches_the_primal_and_the_dense_reference():
    """Fewer rows than columns (N < D): the N x N kernel system gives the primal solution."""
    from tamrun.config.effects import CrossingSpec, ForestSpec
    from tamrun.effects.registry import build_effects

    frame = synthetic_frame(days=6, groups=3, seed=8)
    frame = frame[~((frame["g"] == 1) & (frame.index % 4 == 0))]  # ragged: padded rows in group 1
    frame["x2"] = np.cos(frame["x"])
    specs = {"sx": SplineSpec(column="x", k=6, deg=3, p=2, ap=-4.0),
             "forest": ForestSpec(column="x", others=["x2"], n_trees=5, max_depth=3, ap=-2.0),
             "cross": CrossingSpec(left=FourierSpec(column="x2", m=2, s=2.0, ap=-1.0),
                                   right=ForestSpec(column="x", n_trees=4, max_depth=2, ap=-2.0), ap=-3.0),
             "dow": CategoricalSpec(column="dow", topo="difference", ap=-3.0)}
    batch = build_batch(frame, ["x", "x2", "dow"], "y", "g", torch.float64)
    design = AdditiveDesign(build_effects(specs, seed=2), ["x", "x2", "dow"], intercept=True,
                            intercept_ap=-9.0).fit(batch)
    assert batch.x.shape[1] < design.width  # N < D
    reference = reference_coefficients(batch, design)
    coefs = {}
    # leaf counts by the dense product (bfloat16, float32), scattered, or both (leaves of more than 4
    # rows dense); K's lower triangle in one tile or in tiles of 7 rows; one group per chunk or all
    # three (ragged) groups in one batch
    variants = [(True, 4096, "bfloat16", 512, 96, 1), (True, 4096, "float32", 7, 96, 3),
                (True, 0, "bfloat16", 7, 96, 3), (True, 0, "float32", 7, 4, 1), (True, 0, "float32", 7, 4, 3),
                (False, 4096, "bfloat16", 512, 96, 3)]
    for dual, counts_max, counts, tile, scatter_rows, groups in variants:
        plan = plan_of("direct", ChunkPlan(groups, 17, 0), ChunkPlan(3, 17, 0), cache=False, dual=dual)
        solver = SolverConfig(dual_dense_counts_max=counts_max, dual_counts_dtype=CountDType(counts),
                              dual_tile_rows=tile, dual_scatter_max_leaf_rows=scatter_rows)
        coef, _ = dispatcher_of(design, plan, solver).fit(batch)
        coefs[dual, counts_max, counts, tile, scatter_rows, groups] = coef.numpy()
    primal = coefs[variants[-1]]
    for variant in variants[:-1]:
        assert max_rel(coefs[variant], reference) <= 1e-8, variant
        assert max_rel(coefs[variant], primal) <= 1e-8, variant


@pytest.mark.parametrize("dense_max,scatter_rows", [(10_000, 0), (0, 10_000), (0, 0), (0, 18)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_leaf_count_tiles_equal_the_pairwise_count(dense_max, scatter_rows, dtype):
    """Every tile of C equals the explicit pairwise count exactly on and below the diagonal (K needs no
    more): all leaves in the dense product (bfloat16 or float32), all pairs scattered, or both (the
    leaves of more than 18 rows dense); 300 trees exceed bfloat16's exact integers, so count_dtype
    falls back to float32."""
    from tamrun.solve.dual import LeafCounts, count_dtype

    rng = np.random.default_rng(3)
    for trees, rows in ((5, 37), (300, 23)):
        leaves = rng.integers(0, 2, size=(rows, trees)) + 2 * np.arange(trees)  # trees of 2 leaves each
        expected = (leaves[:, None, :] == leaves[None, :, :]).sum(-1)  # explicit pairwise comparison
        counter = LeafCounts(torch.as_tensor(leaves), 2 * trees, dense_max, count_dtype(trees, dtype), scatter_rows,
                             pairs_per_step=1 << 20)
        lower = np.tril(np.ones((rows, rows), dtype=bool))
        for start, stop, upto in ((0, 8, 8), (8, 16, 16), (16, rows, rows), (3, 11, rows)):
            tile = counter.tile(start, stop, upto).float().numpy()
            keep = lower[start:stop, :upto]
            np.testing.assert_array_equal(tile[keep], expected[start:stop, :upto][keep])
    assert count_dtype(256, torch.bfloat16) == torch.bfloat16 and count_dtype(257, torch.bfloat16) == torch.float32


def test_the_cg_group_progress_moves_within_one_chunk_as_groups_converge(problem):
    batch, design = problem
    reports = []
    loop = ChunkLoop(OomConfig(), OomLog(), MemoryTracker(None, 1.1),
                     progress=lambda phase, done, total: reports.append((phase, done, total)))
    plan = plan_of("cg", ChunkPlan(4, 100, 0), ChunkPlan(4, 100, 0), True)
    solver = SolverConfig(tol=1e-10, max_iter=5000, preconditioner=Preconditioner.jacobi)
    # group 0 starts at its solution, so it converges at once while the others iterate (on any CPU: how
    # many iterations the others take depends on the machine's rounding)
    initial = torch.zeros(len(batch.groups), design.width, dtype=torch.float64)
    initial[0] = torch.as_tensor(reference_coefficients(batch, design)[0])
    Dispatcher(design, DeviceManager("cpu"), plan, solver, loop, initial).fit(batch)
    done = [d for phase, d, total in reports if phase == "fit/cg" and total == 4]
    assert done == sorted(done) and done[-1] == 4 and done.count(4) == 1  # the chunk's own report ends it
    assert any(0 < d < 4 for d in done)  # not 0/4 until the whole solve is over
