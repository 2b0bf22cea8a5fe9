"""Batched solvers against float64 LAPACK references (numpy.linalg.solve)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from tamrun.solve.cg import conjugate_gradient
from tamrun.solve.direct import cholesky_solve


def random_spd(groups: int, dim: int, seed: int, cond_scale: float = 1.0) -> tuple:
    rng = np.random.default_rng(seed)
    phi = rng.normal(size=(groups, 3 * dim, dim)) * np.logspace(0, np.log10(cond_scale), dim)
    a = phi.transpose(0, 2, 1) @ phi / (3 * dim) + 1e-3 * np.eye(dim)
    b = rng.normal(size=(groups, dim))
    return a, b


def test_cholesky_matches_lapack_float64():
    a, b = random_spd(6, 40, seed=1, cond_scale=100.0)
    x, stats = cholesky_solve(torch.tensor(a), torch.tensor(b), jitter=0.0, growth=10.0, max_tries=4)
    reference = np.linalg.solve(a, b[..., None])[..., 0]
    rel = np.linalg.norm(x.numpy() - reference, axis=1) / np.linalg.norm(reference, axis=1)
    assert rel.max() <= 1e-8
    assert stats.jitter_escalations == 0 and stats.lu_fallback_groups == 0


def test_cholesky_escalates_jitter_on_a_singular_group(caplog):
    a, b = random_spd(3, 8, seed=2)
    a[1] = np.zeros((8, 8))
    a[1][:4, :4] = np.eye(4)  # rank 4: Cholesky fails without extra jitter
    with caplog.at_level(logging.WARNING):
        x, stats = cholesky_solve(torch.tensor(a), torch.tensor(b), jitter=1e-6, growth=10.0, max_tries=4)
    assert stats.jitter_escalations >= 1 and stats.lu_fallback_groups == 0
    assert "solver.jitter_max_tries" in caplog.text
    # the healthy groups are untouched by the escalation
    for g in (0, 2):
        np.testing.assert_allclose(x[g].numpy(), np.linalg.solve(a[g], b[g]), rtol=1e-9)
    assert torch.isfinite(x).all()


def test_cholesky_falls_back_to_lu_when_jitter_is_not_enough(caplog):
    a, b = random_spd(2, 5, seed=3)
    a[0] = -np.eye(5)  # negative definite: no bounded jitter makes it SPD; LU solves it exactly
    with caplog.at_level(logging.WARNING):
        x, stats = cholesky_solve(torch.tensor(a), torch.tensor(b), jitter=1e-6, growth=10.0, max_tries=2)
    assert stats.lu_fallback_groups == 1
    assert "LU" in caplog.text
    np.testing.assert_allclose(x[0].numpy(), -b[0], rtol=1e-12)
    np.testing.assert_allclose(x[1].numpy(), np.linalg.solve(a[1], b[1]), rtol=1e-9)


@pytest.mark.parametrize("jacobi", [True, False])
def test_cg_matches_direct(jacobi):
    a, b = random_spd(5, 30, seed=4, cond_scale=30.0)
    at, bt = torch.tensor(a), torch.tensor(b)
    inverse_diagonal = 1.0 / torch.diagonal(at, dim1=-2, dim2=-1)
    result = conjugate_gradient(lambda v: (at @ v.unsqueeze(-1)).squeeze(-1), bt,
                                (lambda r: r * inverse_diagonal) if jacobi else None,
                                tol=1e-13, max_iter=500)
    direct, _ = cholesky_solve(at, bt, jitter=0.0, growth=10.0, max_tries=4)
    assert bool(result.converged.all())
    rel = (torch.linalg.vector_norm(result.x - direct, dim=-1) / torch.linalg.vector_norm(direct, dim=-1)).max()
    assert float(rel) <= 1e-6
    assert result.history[0] == pytest.approx(1.0) and result.history[-1] <= 1e-13


def test_cg_convergence_mask_freezes_converged_groups():
    a, b = random_spd(2, 20, seed=5)
    a[0] = np.eye(20)  # converges in one iteration
    at, bt = torch.tensor(a), torch.tensor(b)
    result = conjugate_gradient(lambda v: (at @ v.unsqueeze(-1)).squeeze(-1), bt, None, tol=1e-12, max_iter=200)
    assert int(result.iterations[0]) == 1 and int(result.iterations[1]) > 1
    np.testing.assert_allclose(result.x[0].numpy(), b[0], rtol=1e-14)


def test_cg_warns_naming_max_iter_when_it_stops_early(caplog):
    a, b = random_spd(2, 30, seed=6, cond_scale=1000.0)
    at, bt = torch.tensor(a), torch.tensor(b)
    with caplog.at_level(logging.WARNING):
        result = conjugate_gradient(lambda v: (at @ v.unsqueeze(-1)).squeeze(-1), bt, None, tol=1e-14, max_iter=3)
    assert not bool(result.converged.all())
    assert "solver.max_iter=3" in caplog.text
