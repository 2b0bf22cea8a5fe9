"""A run's groups sharded over a Ray cluster (``shard.over=ray``; docs/scale.md, "Groups across a Ray
cluster").

    shard_plan(config, specs, devices, table) -> StreamPlan
        the table's groups (one scan of its group and date columns, `tamrun.data.table.Table.scan`) in chunks of
        shard.groups_per_task (default: the groups over twice the cluster's CPUs, at most the chunk a
        streamed run takes when the table does not fit here)
    shard_job(container, config, specs, devices, tracked, table) -> RunResult
        each chunk a Ray task (`chunk_task`: its groups read from data.path on its node, fitted,
        predicted and checked by `tamrun.jobs.stream.run_chunk`, as one machine does), gathered in chunk
        order into the same sums, predictions file and record as a streamed run (`tamrun.jobs.stream`)

Groups are independent systems, so a task's chunk is fitted exactly as one machine fits it, and the
gather adds its sums in the order one machine would: the same metrics and predictions. The config
crosses to the tasks as plain data (its resolved container, typed again on the node, without its
tracking settings: the tasks never touch MLflow, the driver records the one run); what comes back is
tables, sums and coefficients.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

from tamrun.config.schema import Config, ShardConfig
from tamrun.data.chunks import GroupChunk
from tamrun.data.table import Table, TableRef
from tamrun.device.manager import DeviceManager
from tamrun.errors import ConfigError, TamrunError
from tamrun.jobs.result import RunResult
from tamrun.jobs.stream import PredictionSink, StreamPlan, StreamTotals, require_streamable, stream_job, stream_plan
from tamrun.memory.oracle import ChunkPlan
from tamrun.tracking.mlflow_run import TrackedRun

log = logging.getLogger(__name__)

TASKS_PER_CPU = 2  # default chunks: each CPU of the cluster gets about two tasks (a slow node evens out)


def shard_plan(config: Config, specs: Dict[str, Any], devices: DeviceManager, table: Table,
               cluster_cpus: int) -> StreamPlan:
    """The chunks the tasks take: shard.groups_per_task groups, else ceil(G / (TASKS_PER_CPU x
    ``cluster_cpus``)); never more than a streamed run's chunk when the table does not fit here.

    Raises:
        MemoryBudgetError: one group's rows do not fit here (`tamrun.jobs.stream.stream_plan`).
    """
    streamed = stream_plan(config, specs, devices, table)
    scan = table.scan(table.window(config.split))  # the stream plan's, when it scanned
    groups = config.shard.groups_per_task or math.ceil(len(scan.groups) / (TASKS_PER_CPU * max(1, cluster_cpus)))
    if streamed is not None:
        groups = min(groups, streamed.chunk.groups)
    row_bytes = streamed.row_bytes if streamed is not None else 0
    largest = int(scan.rows.max()) if len(scan.rows) else 0
    chunk = streamed.chunk if streamed is not None and streamed.chunk.groups == groups else ChunkPlan(
        max(1, groups), largest, largest * row_bytes * max(1, groups))
    return StreamPlan(scan, chunk, row_bytes, table)


def require_shardable(config: Config, specs: Dict[str, Any]) -> None:
    """`ConfigError` when the run cannot be fitted in chunks of groups: no groups (data.group), or a
    setting that needs every group at once (`tamrun.jobs.stream.require_streamable`)."""
    why = "shard.over=ray fits chunks of groups as tasks of a Ray cluster, but "
    if not config.data.group:
        raise ConfigError("data.group", None, why + "the data has no groups to shard",
                          "set data.group=<column>, or shard.over=local")
    require_streamable(config, specs, why, "or run it here with shard.over=local")


def task_container(container: Dict[str, Any], config: Config, table: Table) -> Dict[str, Any]:
    """What a task is given: the config without its tracking settings, data.path absolute (the node reads
    ``table`` there), shard.over=local and one thread per CPU the task holds."""
    given = {key: value for key, value in container.items() if key != "tracking"}
    given["data"] = {**given["data"], "path": table.ref().path}
    given["shard"] = {**given.get("shard", {}), "over": "local"}
    given["hw"] = {**given.get("hw", {}), "threads": config.shard.cpus_per_task}
    return given


def chunk_task(container: Dict[str, Any], ref: Dict[str, Any], groups: List[Any], origin: Optional[pd.Timestamp]
               ) -> Tuple[StreamTotals, Optional[pd.DataFrame], str]:
    """One chunk on a node of the cluster: the config typed again, the table opened again from ``ref`` (the
    fields of a `TableRef`: plain data, no sniffing), its groups read, fitted, predicted and checked
    (`tamrun.jobs.stream.run_chunk`); its totals, its predictions table and the node's id (what it prints
    is redacted)."""
    import ray
    from omegaconf import OmegaConf

    from tamrun.config.load import typed_config
    from tamrun.jobs.stream import run_chunk
    from tamrun.pipeline import DTYPES
    from tamrun.redact import redacted_output

    with redacted_output():
        config, specs = typed_config(OmegaConf.create(container))
        devices = DeviceManager.from_config(config.hw, DTYPES[config.dtype])
        totals, tables = StreamTotals.empty(), CollectedTables()
        with devices.session(), devices.oom_refused(config.memory.safety_margin_bytes):
            table = Table.reopen(config.data, TableRef(**ref))
            run_chunk(config, specs, devices, table, GroupChunk(groups, origin), totals, tables)
        totals.coef = [coef.cpu() for coef in totals.coef]  # the tensors cross to the driver in host memory
    return totals, tables.table, ray.get_runtime_context().get_node_id()


class CollectedTables:
    """A task's sink: keeps the chunk's predictions table to hand back (`PredictionSink`'s interface)."""

    def __init__(self) -> None:
        self.table: Optional[pd.DataFrame] = None

    def append(self, table: pd.DataFrame) -> None:
        self.table = table if self.table is None else pd.concat([self.table, table], ignore_index=True)


def join_cluster(shard: ShardConfig) -> Any:
    """Ray, joined to shard.address (`tamrun.cluster.start.start_ray`; None: RAY_ADDRESS or a Ray of this
    process's own); without Ray installed, a config error naming shard.over."""
    try:
        import ray
    except ImportError:
        raise ConfigError("shard.over", "ray", "Ray is not installed in this environment",
                          "pip install 'tamrun[ray]' (on the driver and every node), or shard.over=local") from None
    from tamrun.cluster.start import start_ray

    start_ray({"address": shard.address} if shard.address else {}, setting="shard.address")
    return ray


def cluster_cpus(ray: Any) -> int:
    """The CPUs of the cluster's live nodes."""
    return int(sum(node.get("Resources", {}).get("CPU", 0) for node in ray.nodes() if node.get("Alive")))


def run_on_ray(ray: Any, container: Dict[str, Any], config: Config, table: Table, chunks: List[GroupChunk],
               totals: StreamTotals, sink: Optional[PredictionSink]) -> None:
    """Every chunk as a Ray task holding shard.cpus_per_task CPUs, spread over the nodes, gathered in chunk
    order (a task's bad input raised here as itself; the tasks not done cancelled); the nodes that ran
    them (``shard_nodes``) and the driver's seconds merging their sums and writing their predictions
    (``shard_gather_seconds``) join the run's metrics."""
    task = ray.remote(num_cpus=config.shard.cpus_per_task, scheduling_strategy="SPREAD")(chunk_task)
    given, ref = ray.put(task_container(container, config, table)), dataclasses.asdict(table.ref())
    refs = [task.remote(given, ref, list(chunk.groups), chunk.origin) for chunk in chunks]
    log.info("shard: %d chunks of up to %d groups submitted to the Ray cluster", len(refs),
             max(len(chunk.groups) for chunk in chunks))
    try:
        nodes, gather = set(), 0.0
        for index, ref in enumerate(refs, start=1):
            part, table, node = ray.get(ref)
            began = time.perf_counter()
            nodes.add(node)
            totals.merge(part)
            if sink is not None and table is not None:
                sink.append(table)
            gather += time.perf_counter() - began
            log.info("shard: chunk %d of %d gathered", index, len(refs))
        totals.phases.update(shard_nodes=float(len(nodes)), shard_gather_seconds=gather)
    except ray.exceptions.RayTaskError as error:
        for ref in refs:
            ray.cancel(ref)
        cause = getattr(error, "cause", None)
        if isinstance(cause, TamrunError):
            raise cause from None
        raise


def shard_job(container: Dict[str, Any], config: Config, specs: Dict[str, Any], devices: DeviceManager,
              tracked: TrackedRun, table: Table) -> RunResult:
    """The run with its chunks of groups fitted as Ray tasks (module doc), recorded as a streamed run."""
    require_shardable(config, specs)
    ray = join_cluster(config.shard)
    cpus = cluster_cpus(ray)
    stream = shard_plan(config, specs, devices, table, cpus)
    log.info("shard: %d groups in %d chunks of up to %d, on a Ray cluster of %d CPUs", len(stream.scan.groups),
             len(stream.chunks), stream.chunk.groups, cpus)
    tracked.set_tags({"shard": f"ray: {len(stream.chunks)} tasks of up to {stream.chunk.groups} groups"})
    return stream_job(stream, config, specs, devices, tracked,
                      run_chunks=functools.partial(run_on_ray, ray, container, config, stream.table))
