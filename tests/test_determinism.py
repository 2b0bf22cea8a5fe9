"""Same config and seed -> bitwise-equal coefficients and metrics on the CPU (in one process here;
across processes in tests/test_concurrency.py). On CUDA (skipped without it): bitwise with
hw.deterministic=true; without it within 1e-10 on the direct route and within CG's tolerance on CG."""

from __future__ import annotations

import pytest
import torch

from tamrun.runner import run

from conftest import csv_overrides

# Forests and a forest x Fourier crossing: leaf indices, CSR products and the index_add_ of
# IndexedBlock.cross_indexed (two indexed blocks) all take part.
FORESTS = ["+model.effects.f1={kind: forest, column: x, others: [dow], n_trees: 6, max_depth: 3}",
           "+model.effects.f2={kind: forest, column: x, n_trees: 4, max_depth: 2, seed: 7}",
           "+model.effects.fx={kind: crossing, left: {kind: forest, column: x, n_trees: 3, max_depth: 2},"
           " right: {kind: fourier, column: dow, m: 2}}"]
CONFIGS = {"spline-direct": ["solver=direct"], "spline-cg": ["solver=cg", "solver.preconditioner=jacobi"],
           "forests-direct": ["solver=direct", *FORESTS], "forests-cg": ["solver=cg", *FORESTS]}


def comparable(metrics: dict) -> dict:
    """The metrics that depend on the numbers only (not on the clock, its price or the process's memory)."""
    measured = ("seconds", "bytes", "mib", "utilisation", "working_peak_ratio", "cost")  # cost: seconds x a price
    return {k: v for k, v in metrics.items() if not any(w in k for w in measured)}


def _twice(compose_cfg, csv_path, extra, device="cpu"):
    overrides = [*csv_overrides(csv_path), "tracking=none", "seed=3", f"hw={device}", *extra]
    return run(compose_cfg(*overrides)), run(compose_cfg(*overrides))


@pytest.mark.parametrize("name", CONFIGS)
def test_same_config_and_seed_give_bitwise_equal_results_on_cpu(compose_cfg, csv_path, name):
    first, second = _twice(compose_cfg, csv_path, CONFIGS[name])
    assert first.coef.dtype == torch.float64 and first.coef.abs().sum() > 0
    assert torch.equal(first.coef, second.coef)
    assert comparable(first.metrics) == comparable(second.metrics)
    assert "rmse_test" in comparable(first.metrics)
    assert first.predictions["predicted"].equals(second.predictions["predicted"])


def test_another_seed_changes_the_forests(compose_cfg, csv_path):
    """The test above can fail: the forests do depend on the seed."""
    overrides = [*csv_overrides(csv_path), "tracking=none", "solver=direct", *FORESTS]
    a, b = run(compose_cfg(*overrides, "seed=3")), run(compose_cfg(*overrides, "seed=4"))
    assert not torch.equal(a.coef, b.coef)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", ["forests-direct", "forests-cg"])
def test_same_config_and_seed_on_cuda(compose_cfg, csv_path, name, deterministic):
    """hw.deterministic=true: bitwise. Without it, GPU sums add in a varying order: the direct route's
    coefficients agree within 1e-10; CG stops each run at its own iterate within solver.tol (1e-6), so
    its coefficients agree to about the tolerance (2e-7 measured on an H100) and its test RMSE to 1e-6."""
    first, second = _twice(compose_cfg, csv_path, [*CONFIGS[name], f"hw.deterministic={str(deterministic).lower()}"],
                           device="cuda")
    if deterministic:
        assert torch.equal(first.coef, second.coef)
        assert comparable(first.metrics) == comparable(second.metrics)
    rel = torch.linalg.vector_norm(first.coef - second.coef, dim=1) / torch.linalg.vector_norm(second.coef, dim=1)
    assert float(rel.max()) <= (1e-10 if name.endswith("direct") else 1e-5)
    assert first.metrics["rmse_test"] == pytest.approx(second.metrics["rmse_test"], rel=1e-6)
