"""For .ci/gpu (issue: GPU speed): where a fit's GPU time goes, per preset given on the command line.

For each preset, in this one process: the first fit (its data read inside the device's session, as a run
reads it, while the GPU libraries warm; the first preset's is the process's first use of the GPU), a warm fit, then
a profiled warm fit (torch.profiler, CPU + CUDA): kernel time, launches, host synchronisations and
transfers, the top kernels, and the CG iterations' cost."""
import sys
import time
from contextlib import ExitStack

import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

from tamrun.config.load import config_dir, typed_config
from tamrun.config.store import register_configs
from tamrun.device.manager import DeviceManager
from tamrun.memory.guard import ChunkLoop, OomLog, oom_settings
from tamrun.machine.tracker import MemoryTracker
from tamrun.pipeline import DTYPES, fit_model, load_splits

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
               "cudaMemcpy", "cudaLaunchKernel", "cuLaunchKernel", "cudaMalloc", "cudaFree")


def fitter(model, session: ExitStack):
    """A fit of ``model`` on cuda, its data read inside the device's session as a run reads it (the GPU
    libraries warm meanwhile: `tamrun.device.manager.libraries_warming`)."""
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", "hw=cuda", "tracking=none"])
    config, specs = typed_config(cfg)
    devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
    began = time.perf_counter()
    session.enter_context(devices.session())
    splits = load_splits(config, specs)
    print(f"{model}: data read in {time.perf_counter() - began:.3f} s beside the warm-up")

    def fit():
        loop = ChunkLoop(oom_settings(config.memory.oom), OomLog(), MemoryTracker(None, config.memory.overhead_factor),
                         devices.empty_cache)
        torch.cuda.synchronize()
        began = time.perf_counter()
        result = fit_model(config, specs, splits, devices, loop)
        torch.cuda.synchronize()
        return result, time.perf_counter() - began
    return fit


for model in sys.argv[1:]:
    session = ExitStack()  # the first model's session warms the libraries; the later ones find them warm
    fit = fitter(model, session)
    cold, cold_s = fit()
    warm, warm_s = fit()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        profiled, prof_s = fit()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_us = sum(e.self_device_time_total for e in kernels)
    launches = sum(e.count for e in kernels)
    stats = warm.stats
    print(f"## {model}: route {warm.plan.route}, D={warm.model.design.width}; first fit {cold_s:.3f} s, warm fit "
          f"{warm_s:.3f} s (setup {stats.setup_seconds:.3f} + solve {stats.solve_seconds:.3f}), profiled {prof_s:.3f} s; "
          f"CG iterations {stats.cg_iterations}")
    print(f"GPU kernel time {kernel_us / 1e3:.1f} ms in {launches} kernel executions; "
          f"peak allocated {torch.cuda.max_memory_allocated(torch.device('cuda', 0)) / 2**20:.0f} MiB")
    if stats.cg_iterations:
        per = max(1, stats.cg_iterations)
        print(f"per CG iteration: {1e3 * stats.solve_seconds / per:.3f} ms of solve wall, "
              f"{launches / per:.1f} kernel executions and {kernel_us / 1e3 / per:.3f} ms of kernels (whole fit / iterations)")
    for name in SYNC_EVENTS:
        found = [e for e in events if e.key == name]
        if found:
            print(f"  {name}: {sum(e.count for e in found)} calls, {sum(e.cpu_time_total for e in found) / 1e3:.1f} ms host")
    print(events.table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    session.close()
    sys.stdout.flush()
