"""A table larger than memory, run in chunks of groups (docs/memory.md, "More rows than memory").

    stream_plan(config, specs, devices, table) -> StreamPlan | None
        the table's rows (`Table.rows_bound`) x `stream_row_bytes` against the host's free memory (and
        memory.limit with memory.data_in_limit): None when it fits (the run reads it whole, `prepare`);
        else one scan of its group and date columns (`tamrun.data.table.Table.scan`) and the oracle's
        chunk of groups (`MemoryOracle.stream_chunk`)
    stream_job(stream, config, specs, devices, tracked) -> RunResult
        for each chunk: prepare (only its groups read) -> solve -> predict -> the checked metrics
        (`checked_metrics`, its unsupported groups withheld); its predictions appended to one Parquet file (a
        writer opened once), its per-group metrics, coefficients and withheld groups kept; at the end the
        share of withheld groups checked over every chunk (`require_whole`), each split's RMSE and MAPE from
        the sums over its chunks (`ScoreSums`), and the record.

Groups are independent systems, so a chunk's fit is the whole run's fit of those groups. What needs
every group at once is refused when the table must stream (`require_streamable`): GCV's pooled score
(model.penalties=gcv), forests and their crossings (grown on every group's rows), and the modes other than
run. Intervals are calibrated per group, so per chunk, unless a group has fewer calibration rows than
intervals.min_group_rows (its bands pool every group's residuals): refused then (`require_own_bands`).
Their coverage, width and pinball loss are means over a split's rows: summed over chunks weighted by rows.
A chunk's forecasts are measured against its own training target (`tamrun.fit.unsupported`; the whole table
is never in memory): with groups of very different levels, the groups withheld can differ from the whole run's.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pandas as pd
import torch

from tamrun.config.schema import Config, ModeName, PenaltyMode
from tamrun.data.chunks import GroupChunk, TableScan
from tamrun.data.table import Table
from tamrun.device.manager import DeviceManager
from tamrun.errors import ConfigError
from tamrun.fit.evaluate import ScoreSums, group_metrics, require_finite, scored
from tamrun.fit.unsupported import ARTIFACT as UNSUPPORTED_ARTIFACT, COLUMNS as UNSUPPORTED_COLUMNS
from tamrun.fit.unsupported import log_unsupported, n_unsupported, require_share
from tamrun.jobs.fit import (Evaluated, ScoredSplit, band_metrics, calibration_bands, calibration_split,
                             checked_metrics, evaluation_table, predict_splits, solve_phase)
from tamrun.jobs.prepare import prepare
from tamrun.jobs.record import coefficients_frame
from tamrun.jobs.result import RunResult
from tamrun.memory.footprint import stream_row_bytes
from tamrun.machine.host import release_freed_host_memory
from tamrun.machine.limits import binding_limit
from tamrun.memory.oracle import ChunkPlan, MemoryOracle
from tamrun.config.units import format_size
from tamrun.numbers import significant
from tamrun.pipeline import numerical_fix, read_columns, support_fix
from tamrun.solve.stats import FitStats
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)

INDEXED_KINDS = ("forest", "crossing")  # effects grown on every group's rows at once
PREDICTIONS_FILE = "predictions.parquet"


@dataclass(frozen=True)
class StreamPlan:
    """The table (opened once, `tamrun.data.table.Table`), its groups (`TableScan`) and the chunk of groups
    each step reads (``chunk.groups``)."""

    scan: TableScan
    chunk: ChunkPlan
    row_bytes: int
    table: Table

    @property
    def chunks(self) -> List[GroupChunk]:
        return self.scan.chunks(self.chunk.groups)

    def describe(self) -> str:
        """The plan's line: "data: streamed in N chunks of G groups ..."."""
        whole = self.scan.n_rows * self.row_bytes
        return (f"data: streamed in {len(self.chunks)} chunks of {self.chunk.groups} groups ({self.scan.n_rows} rows "
                f"of {len(self.scan.groups)} groups need about {format_size(whole)} at once; a chunk about "
                f"{format_size(self.chunk.bytes)})")


def table_row_bytes(config: Config, specs: Dict[str, Any], text_group: bool) -> int:
    """`stream_row_bytes` of the columns a run reads and derives (the group counted as text when
    ``text_group``)."""
    columns = read_columns(config, specs) | set(config.data.derived)
    text = int(text_group and config.data.group in columns)
    return stream_row_bytes(len(columns) - text, text, len(config.intervals.levels))


def stream_plan(config: Config, specs: Dict[str, Any], devices: DeviceManager, table: Table) -> Optional[StreamPlan]:
    """How ``table`` (the job's) is read: None when it fits whole (or has no groups to chunk), else the
    `StreamPlan`.

    A config that needs every group at once (`require_streamable`) is read whole under a real limit (the
    data phase refuses it, naming the limit, if it truly does not fit).

    Raises:
        ConfigError: memory.limit counts the data (memory.data_in_limit) and the table must stream, but the
            config needs every group at once (`require_streamable`).
        MemoryBudgetError: one group's rows do not fit.
    """
    data = config.data
    if not data.group:
        return None
    limit = config.memory.limit_bytes if config.memory.data_in_limit else None
    oracle = MemoryOracle(config.memory, limit, on_gpu=False)
    bound = binding_limit(config.memory.safety_margin_bytes)
    upper = table.rows_bound() * table_row_bytes(config, specs, True)
    if upper * config.memory.overhead_factor <= oracle.capped_free(bound.left):
        return None
    refusal: Optional[ConfigError] = None
    try:
        require_streamable(config, specs)
    except ConfigError as error:
        refusal = error
    if refusal is not None and limit is None:
        # a real limit binds (cgroup, rlimit, RAM): the table is read whole, and the data phase's own checks
        # refuse it naming that limit and the memory it needs if it truly does not fit
        log.warning("data: the table may not fit in the free memory, and this run cannot stream it (%s): it is "
                    "read whole", refusal)
        return None
    if refusal is not None and data.group in data.derived:  # its groups are not a column of the file to scan
        raise refusal
    scan = table.scan(table.window(config.split))
    release_chunk()  # what the scan read
    row_bytes = table_row_bytes(config, specs, bool(scan.groups) and isinstance(scan.groups[0], str))
    largest = int(scan.rows.max()) if len(scan.rows) else 0
    chunk = oracle.stream_chunk(len(scan.groups), scan.n_rows, largest, row_bytes, bound.left, bound)
    if chunk is None:
        return None
    if refusal is not None:  # memory.limit counts the data (memory.data_in_limit): only a stream keeps to it
        raise refusal
    stream = StreamPlan(scan, chunk, row_bytes, table)
    log.info("%s", stream.describe())
    return stream


STREAM_WHY = "the table does not fit in memory and is streamed in chunks of groups, but "
STREAM_FIX = "or give the run the memory the whole table needs (the cgroup's limit, memory.limit)"


def require_streamable(config: Config, specs: Dict[str, Any], why: str = STREAM_WHY, fix: str = STREAM_FIX) -> None:
    """`ConfigError` naming the setting that needs every group at once, when the run is fitted in chunks of
    groups (``why``: the reason it is; ``fix``: the way out beside the setting's own)."""
    fix = " " + fix
    group = config.data.group
    if group and group in config.data.derived:
        raise ConfigError("data.group", group, why + f"its groups are derived (data.derived.{group}) and a chunk reads "
                          "its groups' rows by the file's group column", "give the file a group column and set "
                          "data.group to it," + fix)
    if config.mode.name != ModeName.run:
        raise ConfigError("mode", config.mode.name.value, why + "only mode=run is fitted in chunks of groups", "run mode=run," + fix)
    if config.model.penalties == PenaltyMode.gcv:
        raise ConfigError("model.penalties", "gcv", why + "GCV pools its score over every group at once",
                          "set model.penalties=fixed (tune the penalties with a sweep)," + fix)
    if config.split.refit:
        raise ConfigError("split.refit", True, why + "a refit on the validation period is not streamed yet",
                          "set split.refit=false," + fix)
    for name, derived in config.data.derived.items():
        if getattr(derived, "over", "group") == "table":
            raise ConfigError(f"data.derived.{name}.over", "table", why + "a column over the whole table reads every "
                              "group's rows in one time order", f"set data.derived.{name}.over=group," + fix)
    for name, spec in specs.items():
        kind = getattr(spec, "kind", None)
        if kind in INDEXED_KINDS:
            raise ConfigError(f"model.effects.{name}.kind", kind, why + "a forest is grown on every group's rows "
                              "at once", "use spline, fourier, categorical or linear effects," + fix)


class PredictionSink:
    """The predictions table on disk: each chunk's rows appended to one Parquet file (one writer), then
    flushed to disk and dropped from the page cache: a memory cgroup counts dirty pages as used, and a
    table's predictions are as large as the table."""

    def __init__(self, path: Path) -> None:
        self.path, self.writer, self.file, self.rows = path, None, None, 0

    def append(self, table: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrow = pa.Table.from_pandas(table, preserve_index=False)
        if self.writer is None:
            self.file = open(self.path, "wb")
            self.writer = pq.ParquetWriter(self.file, arrow.schema, compression="zstd")
        self.writer.write_table(arrow.cast(self.writer.schema))
        self.file.flush()
        os.fsync(self.file.fileno())
        if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the kernel's own writeback
            os.posix_fadvise(self.file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        self.rows += len(table)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.file.close()


@dataclass
class StreamTotals:
    """What the chunks add up to: each split's score sums, the per-group metrics and coefficients, the
    phases' seconds (summed) and peaks (the largest), the fit's statistics of the first chunk, the groups
    withheld (`tamrun.fit.unsupported`) and each split's rows they held."""

    sums: Dict[str, ScoreSums]
    groups: List[pd.DataFrame]
    coefficients: List[pd.DataFrame]
    coef: List[torch.Tensor]
    phases: Dict[str, float]
    band_sums: Dict[str, float]
    first: Optional[Any] = None  # (plan, stats, width) of the first chunk
    unsupported: List[pd.DataFrame] = field(default_factory=list)
    withheld_rows: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> "StreamTotals":
        return cls({}, [], [], [], {}, {})

    @property
    def unsupported_table(self) -> pd.DataFrame:
        """The withheld groups of every chunk, in chunk order (`tamrun.fit.unsupported.COLUMNS`)."""
        parts = [part for part in self.unsupported if len(part)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=UNSUPPORTED_COLUMNS)

    def rows(self, split: str) -> int:
        """The split's rows, scored and withheld."""
        return self.sums[split].rows + self.withheld_rows.get(split, 0)

    def merge(self, part: "StreamTotals") -> None:
        """Add a chunk's totals computed elsewhere (a Ray task, `tamrun.jobs.shard`), in chunk order."""
        for name, sums in part.sums.items():
            self.sums.setdefault(name, ScoreSums()).merge(sums)
        self.groups += part.groups
        self.coefficients += part.coefficients
        self.coef += part.coef
        self.add_phases(part.phases)
        self.unsupported += part.unsupported
        for name, value in part.withheld_rows.items():
            self.withheld_rows[name] = self.withheld_rows.get(name, 0) + value
        for name, value in part.band_sums.items():
            self.band_sums[name] = self.band_sums.get(name, 0.0) + value
        if self.first is None:
            self.first = part.first

    def add_phases(self, metrics: Dict[str, float]) -> None:
        for name, value in metrics.items():
            if name.endswith("_seconds"):
                self.phases[name] = self.phases.get(name, 0.0) + value
            elif "peak" in name:
                self.phases[name] = max(self.phases.get(name, 0.0), value)


def require_own_bands(config: Config, splits: List[ScoredSplit], withheld: List[int]) -> None:
    """`ConfigError` when a group of a streamed chunk (but those ``withheld``: their rows are not scored) has
    fewer calibration rows than intervals.min_group_rows: its bands would pool every group's residuals, which
    a chunk does not hold."""
    least = config.intervals.min_group_rows
    if not config.intervals.levels:
        return
    calibration = calibration_split(splits)
    counts = calibration.batch.counts.cpu()
    counts[withheld] = least
    if bool((counts < least).any()):
        few = int(counts.min())
        raise ConfigError("intervals.min_group_rows", least, f"the table is streamed in chunks of groups, but a group "
                          f"has {few} {calibration.name} row(s) to calibrate its intervals on, fewer than "
                          "intervals.min_group_rows: its bands would pool every group's residuals",
                          f"set intervals.min_group_rows <= {few}, or intervals.levels=[], or give the run the memory "
                          "the whole table needs (the cgroup's limit, memory.limit)")


def run_chunk(config: Config, specs: Dict[str, Any], devices: DeviceManager, table: Table, chunk: GroupChunk,
              totals: StreamTotals, sink: Optional[PredictionSink]) -> None:
    """One chunk's run: its groups read, fitted, predicted and checked; its sums, tables and phases kept."""
    prepared = prepare(config, specs, devices, chunk=chunk, table=table)
    fit = solve_phase(prepared)
    with prepared.recorder.phase("predict", prepared.metered):
        splits = predict_splits(prepared, fit)
    with prepared.recorder.phase("evaluate"):
        evaluated = checked_metrics(config, fit, splits, whole=False)
        add_scores(totals, splits, evaluated)
        splits = evaluated.splits
        require_own_bands(config, splits, evaluated.withheld)
        bands = calibration_bands(config, splits)
        rows = {split.name: int((split.batch.row_index >= 0).sum()) for split in splits}
        for name, value in band_metrics(config, splits, bands).items():
            weight = rows[name.rsplit("_", 1)[1]]
            totals.band_sums[name] = totals.band_sums.get(name, 0.0) + value * weight
        table = evaluation_table(config.data, splits, bands)
        if len(table):  # none: every group of the chunk withheld (an empty table has no column types to write)
            totals.groups.append(group_metrics(table))
            if sink is not None:
                sink.append(table)
    totals.coefficients.append(coefficients_frame(fit))
    totals.coef.append(fit.model.coef)
    totals.add_phases(prepared.recorder.metrics())
    if totals.first is None:
        totals.first = (fit.plan, fit.stats, fit.model.design.width)


def add_scores(totals: StreamTotals, splits: List[ScoredSplit], evaluated: Evaluated) -> None:
    """A chunk's score sums (its withheld groups left out), its withheld groups and the rows they held."""
    for split, kept in zip(splits, evaluated.splits):
        totals.sums.setdefault(kept.name, ScoreSums()).add(*scored(kept.batch, kept.predicted))
        withheld = int((split.batch.row_index >= 0).sum() - (kept.batch.row_index >= 0).sum())
        totals.withheld_rows[split.name] = totals.withheld_rows.get(split.name, 0) + withheld
    totals.unsupported.append(evaluated.unsupported)


def release_chunk() -> None:
    """Give back what a chunk held before the next is read: its objects (cycles included), the C
    allocator's freed blocks (`release_freed_host_memory`) and pyarrow's pool's."""
    import pyarrow as pa

    gc.collect()
    release_freed_host_memory()
    pa.default_memory_pool().release_unused()


ChunkRunner = Callable[[List[GroupChunk], StreamTotals, Optional[PredictionSink]], None]


def run_here(config: Config, specs: Dict[str, Any], devices: DeviceManager, table: Table, chunks: List[GroupChunk],
             totals: StreamTotals, sink: Optional[PredictionSink]) -> None:
    """The chunks in this process, one after another, each given back before the next (a `ChunkRunner`)."""
    for index, chunk in enumerate(chunks, start=1):
        log.info("chunk %d of %d: %d groups (resident set %s)", index, len(chunks), len(chunk.groups),
                 format_size(devices.allocated()))
        run_chunk(config, specs, devices, table, chunk, totals, sink)
        release_chunk()


def stream_job(stream: StreamPlan, config: Config, specs: Dict[str, Any], devices: DeviceManager,
               tracked: TrackedRun, run_chunks: Optional[ChunkRunner] = None) -> RunResult:
    """Fit, predict and evaluate ``stream``'s chunks one after another, then record the run: the splits'
    metrics from the sums over chunks, the predictions (one Parquet file, written chunk by chunk), the
    per-group metrics and coefficients. Plots and the LoggedModel need the whole table at once: not
    recorded (said in the log)."""
    chunks = stream.chunks
    totals = StreamTotals.empty()
    folder = Path(tempfile.mkdtemp(prefix="tamrun-stream-"))
    sink = PredictionSink(folder / PREDICTIONS_FILE) if tracked.enabled and config.tracking.log_predictions else None
    try:
        # here, one chunk after another, unless run elsewhere (`tamrun.jobs.shard`) and gathered into both
        (run_chunks or functools.partial(run_here, config, specs, devices, stream.table))(chunks, totals, sink)
        if sink is not None:
            sink.close()
        require_whole(config, stream, totals)
        metrics = stream_metrics(stream, totals)
        record_stream(tracked, config, stream, totals, metrics, sink)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    plan, stats, width = totals.first
    widths = {coef.shape[1] for coef in totals.coef}
    coef = torch.cat(totals.coef) if len(widths) == 1 else torch.empty(0)
    groups = [group for chunk in chunks for group in chunk.groups]
    return RunResult(run_id=None, route=plan.route, width=width, groups=groups, coef=coef, metrics=metrics,
                     table=lambda: pd.DataFrame(columns=["date", "group", "split", "actual", "predicted"]),
                     plan=plan, stats=FitStats(route=plan.route, group_chunk=stats.group_chunk, row_chunk=stats.row_chunk))


def require_whole(config: Config, stream: StreamPlan, totals: StreamTotals) -> None:
    """The checks of a run over every chunk: at most evaluate.max_unsupported_share of the groups withheld
    (`require_share`, then the log line naming them), and every split's RMSE and MAPE finite (a chunk whose
    every group is withheld scores none of its rows)."""
    unsupported = totals.unsupported_table
    share = config.evaluate.max_unsupported_share
    require_share(unsupported, len(stream.scan.groups), share, support_fix(config))
    log_unsupported(unsupported, len(stream.scan.groups), share)
    scores: Dict[str, float] = {}
    for name, sums in totals.sums.items():
        scores.update(sums.scores(name))
    require_finite(scores, "a forecast metric", numerical_fix(config))


def stream_metrics(stream: StreamPlan, totals: StreamTotals) -> Dict[str, float]:
    """Each split's RMSE and MAPE from its sums, the phases, the streaming's figures."""
    metrics: Dict[str, float] = dict(totals.phases)
    for name, sums in totals.sums.items():
        metrics.update(sums.scores(name))
    metrics.update({name: value / totals.sums[name.rsplit("_", 1)[1]].rows for name, value in totals.band_sums.items()})
    metrics.update({"stream_chunks": float(len(stream.chunks)), "stream_chunk_groups": float(stream.chunk.groups),
                    "stream_chunk_bytes": float(stream.chunk.bytes), "n_groups": float(len(stream.scan.groups)),
                    "n_train_rows": float(totals.rows("train")), "n_test_rows": float(totals.rows("test")),
                    "groups_unsupported": float(n_unsupported(totals.unsupported_table))})
    if "features_seconds" in metrics and "solve_seconds" in metrics:
        metrics["fit_seconds"] = metrics["features_seconds"] + metrics["solve_seconds"]
    log.info("rmse_train=%s rmse_test=%s mape_test=%s%% (%d chunks of %d groups)",
             *(significant(metrics[name]) for name in ("rmse_train", "rmse_test", "mape_test")),
             len(stream.chunks), stream.chunk.groups)
    return metrics


def record_stream(tracked: TrackedRun, config: Config, stream: StreamPlan, totals: StreamTotals,
                  metrics: Dict[str, float], sink: Optional[PredictionSink]) -> None:
    """The streamed run's record: params, metrics, the plan's line, the predictions file, the per-group
    metrics, the withheld groups (`tamrun.fit.unsupported`) and the coefficients."""
    plan, _, width = totals.first
    tracked.log_params({"route": plan.route, "D": width, "n_groups": len(stream.scan.groups),
                        "memory_bound_by": plan.bound_by, "stream_chunks": len(stream.chunks)})
    tracked.set_tags({"route_reason": plan.reason, "data_streamed": stream.describe()})
    tracked.log_metrics(metrics)
    tracked.log_text(stream.describe() + "\n" + plan.describe() + "\n", "memory/stream.txt")
    if sink is not None:
        tracked.log_file(sink.path, "predictions")
        per_group = pd.concat(totals.groups, ignore_index=True).sort_values(["split", "group"], kind="stable")
        tracked.log_frame(per_group.reset_index(drop=True), "predictions/group_metrics.csv")
    unsupported = totals.unsupported_table
    if len(unsupported):
        tracked.log_frame(unsupported, UNSUPPORTED_ARTIFACT)
    tracked.log_frame(pd.concat(totals.coefficients, ignore_index=True), "fit/coefficients.csv")
    if config.tracking.enabled and (config.tracking.log_plots or config.tracking.log_model):
        log.warning("streamed run: the plots and the LoggedModel need the whole table at once and are not recorded "
                    "(tracking.log_plots, tracking.log_model)")
