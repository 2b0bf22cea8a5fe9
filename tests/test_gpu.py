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
    assert gpu.metrics["peak_memory_solve_bytes"] > 0


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


def test_memory_limit_on_cuda_caps_the_allocator_and_fits_the_same_model(compose_cfg, csv_path):
    """memory.limit with hw=cuda sets the allocator's fraction on the indexed device (torch refuses an
    unindexed one) and the fit under it equals the CPU's."""
    cpu = run(compose_cfg(*csv_overrides(csv_path), "hw=cpu", "tracking=none"))
    gpu = run(compose_cfg(*csv_overrides(csv_path), "hw=cuda", "tracking=none", "memory.limit=256MiB"))
    rel = torch.linalg.vector_norm(gpu.coef - cpu.coef, dim=1) / torch.linalg.vector_norm(cpu.coef, dim=1)
    assert float(rel.max()) <= 1e-9
    assert gpu.metrics["peak_memory_solve_bytes"] <= 256 * 2**20


def test_a_gpu_fitted_model_holds_and_pickles_only_host_tensors(compose_cfg, csv_path):
    import pickle

    from tamrun.config.load import typed_config
    from tamrun.device import DeviceManager
    from tamrun.memory.guard import ChunkLoop, OomLog, oom_settings
    from tamrun.memory.tracker import MemoryTracker
    from tamrun.pipeline import DTYPES, fit_model, load_splits
    from tamrun.placement import tensors_in

    config, specs = typed_config(compose_cfg(*csv_overrides(csv_path), "hw=cuda", "tracking=none",
                                             "+model.effects.f={kind: forest, column: x, n_trees: 3, max_depth: 2}"))
    devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
    loop = ChunkLoop(oom_settings(config.memory.oom), OomLog(), MemoryTracker(None, 1.0), devices.empty_cache)
    fit = fit_model(config, specs, load_splits(config, specs), devices, loop)
    assert all(t.device.type == "cpu" for _, t in tensors_in(fit.model))
    on_gpu = fit.model.to(devices.device)
    assert all(t.device == devices.device for _, t in tensors_in(on_gpu))
    assert all(t.device.type == "cpu" for _, t in tensors_in(pickle.loads(pickle.dumps(on_gpu))))
