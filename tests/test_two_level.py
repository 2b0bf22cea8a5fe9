"""The two-level CG preconditioner (tamrun/solve/coarse.py) against dense float64 matrices.

Each piece is checked against the system written out densely (A = Phi'Phi/n + P + jitter I per group,
Z as a 0/1 matrix), then the CG it preconditions against the dense solve, and its purpose: far
fewer iterations than block-Jacobi on forests whose trees sum to the same function.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tamrun.config.effects import CrossingSpec, ForestSpec, FourierSpec, LinearSpec
from tamrun.config.schema import OomConfig, Preconditioner, SolverConfig
from tamrun.data.batch import build_batch
from tamrun.device.manager import DeviceManager
from tamrun.effects.design import AdditiveDesign
from tamrun.effects.registry import build_effects
from tamrun.memory.footprint import StepCost
from tamrun.memory.guard import ChunkLoop, OomLog
from tamrun.memory.oracle import ChunkPlan, Plan
from tamrun.machine.tracker import MemoryTracker
from tamrun.solve.assembly import CgSystem, system_scale
from tamrun.solve.coarse import GroupMatrices, accumulate_sources, coarse_correction, coarse_space
from tamrun.fit.dispatcher import Dispatcher

from conftest import synthetic_frame

JITTER = 1e-6


@pytest.fixture(scope="module")
def forest_crossing():
    """A forest x Fourier crossing of 8 trees with tiny margins' penalties (as in the forest_fourier
    preset), a plain forest and a linear effect: 3 groups of ~320 rows, D = 1 + 1 + 8 * 8 * 4 + 6 * 4."""
    frame = synthetic_frame(days=40, groups=3, seed=11)
    frame["x2"] = np.cos(frame["x"]) + 0.1 * np.arange(len(frame)) / len(frame)
    specs = {"lin": LinearSpec(column="x2", ap=-5.0),
             "cross": CrossingSpec(left=ForestSpec(column="x", others=["x2"], n_trees=8, max_depth=3, ap=-9.0),
                                   right=FourierSpec(column="x2", m=2, s=2.0, ap=-9.0), ap=-3.0),
             "forest": ForestSpec(column="x2", n_trees=6, max_depth=2, ap=-3.0)}
    batch = build_batch(frame, ["x", "x2"], "y", "g", torch.float64)
    design = AdditiveDesign(build_effects(specs, seed=3), ["x", "x2"], intercept=True, intercept_ap=-9.0).fit(batch)
    return batch, design


def dense_system(batch, design):
    """Per group (numpy float64): A (D, D) and b (D,) on the real rows."""
    penalty = design.penalty().numpy()
    systems = []
    for g in range(len(batch.groups)):
        real = batch.weight[g].numpy() > 0
        phi = design.design(batch.x[g:g + 1], slice(g, g + 1))[0].numpy()[real]
        n = real.sum()
        a = phi.T @ phi / n + penalty + JITTER * np.eye(phi.shape[1])
        systems.append((a, phi.T @ batch.y[g].numpy()[real] / n))
    return systems


def whole_system(batch, design, preconditioner="two_level"):
    penalty = design.penalty_operator()
    solver = SolverConfig(jitter=JITTER, preconditioner=Preconditioner(preconditioner))
    groups = slice(0, len(batch.groups))
    return CgSystem(design, batch, groups, torch.device("cpu"), batch.x.shape[1], True, penalty, solver), penalty


def test_the_coarse_pieces_equal_the_dense_products(forest_crossing):
    """Z is 0/1 with disjoint columns; A Z c, (A Z)' y and E^-1 = (Z' A Z)^-1 match the dense
    matrices to 1e-10 relative (E^-1: 1e-7, E's condition is ~1e6 here)."""
    batch, design = forest_crossing
    system, penalty = whole_system(batch, design)
    chunk = system.cached[0]
    space = coarse_space(chunk)
    n = system_scale(batch, slice(0, len(batch.groups)), torch.device("cpu")).view(-1, 1, 1)
    sources = accumulate_sources(None, chunk)
    sources.matrices.div_(n)
    correction = coarse_correction(chunk, sources, penalty, JITTER)
    assert correction is not None
    z = space.prolong(torch.eye(space.size, dtype=torch.float64)).T.numpy()  # (D, k)
    assert z.shape == (design.width, space.size)
    assert set(np.unique(z)) == {0.0, 1.0} and (z.sum(axis=1) == 1).all()  # every column in exactly one
    assert space.size == 2 + 8 * 4 + 6  # dense (intercept, linear), 8 trees x 4 Fourier columns, 6 trees
    rng = np.random.default_rng(0)
    c = torch.as_tensor(rng.normal(size=(len(batch.groups), space.size)))
    y = torch.as_tensor(rng.normal(size=(len(batch.groups), design.width)))
    assert torch.equal(space.prolong(c), c[:, space.assignment])  # the broadcast copy is the gather
    for g, (a, _) in enumerate(dense_system(batch, design)):
        az = a @ z
        np.testing.assert_allclose(correction.a_z(c)[g].numpy(), az @ c[g].numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(correction.a_z_transposed(y)[g].numpy(), az.T @ y[g].numpy(), rtol=1e-10,
                                   atol=1e-12)
        expected = np.linalg.inv(z.T @ az)
        assert np.abs(correction.inverse.matrices[g].numpy() - expected).max() <= 1e-7 * np.abs(expected).max()


@pytest.mark.parametrize("rows,columns", [(23, 7691), (251, 251), (3, 5)])
def test_group_matrices_products_match_float64_and_not_the_groups_chunk(rows, columns):
    """GroupMatrices' products M_i v_i and M_i' u_i equal numpy's float64 products to 1e-12 relative;
    and a group's result is the same to the bit in a chunk of one, of every group, or shifted by one
    group (a memory cap changes which groups share a chunk): H of forest x Fourier's shape (S, D), E^-1's
    (k, k), and a product small enough for torch's own loop."""
    rng = np.random.default_rng(rows)
    groups = 5
    stacked = torch.as_tensor(rng.normal(size=(groups, rows, columns)))
    v = torch.as_tensor(rng.normal(size=(groups, columns)))
    u = torch.as_tensor(rng.normal(size=(groups, rows)))
    whole = GroupMatrices.of(stacked)
    assert torch.equal(whole.matrices, stacked)
    assert whole.padded.shape[-1] % 8 == 0 and whole.padded.shape[-2] % 8 == 0
    times, transposed = whole.times(v), whole.transposed_times(u)
    expected = np.einsum("gmp,gp->gm", stacked.numpy(), v.numpy())
    np.testing.assert_allclose(times.numpy(), expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
    expected = np.einsum("gmp,gm->gp", stacked.numpy(), u.numpy())
    np.testing.assert_allclose(transposed.numpy(), expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
    shifted = GroupMatrices.of(stacked[1:])
    assert torch.equal(shifted.times(v[1:]), times[1:])
    assert torch.equal(shifted.transposed_times(u[1:]), transposed[1:])
    for g in range(groups):
        alone = GroupMatrices.of(stacked[g:g + 1])
        assert torch.equal(alone.times(v[g:g + 1])[0], times[g]), g
        assert torch.equal(alone.transposed_times(u[g:g + 1])[0], transposed[g]), g


def test_the_two_level_preconditioner_is_the_balancing_one_and_its_start_deflates(forest_crossing):
    """What CG applies against the balancing preconditioner B = (I - QA) M^-1 (I - AQ) + Q,
    Q = Z E^-1 Z', written out densely from block-Jacobi's M^-1: B is symmetric positive definite, the
    applied preconditioner equals B on a random vector (1e-8 relative), and CG's start x0 = Q b leaves
    a residual with Z' r = 0 (to 1e-10 relative)."""
    batch, design = forest_crossing
    two_level, _ = whole_system(batch, design)
    one_level, _ = whole_system(batch, design, "block_jacobi")
    space, groups = two_level.coarse.space, len(batch.groups)
    z = space.prolong(torch.eye(space.size, dtype=torch.float64)).T.numpy()  # (D, k)
    eye = torch.eye(design.width, dtype=torch.float64)

    def dense(operator, g):  # column i: operator(e_i) of group g
        return torch.stack([operator(eye[i].expand(groups, -1).clone())[g] for i in range(design.width)], 1).numpy()

    start = two_level.start(None).numpy()
    rng = np.random.default_rng(1)
    for g, (a, b) in enumerate(dense_system(batch, design)):
        q = z @ np.linalg.inv(z.T @ a @ z) @ z.T
        m = dense(one_level.preconditioner, g)
        balancing = (np.eye(len(b)) - q @ a) @ m @ (np.eye(len(b)) - a @ q) + q
        assert np.abs(balancing - balancing.T).max() <= 1e-8 * np.abs(balancing).max()
        assert np.linalg.eigvalsh((balancing + balancing.T) / 2).min() > 0
        assert np.linalg.norm(z.T @ (b - a @ start[g])) <= 1e-10 * np.linalg.norm(z.T @ b)
        r = rng.normal(size=len(b))
        applied = two_level.preconditioner(torch.as_tensor(np.tile(r, (groups, 1))))[g].numpy()
        assert np.linalg.norm(applied - balancing @ r) <= 1e-8 * np.linalg.norm(balancing @ r)


def fit_cg(batch, design, preconditioner, groups):
    plan = Plan(route="cg", reason="test", fit=ChunkPlan(groups, 97, 0), predict=ChunkPlan(groups, 97, 0),
                cache_design=True, budget=0, free=0, predicted_peak=0, minimal_limit=0, fit_cost=StepCost(0, 0),
                predict_cost=StepCost(0, 0), overhead=1.1, chunk_fraction=0.7, predict_output=0, dual=False)
    solver = SolverConfig(jitter=JITTER, tol=1e-10, max_iter=50_000, preconditioner=Preconditioner(preconditioner))
    loop = ChunkLoop(OomConfig(), OomLog(), MemoryTracker(None, 1.1))
    coef, stats = Dispatcher(design, DeviceManager("cpu"), plan, solver, loop).fit(batch)
    return coef.numpy(), stats


def test_two_level_cg_solves_the_system_in_far_fewer_iterations(forest_crossing):
    """Both preconditioners reach the dense solution: relative residual of the dense system <= 2e-10
    (CG stops at 1e-10), coefficients within 1e-4 (the system's condition is ~1e6); the coarse
    correction at least halves block-Jacobi's iterations on this forest crossing (measured: see
    docs/benchmarks.md for the national data), and a chunk of one group gives bitwise the same."""
    batch, design = forest_crossing
    systems = dense_system(batch, design)
    exact = np.stack([np.linalg.solve(a, b) for a, b in systems])
    results = {p: fit_cg(batch, design, p, groups=3) for p in ("block_jacobi", "two_level")}
    for name, (coef, stats) in results.items():
        assert stats.cg_unconverged_groups == 0, name
        residual = [np.linalg.norm(a @ x - b) / np.linalg.norm(b) for (a, b), x in zip(systems, coef)]
        assert max(residual) <= 2e-10, (name, residual)
        error = np.linalg.norm(coef - exact, axis=1) / np.linalg.norm(exact, axis=1)
        assert error.max() <= 1e-4, (name, error)
    assert results["two_level"][1].cg_iterations * 2 <= results["block_jacobi"][1].cg_iterations, \
        {p: s.cg_iterations for p, (_, s) in results.items()}
    alone, _ = fit_cg(batch, design, "two_level", groups=1)
    np.testing.assert_array_equal(alone, results["two_level"][0])


def test_auto_takes_the_dual_form_uncapped_and_cg_under_a_cap_with_the_same_fit():
    """N < D with solver.direct_max_dim raised: solver=auto factors the N x N dual system when memory
    allows; under a memory.limit where the dual form's smallest chunk does not fit (halfway between CG's
    minimal limit and the dual form's), it takes two-level CG. The CG coefficients solve the dense system to the tolerance
    (relative residual <= tol), so the fitted values equal the dual form's within what the tolerance
    leaves: 1e-3 relative at the default 1e-6 (this system's condition is ~1e9; measured 1.0e-4), and
    1e-7 at tol = 1e-12 (the gap closes with the tolerance: it is CG's, not a different answer)."""
    from tamrun.config.schema import MemoryConfig
    from tamrun.memory.footprint import problem_size
    from tamrun.memory.oracle import MemoryOracle

    frame = synthetic_frame(days=12, groups=3, seed=4)
    frame["x2"] = np.sin(frame["x"] / 3)
    specs = {"cross": CrossingSpec(left=ForestSpec(column="x", others=["x2"], n_trees=8, max_depth=3, ap=-9.0),
                                   right=FourierSpec(column="x2", m=2, s=2.0, ap=-9.0), ap=-3.0)}
    batch = build_batch(frame, ["x", "x2"], "y", "g", torch.float64)
    design = AdditiveDesign(build_effects(specs, seed=1), ["x", "x2"], intercept=True, intercept_ap=-9.0).fit(batch)
    assert batch.x.shape[1] < design.width  # N < D
    size = problem_size(len(batch.groups), batch.x.shape[1], design, 8, SolverConfig())
    uncapped = MemoryOracle(MemoryConfig(), None, False, 10_000).plan(size, free=2**34, dual=True)
    assert uncapped.route == "direct" and uncapped.dual
    minimal = {route: MemoryOracle(MemoryConfig(), None, False).minimal_limit(size, dual=True, route=route)
               for route in ("cg", "direct")}
    assert minimal["cg"] < minimal["direct"]
    cap = (minimal["cg"] + minimal["direct"]) // 2  # CG's smallest chunk fits, the dual form's does not
    capped = MemoryOracle(MemoryConfig(), cap, False, 10_000).plan(size, free=2**34, dual=True)
    assert capped.route == "cg" and "smallest chunk does not fit" in capped.reason, capped.reason
    loop = ChunkLoop(OomConfig(), OomLog(), MemoryTracker(None, 1.1))
    phi = design.design(batch.x).numpy()
    fitted = {}
    for name, plan, tol in (("dual", uncapped, None), ("cg", capped, None), ("cg_tight", capped, 1e-12)):
        solver = SolverConfig(direct_max_dim=10_000, tol=tol, max_iter=20_000)
        beta = Dispatcher(design, DeviceManager("cpu"), plan, solver, loop).fit(batch)[0].numpy()
        for (a, b), coef in zip(dense_system(batch, design), beta):
            assert np.linalg.norm(a @ coef - b) <= (tol or 1e-6) * 1.01 * np.linalg.norm(b), name
        fitted[name] = np.einsum("gnd,gd->gn", phi, beta) * batch.weight.numpy()
    gap = {name: np.linalg.norm(fitted[name] - fitted["dual"]) / np.linalg.norm(fitted["dual"])
           for name in ("cg", "cg_tight")}
    assert gap["cg"] <= 1e-3 and gap["cg_tight"] <= 1e-7, gap
