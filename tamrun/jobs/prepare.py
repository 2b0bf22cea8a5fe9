"""The preparation every job shares: the data and feature phases, the memory plan, and the run's
memory accounting (phase recorder, tracker, OOM log).

    prepare(config, specs, devices) -> Prepared
        data      load, derive, check, split (train / validation / test)          -> Splits
        features  training batch + fitted design; the test rows as a batch         -> Features, test batch
        plan      the oracle's route and chunks under memory.limit and the real limits -> Plan
                  and in each machine class's memory (tco.classes)                  -> [ClassFit]
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from tamrun.config.schema import Config
from tamrun.data.batch import GroupedBatch
from tamrun.data.chunks import GroupChunk
from tamrun.data.table import Table
from tamrun.data.load import frame_bytes
from tamrun.device.manager import DeviceManager
from tamrun.fit.fitted import prediction_batch
from tamrun.machine.host import release_freed_host_memory
from tamrun.memory.guard import ChunkLoop, HostRoomWatch, OomLog, ProgressCallback, no_progress, oom_settings
from tamrun.memory.meter import TensorMeter
from tamrun.memory.oracle import Plan
from tamrun.device.profiler import PhaseRecorder
from tamrun.machine.tracker import MemoryTracker
from tamrun.pipeline import Features, Splits, build_features, load_splits, plan_memory
from tamrun.tco.plan import ClassFit
from tamrun.tco.run import classes_of, measured_class


@dataclass
class Prepared:
    """Everything a job starts from.

    ``limit``: memory.limit in bytes (None: no cap); ``tracker``: the plan's budget under that limit
    or the real one that binds (unlimited when only the available RAM binds), which every chunk is
    charged to; ``oom_log``: the run's OOM events;
    ``recorder``: the phases and the memory timeline; ``metered``: the solve / predict / window phases
    count their tensor bytes (memory.meter, off when the meter could not warm up); ``classes``: the plan in
    each machine class's memory (`tamrun.tco.plan`), ``measured_on``: the class this run is measured on."""

    config: Config
    specs: Dict[str, Any]
    devices: DeviceManager
    splits: Splits
    features: Features
    test: GroupedBatch
    plan: Plan
    limit: Optional[int]
    recorder: PhaseRecorder
    tracker: MemoryTracker
    oom_log: OomLog
    metered: bool = False
    classes: List[ClassFit] = field(default_factory=list)
    measured_on: Optional[str] = None

    def chunk_loop(self, progress: ProgressCallback = no_progress,
                   tracker: Optional[MemoryTracker] = None) -> ChunkLoop:
        """A guarded chunk loop of this run (memory.oom settings, its OOM log, the memory timeline),
        charged to ``tracker`` (default: the run's)."""
        return ChunkLoop(oom_settings(self.config.memory.oom), self.oom_log, tracker or self.tracker,
                         self.devices.empty_cache, self.recorder.snapshot, progress, release_freed_host_memory)


def import_recording_libraries(config: Config) -> None:
    """Import now the libraries recording will use (matplotlib's Agg canvas for the plots, mlflow.pyfunc
    for the model), so that they are part of the planning baseline, not growth above the plan's budget.
    A run that records neither imports neither."""
    tracking = config.tracking
    if tracking.enabled and tracking.log_plots:
        importlib.import_module("matplotlib.backends.backend_agg")
        importlib.import_module("matplotlib.figure")
    if tracking.enabled and tracking.log_model:
        importlib.import_module("tamrun.tracking.pyfunc_model")


def prepare(config: Config, specs: Dict[str, Any], devices: DeviceManager, fitting: bool = True,
            libraries_loaded: Optional[Callable[[], None]] = None,
            data_loaded: Optional[Callable[[], None]] = None, chunk: Optional[GroupChunk] = None,
            table: Optional[Table] = None) -> Prepared:
    """The data and features phases and the plan. ``fitting``: a fit and its recording follow (False for
    ``mode=plan``): the tensor meter is warmed up first, so that its one-time cost is not charged to the
    first metered phase, and recording's libraries are imported (`import_recording_libraries`), both
    before the planning baseline is taken; then ``libraries_loaded`` is called. ``data_loaded`` is
    called after the data phase (the benchmark's baseline, `tamrun.bench.child`). ``chunk``: only these
    groups (a streamed run's chunk, `tamrun.jobs.stream`). ``table``: the table the job opened
    (`tamrun.data.table.Table`; None: opened by the data phase)."""
    if fitting:
        import_recording_libraries(config)
    metered = config.memory.meter and (TensorMeter.warm_up() if fitting and not devices.allocator_peaks else True)
    if libraries_loaded is not None:
        libraries_loaded()
    limit = config.memory.limit_bytes
    devices.enforce_limit(limit)
    room = HostRoomWatch(config.memory.safety_margin_bytes)
    room("loading the data")
    recorder = PhaseRecorder(devices, sample=config.memory.meter_sampling)
    with recorder.phase("data"):
        splits = load_splits(config, specs, room, chunk, table)
    if data_loaded is not None:
        data_loaded()
    return planned(config, specs, devices, splits, recorder, room, metered)


def planned(config: Config, specs: Dict[str, Any], devices: DeviceManager, splits: Splits, recorder: PhaseRecorder,
            room: HostRoomWatch, metered: bool, oom_log: Optional[OomLog] = None) -> Prepared:
    """The features phase and the plan of ``splits`` (`prepare`'s, and a refit's on its training rows
    and validation period together: `tamrun.jobs.refit`), under the run's ``recorder`` and ``oom_log``."""
    limit = config.memory.limit_bytes
    room("building the features", "batch", frame_bytes(splits.train))
    with recorder.phase("features"):
        features = build_features(config, specs, splits.train, room)
        test = prediction_batch(features.design, features.train.groups, splits.recipe, features.train.x.dtype,
                                splits.test)
    recorder.mark_planning()
    plan = plan_memory(config, features, devices, n_predict_rows=test.x.shape[1], n_scored_rows=splits.n_scored)
    # every chunk is charged to the plan's budget when a hard limit binds it (memory.limit, cgroup, rlimits)
    tracker = MemoryTracker(plan.budget if limit is not None or plan.hard_bound else None, plan.overhead)
    classes = classes_of(config, features, devices, test.x.shape[1], splits.n_scored)
    return Prepared(config, specs, devices, splits, features, test, plan, limit, recorder, tracker,
                    oom_log if oom_log is not None else OomLog(), metered, classes, measured_class(config, devices))
