"""The plan per class of one run: which class it is measured on, what it holds before its plan, its
measured work (a fitted run's phases, or ``tco.work_seconds`` in mode=plan) and what it logs.

    classes_of(config, features, devices, n_predict_rows, n_scored_rows) -> [ClassFit]    (in `prepare`)
    run_plan(config, fits, measured_on, metrics, plan)                  -> TcoPlan        (after the fit)
    plan_only(config, fits, measured_on)                                -> TcoPlan        (mode=plan)
    priced_work(config, measured_on, priced_phases(phases))           -> metrics        (adaptive jobs)
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import psutil

from tamrun.config.schema import Config, PenaltyMode
from tamrun.device.manager import DeviceManager
from tamrun.memory.oracle import Plan
from tamrun.pipeline import Features, recording_reserve, run_problem_size
from tamrun.tco.plan import GIB, SECONDS_PER_HOUR, ClassFit, Problem, TcoPlan, Work, fits_of, priced
from tamrun.tracking.mlflow_run import TrackedRun
from tamrun.tco.time import chunk_overhead, chunked_seconds, compute_seconds, fixed_seconds, group_steps

COST_METRIC = "cost_usd"  # the run's measured cost: its compute seconds at the measured-on class's price
CHEAPEST_COST_METRIC = "cost_cheapest_usd"  # the predicted cost on the cheapest class that fits
# A job's phases that the class's memory and bandwidth do not price (an adaptive job's cost is its other phases).
UNPRICED_PHASES = ("data", "record")
CHEAPEST_TAG = "tco_cheapest"  # the cheapest class that fits
MEASURED_ON_TAG = "tco_measured_on"


def measured_class(config: Config, devices: DeviceManager) -> Optional[str]:
    """``tco.measured_on``, else the class nearest this machine: on a GPU the GPU class whose memory is
    nearest the device's; on the CPU the CPU class whose cores are nearest the run's threads, then whose
    memory is nearest the RAM. None when no class of the device's kind is listed."""
    tco = config.tco
    if tco.measured_on is not None:
        return tco.measured_on
    if devices.kind == "cuda":
        import torch

        total = torch.cuda.get_device_properties(devices.device).total_memory / GIB
        candidates = {n: (abs(m.memory_gib - total),) for n, m in tco.classes.items() if m.kind.value == "gpu"}
    else:
        cores = devices.threads.count if devices.threads is not None else (psutil.cpu_count() or 1)
        ram = psutil.virtual_memory().total / GIB
        candidates = {n: (abs(m.cores - cores), abs(m.memory_gib - ram)) for n, m in tco.classes.items()
                      if m.kind.value == "cpu"}
    return min(candidates, key=candidates.__getitem__) if candidates else None


def classes_of(config: Config, features: Features, devices: DeviceManager, n_predict_rows: int,
               n_scored_rows: int) -> List[ClassFit]:
    """Every class's fit of this run (`fits_of`), what it holds now (its resident set) read before."""
    if not config.tco.classes:
        return []
    problem = Problem(run_problem_size(config, features, n_predict_rows), config.memory, config.solver.name.value,
                      config.solver.dual, config.solver.direct_max_dim, config.model.penalties == PenaltyMode.gcv,
                      int(psutil.Process().memory_info().rss),
                      recording_reserve(config.tracking, n_scored_rows, len(config.intervals.levels)))
    return fits_of(config.tco, problem)


def run_plan(fits: List[ClassFit], measured_on: Optional[str], metrics: Mapping[str, float], plan: Plan,
             n_groups: int) -> TcoPlan:
    """The plan per class priced from a fitted run's own work: its features phase (fixed) and its solve and
    predict phases (chunked) at the chunks of its own ``plan``, on the class ``measured_on``."""
    overhead = chunk_overhead(plan.route, group_steps(n_groups, plan.fit.groups), plan.route != "cg" or plan.cache_design)
    work = Work(fixed_seconds(metrics), chunked_seconds(metrics), measured_on, overhead) if measured_on else None
    return priced(fits, measured_on, work, notes(fits, measured_on))


def plan_only(config: Config, fits: List[ClassFit], measured_on: Optional[str]) -> TcoPlan:
    """mode=plan's plan per class: priced from ``tco.work_seconds`` (a run's compute seconds on the class
    ``measured_on``, taken as chunked work at that class's chunks), or memory only without it."""
    seconds = config.tco.work_seconds
    reference = next((c for c in fits if c.name == measured_on and c.fits), None)
    extra = [] if seconds is not None else [
        "times and costs: mode=plan fits nothing; give the compute_seconds of a run of this config on "
        f"{measured_on or 'the measured-on class'}: tco.work_seconds=<seconds>"]
    work = Work(0.0, seconds, measured_on, reference.overhead) if seconds is not None and reference else None
    return priced(fits, measured_on, work, notes(fits, measured_on) + extra)


def notes(fits: List[ClassFit], measured_on: Optional[str]) -> List[str]:
    """What the reader must know: no class of this machine's kind to measure on."""
    if fits and measured_on is None:
        return ["no class of this device's kind is listed (tco.classes): times and costs are not predicted; "
                "set tco.measured_on=<class>"]
    return []


def priced_work(config: Config, measured_on: Optional[str], seconds: float) -> Dict[str, float]:
    """``compute_seconds`` (the work ``seconds``) and ``cost_usd``: those seconds at the price of the class
    ``measured_on`` (absent when no class is known)."""
    out: Dict[str, float] = {"compute_seconds": seconds}
    reference = config.tco.classes.get(measured_on) if measured_on is not None else None
    if reference is not None:
        out[COST_METRIC] = seconds * reference.price_per_hour / SECONDS_PER_HOUR
    return out


def priced_phases(phases: Mapping[str, float]) -> float:
    """The seconds of an adaptive job's phases (name -> seconds) that its cost prices: all but
    `UNPRICED_PHASES`. Such a job has no plan per class: its windows, filters and experts are not chunked by
    a class's memory the way a fit's groups are."""
    return float(sum(seconds for name, seconds in phases.items() if name not in UNPRICED_PHASES))


def tco_metrics(config: Config, plan: TcoPlan, metrics: Mapping[str, float]) -> Dict[str, float]:
    """A fitted run's `priced_work` (its measured work, `compute_seconds`, at the measured-on class's price)
    and ``cost_cheapest_usd``: the cheapest class's predicted cost (each absent when unknown)."""
    out = priced_work(config, plan.measured_on, compute_seconds(metrics))
    cheapest = plan.by_name(plan.cheapest)
    if cheapest is not None and cheapest.cost_usd is not None:
        out[CHEAPEST_COST_METRIC] = cheapest.cost_usd
    return out


def record_tco(tracked: TrackedRun, plan: TcoPlan) -> None:
    """The plan per class in the run: tags ``tco_cheapest`` and ``tco_measured_on``, ``tco/plan.json`` and
    ``tco/plan.txt`` (a no-op without classes)."""
    if not plan.classes:
        return
    tags = {CHEAPEST_TAG: plan.cheapest, MEASURED_ON_TAG: plan.measured_on}
    tracked.set_tags({key: value for key, value in tags.items() if value is not None})
    tracked.log_json(plan.as_dict(), "tco/plan.json")
    tracked.log_text(plan.describe() + "\n", "tco/plan.txt")
