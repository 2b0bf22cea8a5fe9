"""The range of every numeric setting, declared once (like scikit-learn's parameter constraints).

`SETTINGS` holds the range of every int or float field of `tamrun.config.schema.Config` by dotted
path, `EFFECTS` those of every effect spec by kind and field (`tamrun.config.effects`); the byte
sizes written as text (``memory.limit``, ``memory.safety_margin``) are in `SIZES`. `check_numbers`
walks a dataclass's numeric fields by introspection and refuses NaN, infinities and values outside
the declared range with a `ConfigError` naming the dotted field, before anything runs. A field
missing from the tables still gets `FINITE` (floats) or `INT64` (ints);
``tests/test_bad_input.py::test_every_numeric_setting_is_range_checked`` requires an entry for each.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from tamrun.config.schema import schema_default
from tamrun.errors import ConfigError

INT64_MAX = 2**63 - 1
WEEK_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Range:
    """Admitted values: ``low`` <= value <= ``high`` (strict where ``*_open``), always finite.

    ``what`` names the quantity in the message; ``fix`` replaces the default fix
    ("set <field>=<its default>")."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    what: str = "the value"
    fix: str = ""

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def problem(self, integer: bool) -> str:
        """E.g. "the depth must be an integer in [1, 20]"."""
        low, high = (bound_text(b, integer) for b in (self.low, self.high))
        noun = "an integer" if integer else "a finite number"
        if math.isinf(self.high):
            interval = f"> {low}" if self.low_open else f">= {low}"
        else:
            interval = f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return f"{self.what} must be {noun} {interval}"


FINITE = Range()
INT64 = Range(-INT64_MAX - 1, INT64_MAX)
COUNT = Range(0, INT64_MAX, what="a count")
POSITIVE_COUNT = Range(1, INT64_MAX, what="a count")
FRACTION = Range(0, 1, low_open=True, what="a fraction of free memory")
SEED = Range(0, INT64_MAX, what="a seed")
WAIT = Range(0, WEEK_S, low_open=True, what="a wait in seconds")
LOG10_PENALTY = Range(-60, 20, what="the log10 penalty")
SOBOLEV = Range(0, 10, what="the Sobolev order")


def bound_text(bound: float, integer: bool) -> str:
    if bound == INT64_MAX:
        return "2^63-1"
    if integer or (math.isfinite(bound) and float(bound).is_integer()):
        return str(int(bound)) if math.isfinite(bound) else str(bound)
    return f"{bound:g}"


SETTINGS: Dict[str, Range] = {
    "model.intercept_ap": Range(-60, 20, what="the intercept's log10 penalty"),
    "model.gcv.span": Range(0, 80, low_open=True, what="the grid's half-width in decades"),
    "model.gcv.step": Range(0, 80, low_open=True, what="the grid's step in decades"),
    "model.gcv.sweeps": Range(1, 100, what="the number of sweeps"),
    "model.gcv.min_ap": Range(-60, 20, what="the smallest log10 penalty tuned"),
    "hw.threads": Range(1, 65536, what="the number of threads"),
    "memory.dense_fraction": FRACTION,
    "memory.max_dense_dim": Range(1, INT64_MAX, what="the largest dense dimension"),
    "memory.chunk_fraction_gpu": FRACTION,
    "memory.chunk_fraction_cpu": FRACTION,
    "memory.window_fraction_gpu": FRACTION,
    "memory.window_fraction_cpu": FRACTION,
    "memory.overhead_factor": Range(1, 1000, what="the overhead factor"),
    "memory.max_chunk_rows": Range(1, INT64_MAX, what="the most rows of a chunk",
                                   fix="set memory.max_chunk_rows=null"),
    "memory.max_chunk_rows_gpu": Range(1, INT64_MAX, what="the most rows of a chunk",
                                       fix="set memory.max_chunk_rows_gpu=null"),
    "memory.min_chunk_rows": Range(1, INT64_MAX, what="a number of rows"),
    "data.read_chunk_rows": Range(1, INT64_MAX, what="the rows read at a time"),
    "memory.oom.max_retries": Range(0, 50, what="the number of retries"),
    "memory.oom.size_factor": Range(0, 1, low_open=True, high_open=True, what="the shrink factor"),
    "memory.oom.delay_ms": Range(0, 3_600_000, what="the first back-off in ms"),
    "solver.tol": Range(0, 1, low_open=True, high_open=True, what="the CG relative-residual tolerance",
                        fix="set solver.tol=1e-6 (or null for the dtype's default)"),
    "solver.max_iter": Range(1, 10**9, what="the iteration cap"),
    "solver.block_max_dim": POSITIVE_COUNT,
    "solver.direct_max_dim": POSITIVE_COUNT,
    "solver.jitter": Range(0, 1e6, what="the jitter"),
    "solver.jitter_growth": Range(1, 1e6, low_open=True, what="the jitter's growth"),
    "solver.jitter_max_tries": Range(0, 100, what="the number of tries"),
    "solver.dual_dense_counts_max": COUNT,
    "solver.dual_scatter_max_leaf_rows": COUNT,
    "solver.dual_scatter_pairs_per_step": POSITIVE_COUNT,
    "solver.dual_tile_rows": POSITIVE_COUNT,
    "tracking.busy_timeout_s": WAIT,
    "tracking.lock_timeout_s": WAIT,
    "tracking.connect_timeout_s": WAIT,
    "adaptive.window": Range(1, 100_000, what="a window in days"),
    "intervals.min_group_rows": Range(1, INT64_MAX, what="the number of calibration rows"),
    "intervals.window_days": Range(1, 100_000, what="a window in days"),
    "intervals.gamma": Range(0, 1, low_open=True, what="the adaptation step"),
    "evaluate.max_unsupported_share": Range(0, 1, high_open=True, what="the share of the groups"),
    "adaptive.step": Range(1, 100_000, what="the step in days"),
    "adaptive.horizon": Range(1, 100_000, what="the horizon in days"),
    "adaptive.refresh": COUNT,
    "adaptive.max_batch_windows": POSITIVE_COUNT,
    "backtest.windows": Range(1, 100_000, what="the number of windows"),
    "backtest.refresh": COUNT,
    "backtest.max_batch_windows": POSITIVE_COUNT,
    "tco.work_seconds": Range(0, low_open=True, what="the measured work in seconds",
                              fix="set tco.work_seconds to a run's compute_seconds, or null"),
    "shard.groups_per_task": POSITIVE_COUNT,
    "shard.cpus_per_task": Range(1, 100_000, what="the CPUs of a task"),
    "seed": SEED,
}

# The fields of one machine class (`tamrun.config.schema.MachineClass`, ``tco.classes.<name>``).
MACHINE_CLASS: Dict[str, Range] = {
    "memory_gib": Range(0, low_open=True, what="the memory in GiB"),
    "bandwidth_gbs": Range(0, low_open=True, what="the effective bandwidth in GB/s"),
    "cores": Range(1, 1_000_000, what="the number of cores"),
    "price_per_hour": Range(0, low_open=True, what="the price per hour (USD)"),
}

EFFECTS: Dict[str, Dict[str, Range]] = {
    "linear": {"scale": Range(-1e6, 1e6, what="the feature scale"), "ap": LOG10_PENALTY},
    "fourier": {"m": Range(1, 1000, what="the number of frequencies"), "s": SOBOLEV, "ap": LOG10_PENALTY,
                "period": Range(0, low_open=True, what="the period in the column's units")},
    "categorical": {"s": SOBOLEV, "ap": LOG10_PENALTY},
    "spline": {"k": Range(1, 10_000, what="the number of knot intervals"), "deg": Range(1, 5, what="the degree"),
               "p": Range(0, 10, what="the difference order"), "ap": LOG10_PENALTY},
    "forest": {"n_trees": Range(1, 100_000, what="the number of trees"), "max_depth": Range(1, 20, what="the depth"),
               "seed": SEED, "ap": LOG10_PENALTY},
    "crossing": {"ap": LOG10_PENALTY},
}

SIZES: Dict[str, Range] = {
    "memory.limit": Range(1, INT64_MAX, what="the limit in bytes", fix="set memory.limit=2GiB or memory.limit=null"),
    "memory.safety_margin": Range(0, INT64_MAX, what="the margin in bytes"),
}


def cli_text(value: Any) -> str:
    """``value`` as it is written on the command line (1e-6, 10, null, true)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        return f"{mantissa}e{int(exponent)}" if exponent else text
    return str(value)


def numeric_fields(cls: type, prefix: str = "") -> Iterator[Tuple[str, type]]:
    """(dotted name, int or float) of every numeric field of the dataclass ``cls`` and of the
    dataclasses it nests (Optional[int] counts as int; bool does not)."""
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        hint = hints[spec.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
        if dataclasses.is_dataclass(base):
            yield from numeric_fields(base, f"{prefix}{spec.name}.")
        elif base in (int, float):
            yield f"{prefix}{spec.name}", base


def check_numbers(obj: Any, path: str, ranges: Dict[str, Range], default: Callable[[str], Any]) -> None:
    """Refuse the first numeric field of the dataclass ``obj`` outside its range in ``ranges``
    (named ``<path>.<field>``; ``default(field)`` is the value the fix suggests). None is admitted."""
    for name, kind in numeric_fields(type(obj)):
        value = obj
        for part in name.split("."):
            value = getattr(value, part)
        if value is None:
            continue
        declared = ranges.get(name, INT64 if kind is int else FINITE)
        if not declared.admits(value):
            field = f"{path}.{name}" if path else name
            raise ConfigError(field, value, declared.problem(kind is int),
                              declared.fix or f"set {field}={cli_text(default(name))}")


def check_size(field: str, text: Optional[str], size: Optional[int]) -> None:
    """Refuse a byte size (``text`` parsed into ``size``) outside its range in `SIZES`."""
    declared = SIZES[field]
    if size is not None and not declared.admits(size):
        raise ConfigError(field, text, declared.problem(True),
                          declared.fix or f"set {field}={cli_text(schema_default(field))}")
