"""Range and consistency checks of a composed config, with messages that name field, value and fix.

A fix that suggests a field's default reads it from the schema (`tamrun.config.schema.schema_default`),
so that every default is written once, in `tamrun/config/schema.py`.
"""

from __future__ import annotations

import codecs
import math
import re
from typing import Any, List, Mapping

from tamrun.config.calendar import check_calendar
from tamrun.config.ranges import MACHINE_CLASS, SETTINGS, check_numbers, check_size, cli_text
from tamrun.config.schema import (HISTORY_KINDS, AdaptiveMethod, Config, DataSource, DType, IntervalMethod, ModeName,
                                  PenaltyMode, ShardOver, schema_default)
from tamrun.config.expr import parse_expression
from tamrun.config.offsets import check_backtest, check_history
from tamrun.config.secret_sources import check_no_secret
from tamrun.errors import ConfigError

_DERIVED_KINDS = ("time_index", "isin", "expr", "calendar", "holiday", *HISTORY_KINDS)
# The most candidates of one effect's GCV grid (model.gcv.span / model.gcv.step).
MAX_GCV_GRID = 401
# Columns of mode=aggregate's predictions table and words of its metrics no expert may be named.
RESERVED_EXPERT_NAMES = ("date", "group", "period", "actual", "aggregate", "best_expert")


def _require(ok: bool, field: str, value: Any, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field, value, problem, fix)


def _set_default(field: str) -> str:
    """The fix "set <field>=<its schema default>"."""
    return f"set {field}={cli_text(schema_default(field))}"


def check_config(cfg: Config) -> None:
    """Raise `ConfigError` on the first out-of-range or inconsistent value: every number against its
    declared range (`tamrun.config.ranges`), then the consistency of the fields (effects are checked
    when they are parsed, see `tamrun.config.effects.parse_effects`)."""
    check_numbers(cfg, "", SETTINGS, schema_default)
    _check_memory(cfg)
    _check_solver(cfg)
    _check_gcv(cfg)
    _check_hw(cfg)
    _check_data(cfg)
    _check_adaptive(cfg)
    _check_backtest(cfg)
    _check_aggregate(cfg)
    _check_intervals(cfg)
    _check_refit(cfg)
    _check_tracking(cfg)
    _check_objective(cfg)
    _check_tco(cfg)


def _check_memory(cfg: Config) -> None:
    mem = cfg.memory
    try:
        limit = mem.limit_bytes
    except ValueError:
        raise ConfigError("memory.limit", mem.limit, "not a size",
                          "write a number of bytes or a size with a unit, e.g. memory.limit=2GiB") from None
    check_size("memory.limit", mem.limit, limit)
    try:
        margin = mem.safety_margin_bytes
    except ValueError:
        raise ConfigError("memory.safety_margin", mem.safety_margin, "not a size",
                          f"write a size with a unit, e.g. memory.safety_margin={schema_default('memory.safety_margin')}"
                          ) from None
    check_size("memory.safety_margin", mem.safety_margin, margin)


def _check_solver(cfg: Config) -> None:
    sol = cfg.solver
    _require(not sol.dual or sol.jitter > 0, "solver.jitter", sol.jitter,
             "the direct route's dual form inverts P + jitter I, which needs jitter > 0 (P may be singular)",
             f"{_set_default('solver.jitter')}, or solver.dual=false")


def _check_gcv(cfg: Config) -> None:
    """model.penalties=gcv: float64, and a grid of at least 3 and at most `MAX_GCV_GRID` candidates."""
    if cfg.model.penalties != PenaltyMode.gcv:
        return
    _require(cfg.dtype == DType.float64, "dtype", cfg.dtype.value, "model.penalties=gcv scores y'y - 2 beta'b + "
             "beta'G beta, terms of the size of y'y whose difference float32 (7 digits) loses",
             "set dtype=float64, or model.penalties=fixed")
    gcv = cfg.model.gcv
    size = len(gcv.offsets)
    _require(3 <= size <= MAX_GCV_GRID, "model.gcv.step", gcv.step,
             f"the grid ap - {gcv.span:g} ... ap + {gcv.span:g} in steps of {gcv.step:g} has {size} candidate(s) "
             f"per effect (3 to {MAX_GCV_GRID} are allowed)",
             f"set model.gcv.step to at most model.gcv.span={gcv.span:g} and at least {gcv.span / 200:g}, e.g. "
             f"{_set_default('model.gcv.step')}")


def check_gcv_effects(cfg: Config, specs: Mapping[str, Any]) -> None:
    """Every effect named in model.gcv.effects is one of the model's (checked once the effects are parsed)."""
    named = cfg.model.gcv.effects or []
    unknown = [name for name in named if name not in specs]
    _require(not unknown, "model.gcv.effects", list(named), f"no effect named {', '.join(map(repr, unknown))} in "
             "the model", f"name effects among {', '.join(specs)}, or set model.gcv.effects=null (every effect "
             f"with ap >= model.gcv.min_ap)")


def _check_hw(cfg: Config) -> None:
    hw = cfg.hw
    known = {"cuda", "mps", "xpu", "cpu"}
    bad = [d for d in hw.preference if d not in known]
    _require(not bad and len(hw.preference) > 0, "hw.preference", list(hw.preference),
             "unknown device in the preference list", "list devices among cuda, mps, xpu, cpu")
    _require(not hw.check_placement or hw.device.value == "cpu", "hw.check_placement", True,
             f"the placement check runs on the CPU (as a device of its own), not with hw.device={hw.device.value}",
             "use hw=check (the CPU, checked), or hw.check_placement=false")


def _check_data(cfg: Config) -> None:
    _require(cfg.data.source != DataSource.file or bool(cfg.data.path), "data.path", cfg.data.path,
             "data.source=file needs the path of a CSV file", "set data.path=/path/to/file.csv")
    _require(cfg.data.source != DataSource.embedded or not cfg.data.path, "data.path", cfg.data.path,
             f"the embedded table (data={cfg.data.name}) reads no file, so this path would be ignored",
             "add data=csv to read it (python -m tamrun data=csv data.path=<file> data.target=<column>), or drop "
             "data.path")
    _require(len(cfg.data.delimiter) == 1 and cfg.data.delimiter not in "\"\r\n", "data.delimiter",
             cfg.data.delimiter, "the column separator must be one character (not a quote or a line end)",
             "set data.delimiter=',' (or ';', '\\t', '|')")
    try:
        codecs.lookup(cfg.data.encoding)
    except LookupError:
        raise ConfigError("data.encoding", cfg.data.encoding, "not a text encoding Python knows",
                          "set data.encoding=utf-8 (or latin-1, cp1252, utf-16, ...)") from None
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
            parse_expression(f"{field}.expr", derived.expr)  # settings are data: no code before any data
    check_calendar(cfg)
    check_history(cfg)


def _check_adaptive(cfg: Config) -> None:
    ada = cfg.adaptive
    sliding = cfg.mode.name == ModeName.adaptive and ada.method == AdaptiveMethod.sliding
    _require(not sliding or cfg.split.validation_start is None, "split.validation_start",
             cfg.split.validation_start, "mode=adaptive refits on every training and test row; a validation period "
             "would leave a gap in its windows", "set split.validation_start=null, or use mode=run to tune on it "
             "(adaptive.method=kalman chooses its settings on a validation period)")
    _check_kalman(cfg)
    _require(ada.horizon is None or ada.horizon >= ada.step, "adaptive.horizon", ada.horizon,
             f"the horizon must be >= adaptive.step={ada.step} days, or the days between a refit's "
             "horizon and the next refit would not be forecast", f"set adaptive.horizon={ada.step} or null")


def _check_backtest(cfg: Config) -> None:
    """mode=backtest: its offsets and refit (`tamrun.config.offsets.check_backtest`); no validation period, no
    GCV and no Ray sharding (each window is fitted here with the configured penalties)."""
    if cfg.mode.name != ModeName.backtest:
        return
    check_backtest(cfg.split.test_start, cfg.backtest)
    _require(cfg.split.validation_start is None, "split.validation_start", cfg.split.validation_start,
             "mode=backtest scores every window on the days after its cut-off, and trains it on every row before; "
             "a validation period would leave a gap", "set split.validation_start=null (the backtest's windows are "
             "its held-out periods)")
    _require(cfg.model.penalties != PenaltyMode.gcv, "model.penalties", "gcv", "mode=backtest fits every window "
             "with the configured penalties", "set model.penalties=fixed (tune the penalties with a sweep on "
             "objective=rmse_backtest)")
    _require(cfg.shard.over.value == "local", "shard.over", cfg.shard.over.value, "mode=backtest fits its windows "
             "here, in batches of windows x groups", "set shard.over=local")


def _check_kalman(cfg: Config) -> None:
    """The grid of (q, p0): finite, q >= 0, p0 > 0; more than one pair needs a validation period."""
    kal, field = cfg.adaptive.kalman, "adaptive.kalman"
    for name, low_open in (("q", False), ("p0", True)):
        values = list(getattr(kal, name))
        bad = [v for v in values if not (math.isfinite(v) and (v > 0 if low_open else v >= 0))]
        _require(bool(values) and not bad, f"{field}.{name}", values,
                 f"the grid must hold at least one finite value {'> 0' if low_open else '>= 0'}",
                 f"{_set_default(f'{field}.{name}')} (a list in brackets), or one value, e.g. {field}.{name}=[1e-5]")
    pairs = len(kal.q) * len(kal.p0)
    chooses = cfg.mode.name == ModeName.adaptive and cfg.adaptive.method == AdaptiveMethod.kalman and pairs > 1
    _require(not chooses or cfg.split.validation_start is not None, "split.validation_start", None,
             f"adaptive.kalman's grid has {pairs} (q, p0) pairs and nothing to choose among them on",
             "set split.validation_start (e.g. 2023-01-01: the pair with the lowest validation RMSE is kept), "
             f"or give one pair, e.g. {field}.q=[1e-5] {field}.p0=[1]")


def _check_intervals(cfg: Config) -> None:
    """intervals.levels: distinct, each strictly between 0 and 1; method=online only where forecasts are
    issued day by day (mode adaptive or aggregate)."""
    levels = [float(level) for level in cfg.intervals.levels]
    for level in levels:
        _require(0.0 < level < 1.0, "intervals.levels", level, "an interval's level must lie strictly between 0 "
                 "and 1 (0.8: 80 % of the rows inside)", "e.g. intervals.levels=[0.8,0.95], or [] for no intervals")
    _require(len(set(levels)) == len(levels), "intervals.levels", levels, "a level is given twice",
             "give each level once, e.g. intervals.levels=[0.8,0.95]")
    online = cfg.intervals.method == IntervalMethod.online
    _require(not online or cfg.mode.name in (ModeName.adaptive, ModeName.aggregate), "intervals.method", "online",
             f"mode={cfg.mode.name.value} forecasts its test period at once, so no test day's truth is known before "
             "the next is forecast", "use intervals.method=fixed (or auto), or a day-ahead mode (mode=adaptive, "
             "mode=aggregate)")


def _check_aggregate(cfg: Config) -> None:
    """mode=aggregate: a validation period, at least two experts of mode run or adaptive, and non-empty
    grids (EWA's eta finite and > 0)."""
    if cfg.mode.name != ModeName.aggregate:
        return
    agg, field = cfg.aggregate, "aggregate"
    _require(cfg.split.validation_start is not None, "split.validation_start", None,
             "mode=aggregate chooses its rule on a validation period and warms the weights up over it",
             "set split.validation_start (e.g. 2023-01-01 for a test year 2024)")
    _require(len(agg.experts) >= 2, f"{field}.experts", sorted(agg.experts),
             f"mode=aggregate combines experts and has {len(agg.experts)}",
             f"add experts, e.g. '+{field}.experts.static={{model: spline}}' (+experiment=day_ahead_aggregate lists some)")
    for name, expert in agg.experts.items():
        _require(re.fullmatch(r"[A-Za-z0-9_]+", name) is not None and name not in RESERVED_EXPERT_NAMES,
                 f"{field}.experts.{name}", name, "an expert's name names its forecast column and metrics "
                 f"(letters, digits and _; not {', '.join(RESERVED_EXPERT_NAMES)})", "rename the expert")
        _require(expert.mode in (ModeName.run, ModeName.adaptive), f"{field}.experts.{name}.mode", expert.mode.value,
                 "an expert forecasts with mode run (the static model) or adaptive (adaptive.method=kalman)",
                 f"set {field}.experts.{name}.mode=run or adaptive")
    bad = [v for v in agg.eta if not (math.isfinite(v) and v > 0)]
    _require(bool(agg.eta) and not bad, f"{field}.eta", list(agg.eta),
             "EWA's learning rates must be finite and > 0 (at least one)",
             f"set {field}.eta={cli_list(schema_default(f'{field}.eta'))}, or one value, e.g. {field}.eta=[1]")
    for name in ("rules", "gradient", "per_group"):
        values = list(getattr(agg, name))
        _require(bool(values), f"{field}.{name}", values, "the list of candidates is empty",
                 f"set {field}.{name}={cli_list(schema_default(f'{field}.{name}'))}")


def _check_refit(cfg: Config) -> None:
    """split.refit: mode=run (or its plan) only, its groups fitted in this process."""
    if not cfg.split.refit:
        return
    _require(cfg.mode.name in (ModeName.run, ModeName.plan), "split.refit", True,
             f"only mode=run refits on its validation period (this is mode={cfg.mode.name.value}, which "
             "refits or chooses in its own way)", "set split.refit=false, or use mode=run")
    _require(cfg.shard.over != ShardOver.ray, "split.refit", True, "a run sharded over a Ray cluster "
             "(shard.over=ray) does not refit yet", "set split.refit=false, or shard.over=local")


def cli_list(values: List[Any]) -> str:
    """A list as the command line writes it: [ewa,mlpoly], [0.1,1], [true,false]."""
    return "[" + ",".join(cli_text(v) for v in values) + "]"


def _check_tracking(cfg: Config) -> None:
    """A name for the experiment; no secret in it nor in the artifact root, which MLflow keeps in clear
    (`tamrun.config.secret_sources.check_no_secret`: an experiment is found by its name, which cannot be
    masked; a run's name is a label, written redacted)."""
    _require(bool(cfg.tracking.experiment.strip()), "tracking.experiment", cfg.tracking.experiment,
             "the experiment name is empty", _set_default("tracking.experiment"))
    check_no_secret("tracking.experiment", cfg.tracking.experiment, "as the experiment's name",
                    "give tracking.experiment a name without it")
    check_no_secret("tracking.artifact_root", cfg.tracking.artifact_root, "as the experiment's artifact location and "
                    "every run's artifact URI", "take the credentials out of the URI: the artifact store's client "
                    "reads them from its environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    "AZURE_STORAGE_CONNECTION_STRING, GOOGLE_APPLICATION_CREDENTIALS, ...)")


def _check_tco(cfg: Config) -> None:
    """Every machine class's numbers in their ranges (a price of zero or less among them, named with its
    class), and tco.measured_on one of the classes."""
    classes = cfg.tco.classes
    for name, machine in classes.items():
        field = f"tco.classes.{name}"
        check_numbers(machine, field, MACHINE_CLASS, lambda key: f"<{MACHINE_CLASS[key].what}>")
        _require(machine.kind.value == "gpu" or machine.cores is not None, f"{field}.cores", None,
                 "a CPU class needs its number of cores", f"set {field}.cores=<cores>")
    measured = cfg.tco.measured_on
    _require(measured is None or measured in classes, "tco.measured_on", measured, "no machine class of that name",
             f"name one of {', '.join(classes) or '(none: add tco.classes)'}, or set tco.measured_on=null")


def scored_splits(cfg: Config) -> List[str]:
    """The splits a run of this config scores as rmse_<split> and mape_<split>."""
    if cfg.mode.name == ModeName.aggregate:
        return ["test", "validation"]
    if cfg.mode.name == ModeName.adaptive:
        chooses = cfg.adaptive.method == AdaptiveMethod.kalman and cfg.split.validation_start
        return ["test", "test_static"] + (["validation"] if chooses else [])
    return ["train", "test"] + (["validation"] if cfg.split.validation_start else [])


def _check_objective(cfg: Config) -> None:
    """An objective of the form rmse_<split> / mape_<split> must name a split this run scores (checked
    before anything runs; other metric names are checked once the run has logged its metrics)."""
    if cfg.mode.name == ModeName.plan:
        return
    named = [("objective", cfg.objective)] + [("more_objectives", name) for name in cfg.more_objectives]
    for field_name, objective in named:
        match = re.fullmatch(r"(rmse|mape)_(\w+)", objective or "")
        if match is None:
            continue
        splits = scored_splits(cfg)
        hint = " (set split.validation_start to score a validation period)" if match[2] == "validation" else ""
        _require(match[2] in splits, field_name, objective, f"this run scores no split {match[2]!r}{hint}",
                 f"use one of: {', '.join(f'{match[1]}_{split}' for split in splits)}")
