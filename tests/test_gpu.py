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
    from tamrun.device.manager import DeviceManager
    from tamrun.memory.guard import ChunkLoop, OomLog, oom_settings
    from tamrun.machine.tracker import MemoryTracker
    from tamrun.pipeline import DTYPES, fit_model, load_splits
    from tamrun.machine.placement import tensors_in

    config, specs = typed_config(compose_cfg(*csv_overrides(csv_path), "hw=cuda", "tracking=none",
                                             "+model.effects.f={kind: forest, column: x, n_trees: 3, max_depth: 2}"))
    devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
    loop = ChunkLoop(oom_settings(config.memory.oom), OomLog(), MemoryTracker(None, 1.0), devices.empty_cache)
    fit = fit_model(config, specs, load_splits(config, specs), devices, loop)
    assert all(t.device.type == "cpu" for _, t in tensors_in(fit.model))
    on_gpu = fit.model.to(devices.device)
    assert all(t.device == devices.device for _, t in tensors_in(on_gpu))
    assert all(t.device.type == "cpu" for _, t in tensors_in(pickle.loads(pickle.dumps(on_gpu))))


def test_the_cuda_phase_peak_is_the_allocators_and_matches_the_tensor_meter():
    """On CUDA a metered phase's working peak is the allocator's peak above the phase's start (no dispatch
    hook): 8 MB alive, then 16 MB more, the 8 MB freed, 4 MB more -> a peak of 24 MB above what was held
    before, exactly by the tensor meter, and by the allocator up to its block rounding."""
    from tamrun.device.manager import DeviceManager
    from tamrun.memory.meter import TensorMeter
    from tamrun.device.profiler import PhaseRecorder

    from tamrun.config.schema import DeviceKind, HardwareConfig

    devices = DeviceManager.from_config(HardwareConfig(device=DeviceKind.cuda), torch.float64)
    assert devices.allocator_peaks

    def work():
        first = torch.ones(1_000_000, dtype=torch.float64, device=devices.device)  # 8 MB
        second = torch.ones(2_000_000, dtype=torch.float64, device=devices.device)  # 16 MB
        del first
        third = torch.ones(500_000, dtype=torch.float64, device=devices.device)  # 4 MB
        return float(second.sum() + third.sum())

    held = torch.ones(3_000_000, dtype=torch.float64, device=devices.device)  # alive before: not counted
    recorder = PhaseRecorder(devices)
    with recorder.phase("solve", metered=True):
        work()
    # the allocator counts its blocks: a block of 16 MB is the 16 MiB segment it was cut from when the rest
    # (under 1 MiB) is too small to split off, so each live block may count up to 1 MiB more
    assert 24_000_000 <= recorder.phases["solve"].working_peak <= 24_000_000 + 2 * 2**20
    with TensorMeter(sample=False, device_type="cuda") as meter:
        work()
    assert meter.peak == 24_000_000
    assert recorder.phases["solve"].start_bytes >= held.numel() * 8


def test_a_cuda_fits_working_peak_agrees_with_the_tensor_meter(compose_cfg, csv_path):
    """A whole CG fit on CUDA: the allocator's peak above the fit's start (what a run logs) against the tensor
    meter counting every GPU tensor of the same fit: at least the meter's, within 10 % and 4 MiB above it
    (the allocator counts whole blocks and library workspaces the meter does not see)."""
    from tamrun.config.load import typed_config
    from tamrun.device.manager import DeviceManager
    from tamrun.memory.guard import ChunkLoop, OomLog, oom_settings
    from tamrun.memory.meter import TensorMeter
    from tamrun.machine.tracker import MemoryTracker
    from tamrun.pipeline import DTYPES, fit_model, load_splits

    config, specs = typed_config(compose_cfg(*csv_overrides(csv_path), "hw=cuda", "tracking=none", "solver=cg"))
    devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
    splits = load_splits(config, specs)

    def fit():
        loop = ChunkLoop(oom_settings(config.memory.oom), OomLog(), MemoryTracker(None, 1.0), devices.empty_cache)
        return fit_model(config, specs, splits, devices, loop)

    fit()  # warm: the libraries' workspaces exist before the measured fits
    devices.synchronize()
    devices.reset_peak()
    start = devices.allocated()
    fit()
    devices.synchronize()
    by_allocator = devices.peak() - start
    with TensorMeter(sample=False, device_type="cuda") as meter:
        fit()
    assert meter.peak > 0
    assert meter.peak <= by_allocator <= 1.10 * meter.peak + 4 * 2**20


def test_float32_on_cuda_is_within_half_a_percent_of_float64(compose_cfg):
    """The national forest x Fourier preset in float32 on the GPU: test RMSE within 0.5 % of float64's."""
    f64 = run(compose_cfg("model=forest_fourier", "hw=cuda", "tracking=none"))
    f32 = run(compose_cfg("model=forest_fourier", "hw=cuda", "tracking=none", "dtype=float32"))
    assert abs(f32.metrics["rmse_test"] - f64.metrics["rmse_test"]) <= 0.005 * f64.metrics["rmse_test"]
