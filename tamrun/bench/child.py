"""One benchmark run in a fresh process; prints one line ``BENCH_RESULT {json}``.

Run by the benchmark as ``python -m tamrun.bench.child --side tamrun ...`` (tamrun's environment) or
``<peer python> child.py --side peer ...`` (the peer's environment, where tamrun is not installed:
this file therefore imports nothing from tamrun at module level).

Both sides measure the same window: after imports, data loading and the split (the baseline), the
fit, then the prediction of the test year. Peak memory is the peak RSS above that baseline on the
CPU (Linux VmHWM, reset at the baseline) and torch.cuda.max_memory_allocated on CUDA.

tamrun's side runs what ``python -m tamrun`` runs, with the default settings: the collector paused
during the imports (`tamrun.process.collector`), `prepare` (the data and features phases, the plan), the solve
phase of `tamrun.jobs.fit` (metered with memory.meter) and a predict phase of the test year; its fit is
the command's ``fit=`` (the features and solve phases). ``--bare`` times `tamrun.pipeline.fit_model`
called directly instead (no phases, no meter, no guard's budget): the benchmark's second column.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from typing import Callable, Dict, Optional, Tuple

import numpy as np

RESULT_PREFIX = "BENCH_RESULT "
# The embedded file's made columns (tamrun/data/national/README.md): the peer reads them from the file, so
# tamrun's side reads them too, not the ones it derives (conf/derived/national.yaml): both fit the same inputs.
SHIPPED_COLUMNS = ("tod", "Load_d1", "Load_d7", "temperature_smooth_950", "temperature_smooth_990",
                   "temperature_max_smooth_990", "temperature_min_smooth_950", "toy", "day_type_week", "day_type_jf")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakMeter:
    """Peak memory above a baseline: RSS high-water mark on the CPU, max allocated on CUDA."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.baseline = 0
        self.windows_peak = 0  # the peaks of windows the run itself opened since `start` (absolute)

    def include(self, peak: int) -> None:
        """A peak measured in a window the run opened itself: the run's profiler resets the same
        high-water mark (VmHWM, the allocator's peak) at each of its phases."""
        self.windows_peak = max(self.windows_peak, int(peak))

    def start(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # reset VmHWM to the current RSS
            self.baseline = _status_bytes("VmRSS")

    def peak_above_baseline(self) -> int:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return max(int(torch.cuda.max_memory_allocated()), self.windows_peak) - self.baseline
        return max(_status_bytes("VmHWM"), self.windows_peak) - self.baseline


def _metrics(actual: np.ndarray, predicted: np.ndarray) -> Dict[str, float]:
    err = actual - predicted
    return {"rmse": float(np.sqrt(np.mean(err ** 2))), "mape": float(100 * np.mean(np.abs(err / actual)))}


def _timed(fn: Callable[[], object], device: str) -> Tuple[object, float]:
    import torch

    began = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - began


def tamrun_config(args: argparse.Namespace):
    """tamrun's typed config and effect specs for this run (tracking off, the cap as memory.limit; on the embedded
    table its made columns read from the file, as the peer reads them: `SHIPPED_COLUMNS`)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from tamrun.config.load import config_dir, typed_config
    from tamrun.config.store import register_configs

    overrides = [f"model={args.model}", f"hw={args.device}", "tracking=none", f"dtype={args.dtype}", *args.override]
    if args.cap is not None and args.device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        overrides.append(f"memory.limit={int(args.cap * total)}")  # the cap as a tamrun user states it
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    if cfg.data.source == "embedded":
        with open_dict(cfg):
            for name in SHIPPED_COLUMNS:
                cfg.data.derived.pop(name, None)
    return typed_config(cfg)


def run_tamrun(args: argparse.Namespace, meter: PeakMeter) -> Dict[str, object]:
    """The run's path (module docstring); ``--bare``: `run_tamrun_bare`."""
    from tamrun.machine.threads import apply_wait_policy

    apply_wait_policy(None)  # as the entry point on idle cores: before torch loads (tamrun/machine/threads.py)
    if args.bare:
        return run_tamrun_bare(args, meter)
    from tamrun.process.collector import ImportPause

    imports = ImportPause()  # as the entry point: the collector off until the libraries are loaded
    import torch

    from tamrun.device.manager import DeviceManager
    from tamrun.fit.evaluate import scored, split_scores
    from tamrun.jobs.fit import fit_seconds, solve_phase
    from tamrun.jobs.prepare import prepare
    from tamrun.pipeline import DTYPES

    config, specs = tamrun_config(args)
    torch.manual_seed(config.seed)
    devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
    with devices.session(), devices.oom_refused(config.memory.safety_margin_bytes):
        prepared = prepare(config, specs, devices, libraries_loaded=imports.settle, data_loaded=meter.start)
        fit = solve_phase(prepared)
        with prepared.recorder.phase("predict", prepared.metered):
            predicted = fit.predict(prepared.test, "test")
    for name in ("features", "solve", "predict"):  # the phases after the baseline (each reset the peak)
        meter.include(prepared.recorder.phases[name].peak_bytes)
    scores = split_scores("test", *scored(prepared.test, predicted))
    out = {"fit_seconds": fit_seconds(prepared.recorder), "predict_seconds": prepared.recorder.phases["predict"].seconds,
           "route": fit.plan.route, "width": fit.model.design.width, "setup_seconds": fit.stats.setup_seconds,
           "solve_seconds": fit.stats.solve_seconds, "rmse": scores["rmse_test"], "mape": scores["mape_test"]}
    if fit.plan.route == "cg":
        out.update(cg_iterations=fit.stats.cg_iterations, cg_residual=fit.stats.cg_final_residual)
    return out


def run_tamrun_bare(args: argparse.Namespace, meter: PeakMeter) -> Dict[str, object]:
    """`tamrun.pipeline.fit_model` called directly (no phases, no meter, no budget), then the test year."""
    from tamrun.device.manager import DeviceManager
    from tamrun.memory.guard import ChunkLoop, OomLog, oom_settings
    from tamrun.machine.tracker import MemoryTracker
    from tamrun.pipeline import DTYPES, fit_model, load_splits

    config, specs = tamrun_config(args)
    devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
    splits = load_splits(config, specs)
    devices.enforce_limit(config.memory.limit_bytes)
    loop = ChunkLoop(oom_settings(config.memory.oom), OomLog(), MemoryTracker(None, config.memory.overhead_factor),
                     devices.empty_cache)
    meter.start()
    fit, fit_seconds = _timed(lambda: fit_model(config, specs, splits, devices, loop), args.device)
    table, predict_seconds = _timed(lambda: fit.predict_frame(splits.test, "test"), args.device)
    out = {"fit_seconds": fit_seconds, "predict_seconds": predict_seconds, "route": fit.plan.route,
           "width": fit.model.design.width, "setup_seconds": fit.stats.setup_seconds,
           "solve_seconds": fit.stats.solve_seconds, **_metrics(table["actual"].to_numpy(), table["predicted"].to_numpy())}
    if fit.plan.route == "cg":
        out.update(cg_iterations=fit.stats.cg_iterations, cg_residual=fit.stats.cg_final_residual)
    return out


def run_peer(args: argparse.Namespace, meter: PeakMeter) -> Dict[str, object]:
    import pandas as pd
    import torch

    with contextlib.redirect_stdout(sys.stderr):  # the peer prints a hardware banner at import
        import tam
        import tam.model._dispatcher as dispatcher
    seen: Dict[str, object] = {"route": "direct"}
    solve_cg = dispatcher.solve_sparse_cg

    def counting_cg(compute_Av, b, x0=None, tol=1e-4, max_iter=1000):  # noqa: N803 - the peer passes keywords
        calls = [0]

        def av(v):
            calls[0] += 1
            return compute_Av(v)

        cap = args.peer_max_iter if args.peer_max_iter is not None else max_iter
        x = solve_cg(av, b, x0=x0, tol=tol, max_iter=cap)
        residual = torch.linalg.vector_norm(b - compute_Av(x)) / torch.linalg.vector_norm(b).clamp_min(1e-300)
        seen.update(route="cg", cg_iterations=calls[0] - 1, cg_residual=float(residual), cg_max_iter=cap)
        return x

    dispatcher.solve_sparse_cg = counting_cg  # observe (and optionally cap) the peer's CG, unchanged otherwise
    frame = pd.read_csv(args.data, parse_dates=[args.date]).sort_values(args.date, kind="stable").reset_index(drop=True)
    frame["day_type_week_sat_sun"] = frame["day_type_week"].isin([5, 6]).astype(float)
    frame["trend"] = np.arange(len(frame), dtype=float)
    dates = frame[args.date]
    train = frame[dates < pd.Timestamp(args.test_start)]
    test = frame[(dates >= pd.Timestamp(args.test_start)) & (dates < pd.Timestamp(args.test_end))]
    if args.cap is not None and args.device == "cuda":
        torch.cuda.set_per_process_memory_fraction(args.cap)
    meter.start()
    model = tam.StaticTAM(formula=args.formula, date_col=args.date, group_col=args.group)
    _, fit_seconds = _timed(lambda: model.fit(train), args.device)
    predicted, predict_seconds = _timed(lambda: model.predict(test)["EstimatedLoad"].to_numpy(), args.device)
    return {"fit_seconds": fit_seconds, "predict_seconds": predict_seconds, **seen,
            **_metrics(test[args.target].to_numpy(), np.asarray(predicted, dtype=float))}


def parse_arguments(argv: Optional[list] = None) -> argparse.Namespace:
    """The child's command line (also `tamrun.bench.cpu_profile`'s fit: ``--side tamrun --bare``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--side", choices=["tamrun", "peer"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--cap", type=float, default=None)
    parser.add_argument("--formula", default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--date", default="date")
    parser.add_argument("--group", default="tod")
    parser.add_argument("--target", default="Load")
    parser.add_argument("--test-start", default="2024-01-01")
    parser.add_argument("--test-end", default="2025-01-01")
    parser.add_argument("--peer-max-iter", type=int, default=None)
    parser.add_argument("--override", action="append", default=[], help="a tamrun override (repeatable)")
    parser.add_argument("--bare", action="store_true", help="tamrun: time fit_model directly (the second column)")
    return parser.parse_args(argv)


def main(argv: Optional[list] = None) -> int:
    args = parse_arguments(argv)
    meter = PeakMeter(args.device)
    try:
        import torch

        if args.side == "peer":
            torch.set_default_dtype(torch.float64 if args.dtype == "float64" else torch.float32)
        out = (run_tamrun if args.side == "tamrun" else run_peer)(args, meter)
        out.update(status="ok", peak_bytes=meter.peak_above_baseline())
    except BaseException as exc:  # a crash is a recorded outcome, not a benchmark failure
        traceback.print_exc(file=sys.stderr)
        out = {"status": "error", "error_kind": type(exc).__name__,
               "error": (str(exc).splitlines() or [""])[0][:300]}
        if meter.baseline:
            out["peak_bytes"] = meter.peak_above_baseline()
    sys.stdout.write(RESULT_PREFIX + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
