"""On a CUDA device: the same run on the GPU equals the CPU run. Skipped cleanly without CUDA."""

from __future__ import annotations

import pytest
import torch

from tamrun.runner import run

from conftest import csv_overrides

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("solver", ["direct", "cg"])
def test_cuda_run_equals_cpu_run(compose_cfg, csv_path, solver):
    extra = ["solver.tol=1e-12"] if solver == "cg" else []
    cpu = run(compose_cfg(*csv_overrides(csv_path), "hw=cpu", f"solver={solver}", *extra))
    gpu = run(compose_cfg(*csv_overrides(csv_path), "hw=cuda", f"solver={solver}", *extra))
    rel = torch.linalg.vector_norm(gpu.coef - cpu.coef, dim=1) / torch.linalg.vector_norm(cpu.coef, dim=1)
    assert float(rel.max()) <= 1e-9
    assert gpu.metrics["peak_memory_fit_bytes"] > 0


def test_national_fourier_on_cuda(compose_cfg):
    result = run(compose_cfg("hw=cuda"))
    assert result.metrics["rmse_test"] <= 1.02 * 1659.2


def test_kalman_filters_on_cuda_equal_the_cpu_ones(compose_cfg, csv_path):
    """adaptive.method=kalman on the GPU: the same day-ahead forecasts as on the CPU (float64, 1e-9 relative)."""
    kalman = ["mode=adaptive", "adaptive.method=kalman", "adaptive.kalman.q=[1e-3]", "tracking=none"]
    cpu = run(compose_cfg(*csv_overrides(csv_path), "hw=cpu", *kalman))
    gpu = run(compose_cfg(*csv_overrides(csv_path), "hw=cuda", *kalman))
    expected, got = cpu.predictions["adaptive"].to_numpy(), gpu.predictions["adaptive"].to_numpy()
    assert abs(got - expected).max() <= 1e-9 * abs(expected).max()
