"""Range and consistency checks of a composed config, with messages that name field, value and fix.

A fix that suggests a field's default reads it from the schema (`tamrun.config.schema.schema_default`),
so that every default is written once, in `tamrun/config/schema.py`.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any, List

from tamrun.config.schema import Config, DataSource, ModeName, schema_default
from tamrun.errors import ConfigError

_DERIVED_KINDS = ("time_index", "isin", "expr")


def _require(ok: bool, field: str, value: Any, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field, value, problem, fix)


def _default(field: str) -> str:
    """The schema's default of ``field`` as it is written on the command line (1e-6, 10, null, true)."""
    value = schema_default(field)
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


def _set_default(field: str) -> str:
    """The fix "set <field>=<its schema default>"."""
    return f"set {field}={_default(field)}"


def _fraction(cfg_value: float, field: str) -> None:
    _require(0 < cfg_value <= 1, field, cfg_value, "a fraction of free memory must lie in (0, 1]",
             f"set {field} to e.g. {_default(field)}")


def check_config(cfg: Config) -> None:
    """Raise `ConfigError` on the first out-of-range or inconsistent value (effects are checked
    when they are parsed, see `tamrun.config.effects.parse_effects`)."""
    _check_memory(cfg)
    _check_model(cfg)
    _check_solver(cfg)
    _check_hw(cfg)
    _check_data(cfg)
    _check_adaptive(cfg)
    _check_tracking(cfg)
    _check_objective(cfg)


def _check_model(cfg: Config) -> None:
    ap = cfg.model.intercept_ap
    _require(math.isfinite(ap) and -60 <= ap <= 20, "model.intercept_ap", ap,
             "the intercept's log10 penalty is not a finite number in [-60, 20]",
             _set_default("model.intercept_ap"))


def _check_memory(cfg: Config) -> None:
    mem = cfg.memory
    for name in ("dense_fraction", "chunk_fraction_gpu", "chunk_fraction_cpu",
                 "window_fraction_gpu", "window_fraction_cpu"):
        _fraction(getattr(mem, name), f"memory.{name}")
    _require(mem.max_dense_dim >= 1, "memory.max_dense_dim", mem.max_dense_dim,
             "the largest dense dimension must be >= 1", _set_default("memory.max_dense_dim"))
    _require(mem.overhead_factor >= 1, "memory.overhead_factor", mem.overhead_factor,
             "the overhead factor must be >= 1", _set_default("memory.overhead_factor"))
    _require(mem.max_chunk_rows is None or mem.max_chunk_rows >= 1, "memory.max_chunk_rows",
             mem.max_chunk_rows, "must be a positive number of rows or null", "set memory.max_chunk_rows=null")
    _require(mem.min_chunk_rows >= 1, "memory.min_chunk_rows", mem.min_chunk_rows,
             "must be a positive number of rows", _set_default("memory.min_chunk_rows"))
    try:
        limit = mem.limit_bytes
    except ValueError:
        raise ConfigError("memory.limit", mem.limit, "not a size",
                          "write a number of bytes or a size with a unit, e.g. memory.limit=2GiB") from None
    _require(limit is None or limit > 0, "memory.limit", mem.limit, "the limit must be positive",
             "set memory.limit=2GiB or memory.limit=null")
    try:
        margin = mem.safety_margin_bytes
    except ValueError:
        raise ConfigError("memory.safety_margin", mem.safety_margin, "not a size",
                          f"write a size with a unit, e.g. memory.safety_margin={schema_default('memory.safety_margin')}"
                          ) from None
    _require(margin >= 0, "memory.safety_margin", mem.safety_margin, "the margin must be >= 0",
             _set_default("memory.safety_margin"))
    oom = mem.oom
    _require(oom.max_retries >= 0, "memory.oom.max_retries", oom.max_retries, "must be >= 0",
             _set_default("memory.oom.max_retries"))
    _require(0 < oom.size_factor < 1, "memory.oom.size_factor", oom.size_factor,
             "the shrink factor must lie in (0, 1)", _set_default("memory.oom.size_factor"))
    _require(oom.delay_ms >= 0, "memory.oom.delay_ms", oom.delay_ms, "must be >= 0",
             _set_default("memory.oom.delay_ms"))


def _check_solver(cfg: Config) -> None:
    sol = cfg.solver
    _require(sol.tol is None or (math.isfinite(sol.tol) and 0 < sol.tol < 1), "solver.tol", sol.tol,
             "the CG relative-residual tolerance must lie in (0, 1)",
             "set solver.tol=1e-6 (or null for the dtype's default)")
    _require(sol.max_iter >= 1, "solver.max_iter", sol.max_iter, "must be >= 1", _set_default("solver.max_iter"))
    _require(sol.block_max_dim >= 1, "solver.block_max_dim", sol.block_max_dim, "must be >= 1",
             _set_default("solver.block_max_dim"))
    _require(sol.jitter >= 0, "solver.jitter", sol.jitter, "must be >= 0", _set_default("solver.jitter"))
    _require(sol.jitter_growth > 1, "solver.jitter_growth", sol.jitter_growth, "must be > 1",
             _set_default("solver.jitter_growth"))
    _require(sol.jitter_max_tries >= 0, "solver.jitter_max_tries", sol.jitter_max_tries, "must be >= 0",
             _set_default("solver.jitter_max_tries"))
    _require(not sol.dual or sol.jitter > 0, "solver.jitter", sol.jitter,
             "the direct route's dual form inverts P + jitter I, which needs jitter > 0 (P may be singular)",
             f"{_set_default('solver.jitter')}, or solver.dual=false")
    _require(sol.dual_dense_counts_max >= 0, "solver.dual_dense_counts_max", sol.dual_dense_counts_max,
             "must be >= 0", _set_default("solver.dual_dense_counts_max"))
    _require(sol.dual_scatter_max_leaf_rows >= 0, "solver.dual_scatter_max_leaf_rows",
             sol.dual_scatter_max_leaf_rows, "must be >= 0", _set_default("solver.dual_scatter_max_leaf_rows"))
    _require(sol.dual_scatter_pairs_per_step >= 1, "solver.dual_scatter_pairs_per_step",
             sol.dual_scatter_pairs_per_step, "must be >= 1", _set_default("solver.dual_scatter_pairs_per_step"))
    _require(sol.dual_tile_rows >= 1, "solver.dual_tile_rows", sol.dual_tile_rows, "must be >= 1",
             _set_default("solver.dual_tile_rows"))


def _check_hw(cfg: Config) -> None:
    hw = cfg.hw
    known = {"cuda", "mps", "xpu", "cpu"}
    bad = [d for d in hw.preference if d not in known]
    _require(not bad and len(hw.preference) > 0, "hw.preference", list(hw.preference),
             "unknown device in the preference list", "list devices among cuda, mps, xpu, cpu")
    _require(hw.threads is None or hw.threads >= 1, "hw.threads", hw.threads, "must be >= 1 or null",
             _set_default("hw.threads"))


def _check_data(cfg: Config) -> None:
    _require(cfg.data.source != DataSource.file or bool(cfg.data.path), "data.path", cfg.data.path,
             "data.source=file needs the path of a CSV file", "set data.path=/path/to/file.csv")
    _require(cfg.data.read_chunk_rows >= 1, "data.read_chunk_rows", cfg.data.read_chunk_rows, "must be >= 1",
             _set_default("data.read_chunk_rows"))
    for name, derived in cfg.data.derived.items():
        field = f"data.derived.{name}"
        _require(derived.kind in _DERIVED_KINDS, f"{field}.kind", derived.kind, "unknown derived-column kind",
                 f"use one of {', '.join(_DERIVED_KINDS)}")
        if derived.kind == "isin":
            _require(bool(derived.column) and bool(derived.values), field, derived.column,
                     "an isin column needs a source column and values", f"set {field}.column and {field}.values")
        if derived.kind == "expr":
            _require(bool(derived.expr), f"{field}.expr", derived.expr, "an expr column needs an expression",
                     f"set {field}.expr, e.g. 'day_type_week >= 5'")


def _check_adaptive(cfg: Config) -> None:
    ada = cfg.adaptive
    _require(cfg.mode.name != ModeName.adaptive or cfg.split.validation_start is None, "split.validation_start",
             cfg.split.validation_start, "mode=adaptive refits on every training and test row; a validation period "
             "would leave a gap in its windows", "set split.validation_start=null, or use mode=run to tune on it")
    _require(ada.window >= 1, "adaptive.window", ada.window, "a window must hold at least one day",
             "set adaptive.window=365")
    _require(ada.step >= 1, "adaptive.step", ada.step, "the step between refits must be >= 1 day",
             "set adaptive.step=1 (daily refits) or 7 (weekly)")
    _require(ada.horizon is None or ada.horizon >= ada.step, "adaptive.horizon", ada.horizon,
             f"the horizon must be >= adaptive.step={ada.step} days, or the days between a refit's "
             "horizon and the next refit would not be forecast", f"set adaptive.horizon={ada.step} or null")
    _require(ada.refresh >= 0, "adaptive.refresh", ada.refresh, "must be >= 0",
             f"{_set_default('adaptive.refresh')} (0: recompute only the first window's Gram)")
    _require(ada.max_batch_windows is None or ada.max_batch_windows >= 1, "adaptive.max_batch_windows",
             ada.max_batch_windows, "must be >= 1 or null", _set_default("adaptive.max_batch_windows"))


def _check_tracking(cfg: Config) -> None:
    for name in ("busy_timeout_s", "lock_timeout_s", "connect_timeout_s"):
        value = getattr(cfg.tracking, name)
        _require(math.isfinite(value) and value > 0, f"tracking.{name}", value,
                 "a wait must be a positive number of seconds", _set_default(f"tracking.{name}"))
    _require(bool(cfg.tracking.experiment), "tracking.experiment", cfg.tracking.experiment,
             "the experiment name is empty", _set_default("tracking.experiment"))


def scored_splits(cfg: Config) -> List[str]:
    """The splits a run of this config scores as rmse_<split> and mape_<split>."""
    if cfg.mode.name == ModeName.adaptive:
        return ["test", "test_static"]
    return ["train", "test"] + (["validation"] if cfg.split.validation_start else [])


def _check_objective(cfg: Config) -> None:
    """An objective of the form rmse_<split> / mape_<split> must name a split this run scores (checked
    before anything runs; other metric names are checked once the run has logged its metrics)."""
    match = re.fullmatch(r"(rmse|mape)_(\w+)", cfg.objective or "")
    if match is None or cfg.mode.name == ModeName.plan:
        return
    splits = scored_splits(cfg)
    hint = " (set split.validation_start to score a validation period)" if match[2] == "validation" else ""
    _require(match[2] in splits, "objective", cfg.objective, f"this run scores no split {match[2]!r}{hint}",
             f"use one of: {', '.join(f'{match[1]}_{split}' for split in splits)}")
