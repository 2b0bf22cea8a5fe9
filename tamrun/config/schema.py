"""Typed schemas of every config group; Hydra merges the YAML of conf/ into these.

The root `Config` is registered as ``base_config`` (see `tamrun.config.store`), so a wrong type or an
unknown key is refused by Hydra itself; range and consistency checks live in `tamrun.config.checks`.
Effects are a mapping name -> spec (``Dict[str, Any]`` here) so that every field of every effect can
be overridden on the command line; each spec is parsed into its kind's dataclass in
`tamrun.config.effects`. Every other mapping of the schema is declared with `mapping_of`: ``Dict[str, Any]``
to Hydra, so that a whole entry can be added on the command line
(``'+data.derived.tempc={kind: expr, expr: "temperature - 273.15"}'``: OmegaConf refuses a plain dict as
a new value of a ``Dict[str, <dataclass>]``), each entry typed into its dataclass by
`tamrun.config.entries.type_mappings` (a misspelt field or a wrong type is refused there, with its full path).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from tamrun.config.units import parse_size

# The metadata keys of a `mapping_of` field: the dataclass of its entries, and what one entry is called.
ENTRY_TYPE = "entry_type"
ENTRY_NAME = "entry_name"


def mapping_of(entry_type: type, entry_name: str) -> Any:
    """A ``name -> entry_type`` field, declared ``Dict[str, Any]`` (see the module doc): its entries are
    typed into ``entry_type`` when the config is loaded (`tamrun.config.entries.type_mappings`);
    ``entry_name`` (e.g. "a derived column") names one in messages."""
    return field(default_factory=dict, metadata={ENTRY_TYPE: entry_type, ENTRY_NAME: entry_name})


class DType(str, Enum):
    float64 = "float64"
    float32 = "float32"


class DeviceKind(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"
    xpu = "xpu"


class SolverName(str, Enum):
    auto = "auto"
    direct = "direct"
    cg = "cg"


class Preconditioner(str, Enum):
    none = "none"
    jacobi = "jacobi"
    block_jacobi = "block_jacobi"  # exact inverse of the dense effects' block, Jacobi elsewhere
    two_level = "two_level"  # block_jacobi plus a coarse correction on the forests' tree sums (solve/coarse.py)


class CountDType(str, Enum):
    """The dual form's leaf co-occurrence counts: bfloat16 (exact up to 256 trees, float32 beyond),
    float32 (exact up to 2^24), or auto: bfloat16 where the hardware multiplies it natively (CUDA, CPUs
    with AVX512-BF16 / AMX), else float32 (bfloat16 products are emulated, ~5x slower than float32, on
    an AVX2 CPU)."""

    auto = "auto"
    bfloat16 = "bfloat16"
    float32 = "float32"


class DataSource(str, Enum):
    embedded = "embedded"
    file = "file"


class ModeName(str, Enum):
    run = "run"
    plan = "plan"
    adaptive = "adaptive"
    aggregate = "aggregate"
    backtest = "backtest"


class AdaptiveMethod(str, Enum):
    """mode=adaptive: sliding-window refits of the coefficients, or a Kalman filter on the effects."""

    sliding = "sliding"
    kalman = "kalman"


class BacktestRefit(str, Enum):
    """mode=backtest: what each window is trained on (docs/backtest.md)."""

    expanding = "expanding"  # every row before its cut-off (from split.train_start)
    sliding = "sliding"  # the rows of [cut-off - backtest.length, cut-off)
    once = "once"  # one fit on the rows before the first cut-off, used for every window


class IntervalMethod(str, Enum):
    """How prediction intervals are calibrated (tamrun/fit/intervals.py): ``auto`` is ``online`` for the
    day-ahead modes (adaptive, aggregate: their forecasts are issued day by day) and ``fixed`` for a run."""

    auto = "auto"
    fixed = "fixed"
    online = "online"


class KalmanState(str, Enum):
    """What the Kalman filter adapts: one weight per effect (and the intercept), or every coefficient."""

    effects = "effects"
    coefficients = "coefficients"


class AggregationRule(str, Enum):
    """mode=aggregate: how the experts' weights follow their past losses (tamrun/aggregate/rules.py):
    exponentially weighted averages with a learning rate, or ML-Poly (one adaptive rate per expert)."""

    ewa = "ewa"
    mlpoly = "mlpoly"


class PenaltyMode(str, Enum):
    """How the effects' penalties are set: ``fixed`` = each effect's configured ``ap``; ``gcv`` = chosen
    by generalised cross-validation on the training rows before the fit (`tamrun.fit.gcv`)."""

    fixed = "fixed"
    gcv = "gcv"


class ShardOver(str, Enum):
    """Where a run's groups are fitted: ``local`` in this process, ``ray`` as tasks of a Ray cluster."""

    local = "local"
    ray = "ray"


class ProgressMode(str, Enum):
    auto = "auto"  # a bar on a terminal, log lines otherwise
    bar = "bar"
    log = "log"
    off = "off"


class NanPolicy(str, Enum):
    error = "error"
    drop = "drop"


class CheckPolicy(str, Enum):
    """What a data check does when it finds a problem: stop the run (exit 2) or log a warning."""

    error = "error"
    warn = "warn"


class OutlierPolicy(str, Enum):
    """What the target's outlier check does with rows far outside the rest: stop the run (exit 2), log a
    warning, or drop them (with a warning)."""

    error = "error"
    warn = "warn"
    drop = "drop"


# The parts of the date a derived column of kind calendar reads (tamrun/data/calendar.py), in local time
# (data.timezone): hour (0-23), time_of_day (the index of the time within its day in steps of the table's
# own: 0-23 hourly, 0-47 half-hourly), day_of_week (0 = Monday), day_of_year (1-366), year_fraction
# (day_of_year over the days of its year: 1/365 .. 1), week (ISO, 1-53), month (1-12), weekend (1.0 on
# Saturday and Sunday), day_off (1.0 on a weekend or a public holiday of data.holidays).
CALENDAR_PARTS = ("time_of_day", "hour", "day_of_week", "day_of_year", "year_fraction", "week", "month", "weekend",
                  "day_off")
# The derived kinds that read earlier rows (tamrun/data/history.py), the statistics of a rolling window and of
# a smooth's day, and the rows a history column reads.
HISTORY_KINDS = ("lag", "rolling", "smooth")
ROLLING_STATS = ("mean", "min", "max")
ROLLING_ALIGNS = ("row", "day")
HISTORY_OVER = ("group", "table")


@dataclass
class DerivedColumn:
    """A column computed from the data before the effects see it.

    kind ``time_index``: (date - first training date) in units of ``unit`` (a pandas offset such as
    ``D`` or ``h``); kind ``isin``: 1.0 where ``column`` takes one of ``values``, else 0.0;
    kind ``expr``: arithmetic and comparisons on columns and literals (``(temp_f - 32) / 1.8``,
    ``dow >= 5``), checked against an allow-list before it is evaluated (`tamrun.config.expr`);
    kind ``calendar``: the ``part`` of the date (`CALENDAR_PARTS`) in local time; kind ``holiday``: 1.0 on a
    public holiday of data.holidays. ``bridge`` (holiday, and calendar's day_off): bridge days count too.
    The history kinds (`HISTORY_KINDS`, `tamrun.data.history`) read ``column``'s earlier rows of the same group,
    in time order: ``lag`` its value at exactly t - ``by``; ``rolling`` the ``stat`` of its rows in a ``window``
    ending ``gap`` before t (``align: row``) or before the local midnight of t's day (``align: day``);
    ``smooth`` its exponential smoothing with ``factor`` (per local day under ``daily``).
    """

    kind: str = MISSING
    column: Optional[str] = None
    values: Optional[List[float]] = None
    unit: str = "D"
    expr: Optional[str] = None
    # kind calendar: one of CALENDAR_PARTS.
    part: Optional[str] = None
    # kind holiday, and calendar's day_off: also 1.0 on a bridge day (a working day between a public holiday
    # and a weekend or another holiday: the Friday after a Thursday holiday, the Monday before a Tuesday one).
    bridge: bool = False
    # The history kinds' durations are pandas offsets: D and W count local calendar days under data.timezone
    # (the same clock time n days earlier), h, min, s elapsed time. Kind lag: how far back (1D, 7D, 30min).
    by: Optional[str] = None
    # Kind rolling: the statistic (one of ROLLING_STATS) of the rows in a window of length ``window`` (1D,
    # 12h), ending ``gap`` before the row (align: row: rows in [t - gap - window, t - gap)) or ``gap`` before
    # the local midnight that starts the row's day (align: day: the previous day's level with window 1D).
    stat: str = "mean"
    window: Optional[str] = None
    align: str = "row"
    gap: str = "0s"
    # Kind smooth: s_t = factor * s_prev + (1 - factor) * x_t in time order, s_first = x_first (0 <= factor < 1);
    # ``daily`` (one of ROLLING_STATS): the column's mean, min or max of each local day smoothed day by day,
    # each row given its own day's value.
    factor: Optional[float] = None
    daily: Optional[str] = None
    # The rows a history column reads: ``group`` (each group of data.group in its own time order) or ``table``
    # (every row in time order, groups ignored: each date at most once; not streamed nor sharded).
    over: str = "group"


@dataclass
class DataConfig:
    name: str = "national"
    # embedded: the national dataset shipped inside the package; file: the CSV at `path`.
    source: DataSource = DataSource.embedded
    path: Optional[str] = None
    date_column: str = "date"
    # The file's column separator (one character: "," ";" "\t" "|") and its text encoding (Python's name:
    # utf-8, latin-1, cp1252, utf-16, ...); a file that does not match is named with the fix (tamrun/data/file_kind.py).
    delimiter: str = ","
    encoding: str = "utf-8"
    # The dates' format: strftime codes (e.g. "%d/%m/%Y %H:%M") or "ISO8601"; None: the format of the
    # file's first date (ISO 8601 when it starts with the year), the same for every row.
    date_format: Optional[str] = None
    # Without date_format, a first date such as 01/02/2024 reads day first (1 February), not month first;
    # dates that start with the year are ISO 8601 either way.
    dayfirst: bool = False
    # The table's local time zone (IANA name, e.g. "Europe/Paris"); None: dates are taken as they are. When
    # set, dates are held in UTC (naive) so that the hour the clocks go back is not a duplicate, the split's and
    # the backtest's days are local midnights, and calendar parts are read in local time (tamrun/data/dates.py).
    timezone: Optional[str] = None
    # The country whose public holidays derived columns of kind holiday (and calendar's day_off) read: its
    # ISO code as the holidays package names it (FR, DE, US, GB, ...); None: none (day_off is the weekend).
    holidays: Optional[str] = None
    # A subdivision of that country with holidays of its own (DE: BY, BW, ...; US: CA, NY, ...); None: the
    # country's national ones.
    holiday_subdivision: Optional[str] = None
    target: str = "Load"
    group: Optional[str] = "tod"
    # name -> DerivedColumn (typed when loaded, see `mapping_of`).
    derived: Dict[str, Any] = mapping_of(DerivedColumn, "a derived column")
    nan_policy: NanPolicy = NanPolicy.error
    # The target's unit, on the plots' axes (e.g. MW); "" = none.
    unit: str = ""
    # Two rows with the same date in one group (the same date when there is no group).
    duplicate_dates: CheckPolicy = CheckPolicy.error
    # A model column that takes a single value over the whole training split.
    constant_features: CheckPolicy = CheckPolicy.error
    # A group with fewer training rows than the model has coefficients (the penalties decide the rest).
    # Normal for a forest crossing: with one in the model, warn only says so at INFO (nothing is wrong).
    small_groups: CheckPolicy = CheckPolicy.warn
    # A model column constant within some groups of the training split (not all: see constant_features);
    # those groups' effect learns nothing.
    constant_in_group: CheckPolicy = CheckPolicy.warn
    # Target values far outside the rest (farther from the median than tamrun.data.checks.OUTLIER_SPREADS
    # robust spreads: a sentinel such as -999999, a 1e308): their fit and metrics would mean nothing.
    target_outliers: OutlierPolicy = OutlierPolicy.error
    # Rows parsed at a time when reading the file: the read's transient memory is one such block
    # (its text and date strings), not the whole file's.
    read_chunk_rows: int = 65536


@dataclass
class SplitConfig:
    """Calendar split; all bounds are inclusive days (``None`` = open end)."""

    train_start: Optional[str] = None
    train_end: str = "2023-12-31"
    test_start: str = "2024-01-01"
    test_end: Optional[str] = "2024-12-31"
    # A validation period carved out of the training one (for tuning, never the test period): rows
    # from validation_start to validation_end (None = train_end) are not fitted but predicted and
    # scored as rmse_validation / mape_validation. None = no validation split.
    validation_start: Optional[str] = None
    validation_end: Optional[str] = None
    # mode=run with a validation period: fit without it, predict it (its held-out residuals calibrate the
    # intervals, its scores are rmse_validation / mape_validation), then refit on every training row, the
    # validation period's included: the refit is the model, its test metrics the run's (tamrun/jobs/refit.py;
    # python -m tamrun.compare --refit). Without a validation period a plain run.
    refit: bool = False


@dataclass
class GcvConfig:
    """The search of ``model.penalties=gcv`` (docs/configuration.md, automatic penalties): coordinate
    descent over the tuned effects, each effect's log10 penalty taken from the grid
    ap_j + {-span, -span + step, ..., +span} around its configured ``ap`` (clipped to [-60, 20]) with
    the other effects' held, for at most ``sweeps`` passes over the effects (fewer once a pass changes
    nothing). The criterion is the pooled GCV score of the training rows (`tamrun.fit.gcv`)."""

    # Half-width of each effect's grid, in decades of lambda.
    span: float = 3.0
    # The grid's step, in decades (span 3, step 0.5: 13 candidates per effect).
    step: float = 0.5
    # Passes of coordinate descent over the tuned effects.
    sweeps: int = 2
    # The effects tuned; None = every effect whose configured ap >= min_ap. The intercept is never tuned
    # (its ap only keeps the system definite), nor by default an effect left unpenalised on purpose
    # (the presets' Load_d1, ap=-30).
    effects: Optional[List[str]] = None
    min_ap: float = -20.0

    @property
    def offsets(self) -> List[float]:
        """The grid's offsets from an effect's configured ap: k step for |k step| <= span, ascending."""
        most = int(self.span / self.step + 1e-9)
        return [k * self.step for k in range(-most, most + 1)]


@dataclass
class ModelConfig:
    name: str = MISSING
    effects: Dict[str, Any] = field(default_factory=dict)
    intercept: bool = True
    # log10 penalty of the intercept column (the peer uses -9).
    intercept_ap: float = -9.0
    # fixed: the effects' configured ap; gcv: chosen per effect by generalised cross-validation on the
    # training rows (settings: model.gcv), then the fit uses the chosen ones. Float64 only (the score
    # subtracts Gram terms of the size of y'y).
    penalties: PenaltyMode = PenaltyMode.fixed
    gcv: GcvConfig = field(default_factory=GcvConfig)


@dataclass
class HardwareConfig:
    device: DeviceKind = DeviceKind.auto
    # Order tried by device=auto.
    preference: List[str] = field(default_factory=lambda: ["cuda", "mps", "xpu", "cpu"])
    # torch intra-op threads on the CPU; None: the CPUs a job has (tamrun/machine/threads.py): all usable cores
    # (affinity mask, cgroup CPU quota) in a single run, cores // jobs at once in a parallel sweep
    # (hydra/launcher=parallel: n_jobs), ray.remote.num_cpus or cpus_per_task under Ray or SLURM; at most
    # OMP_NUM_THREADS when the environment sets it.
    threads: Optional[int] = None
    # hydra/launcher=parallel: fork the sweep's worker processes from the launching one, which loads the
    # job's modules (torch, pandas, MLflow, tamrun) once before they start (tamrun/sweeps/forked_workers.py);
    # false: joblib's loky workers, fresh interpreters that each import them (~5 s on 2 cores).
    fork_workers: bool = True
    # torch.use_deterministic_algorithms and tamrun's own deterministic kernels (the leaf sums slot by slot
    # instead of sparse products, index_add_ by a sorted kernel instead of float atomics; cuBLAS with a
    # fixed workspace) for bitwise-repeatable GPU runs, at some speed; an operation torch has no
    # deterministic kernel for is refused (exit 2). CPU runs repeat bitwise either way (same thread count).
    deterministic: bool = False
    # The CPU as a compute device of its own (hw=check; tests and debugging): tensors placed on it are
    # tagged, and an operation mixing them with host tensors fails as it would on a GPU
    # (tamrun/machine/placement.py). Only with a CPU device; the run is slower (a Python hook on every operation).
    check_placement: bool = False


@dataclass
class OomConfig:
    """The OOM guard (tamrun.memory.guard): on an out-of-memory error a step is retried with its size
    shrunk, size_{i+1} = floor(size_i * size_factor), after a delay of delay_ms * 2^i."""

    # Retries of a step after out-of-memory errors, then a MemoryBudgetError names the settings to change.
    max_retries: int = 3
    # The shrink factor of each retry, in (0, 1).
    size_factor: float = 0.7
    # The first retry's back-off (doubled at each retry).
    delay_ms: float = 200.0
    # Log every OOM event as a warning (info otherwise).
    verbose: bool = False


@dataclass
class MemoryConfig:
    """The memory waterfall (docs/architecture.md, the memory waterfall); fractions are of free memory."""

    # The dense direct solve is taken only if one group's system fits in this fraction ...
    dense_fraction: float = 0.9
    # ... and D <= this; otherwise matrix-free CG.
    max_dense_dim: int = 7500
    # Budget of a static data chunk on a GPU / on the CPU. The CPU's leaves room for what its C
    # allocator holds beyond the live tensors (freed blocks, its arenas): the resident set grew up to
    # 1.6x the planned chunk bytes on the forest presets (docs/memory.md).
    chunk_fraction_gpu: float = 0.9
    chunk_fraction_cpu: float = 0.5
    # Budget of a sliding-window batch (mode=adaptive) on a GPU / on the CPU.
    window_fraction_gpu: float = 0.8
    window_fraction_cpu: float = 0.6
    # A cap on everything above: bytes or a size string ("2GiB", "512MB"); None = no cap.
    limit: Optional[str] = None
    # On the CPU the oracle plans in what is left below the tightest real limit (the cgroup's memory
    # limit, RLIMIT_AS, RLIMIT_DATA, available RAM) less what the process holds, less this margin
    # (tamrun/machine/limits.py): room for what no footprint counts (Python objects, the metrics, the
    # tracking calls, the allocator's slack). What the recording adds (the predictions table, the plots,
    # the model) is reserved beside it (tamrun/memory/footprint.py, recording_bytes).
    safety_margin: str = "16MiB"
    # Every predicted footprint is multiplied by this.
    overhead_factor: float = 1.1
    # A table whose rows need more than the host's free memory (under the cgroup, the rlimits, the
    # available RAM) is streamed in chunks of groups (tamrun/jobs/stream.py); true: memory.limit bounds the
    # data too, so a table larger than it streams as well (on the CPU the limit otherwise bounds the fit's
    # working memory only).
    data_in_limit: bool = False
    # Rows per design chunk never exceed this on the CPU: a smaller chunk holds less of Phi at once at no
    # cost in speed (the Gram is accumulated chunk by chunk); None = as many rows as the budget allows.
    max_chunk_rows: Optional[int] = 1024
    # The same cap on a GPU. There every chunk costs its kernels' launches in each CG product (forest x
    # Fourier on an H200: 4 chunks of 1,024 rows, 194 launches and 3.1 ms an iteration for 1.1 ms of
    # kernels, docs/benchmarks.md), so the budget alone bounds a chunk.
    max_chunk_rows_gpu: Optional[int] = None
    # A chunk keeps all groups while this many rows (or all rows, if fewer) of every group fit;
    # below that it holds fewer groups (the chunk selector, tamrun/memory/footprint.py). A CG chunk
    # never holds fewer rows (each product goes over every chunk): below it the plan refuses.
    min_chunk_rows: int = 1024
    # Count the exact tensor bytes of the solve and predict phases (their working peak); on CUDA the
    # allocator's peak above each phase's start (no per-operation hook).
    meter: bool = True
    # The meter counts repeated work once (the first row chunk, group, chunk of groups and CG
    # iteration of each shape: tamrun/machine/sampling.py), at a few per cent of the fit; false: every
    # operation (the check of the sampled figures, up to half the fit's time again).
    meter_sampling: bool = True
    # The OOM guard; the environment variables OOM_MAX_RETRIES / OOM_SIZE_FACTOR / OOM_DELAY_MS /
    # OOM_VERBOSE override these fields.
    oom: OomConfig = field(default_factory=OomConfig)

    @property
    def limit_bytes(self) -> Optional[int]:
        """``limit`` in bytes (None: no cap); the one place it is parsed (ValueError if not a size)."""
        return parse_size(self.limit)

    @property
    def safety_margin_bytes(self) -> int:
        """``safety_margin`` in bytes (ValueError if not a size)."""
        return int(parse_size(self.safety_margin) or 0)


@dataclass
class SolverConfig:
    name: SolverName = SolverName.auto
    # solver=auto factors a dense system (D, or N in the dual form) of at most this dimension; beyond
    # it the two-level preconditioned CG is the faster exact route (forest_fourier, N = 4,039: 260
    # iterations against the dual form's 48 factorisations, docs/benchmarks.md). memory.max_dense_dim
    # bounds it from the memory side.
    direct_max_dim: int = 2048
    # CG stops when ||r_g|| <= tol * ||b_g|| for every group g; None = the dtype's default
    # (tamrun.solve.cg.DEFAULT_TOL: 1e-6 in float64, 1e-5 in float32).
    tol: Optional[float] = None
    # CG's iteration cap per group (a warning names this setting when it is hit).
    max_iter: int = 2000
    # CG preconditioner: none | jacobi | block_jacobi (the dense effects' block inverted exactly, each
    # leaf's block of a forest crossing likewise, Jacobi elsewhere) | two_level (block_jacobi plus a
    # coarse correction on each forest's tree sums and the dense columns; block_jacobi without forests).
    preconditioner: Preconditioner = Preconditioner.two_level
    # block_jacobi inverts the dense columns' block when it has at most this many columns (else Jacobi).
    block_max_dim: int = 512
    # Jitter added to the normalised system: (Phi'Phi/n + P + jitter I) beta = Phi'y/n.
    jitter: float = 1e-6
    # Cholesky retries multiply the jitter by jitter_growth (jitter * growth^t for t = 1..jitter_max_tries),
    # then the direct route falls back to LU (logged).
    jitter_growth: float = 10.0
    jitter_max_tries: int = 4
    # Direct route: when a group has fewer rows N than columns D, solve the N x N dual (kernel)
    # system (Phi P~^-1 Phi' + n I) alpha = y, beta = P~^-1 Phi' alpha instead of the D x D one.
    dual: bool = True
    # Dual form: the leaf co-occurrence counts of a forest block with at most this many leaves (R)
    # come from a dense product of its N x R leaf indicator, else from a sparse product.
    dual_dense_counts_max: int = 4096
    # Dual form, wide forests (more leaves than dual_dense_counts_max): leaves with more rows than this
    # join the dense product (a column costs about N^2 flops), the pairs of rows in the others are
    # scattered (s (s + 1) / 2 adds for a leaf of s rows).
    dual_scatter_max_leaf_rows: int = 96
    # Dual form, wide forests: pairs of rows scattered at a time while the leaf counts are made (each
    # pair costs about 44 bytes of temporaries, see tamrun/memory/footprint.py).
    dual_scatter_pairs_per_step: int = 1 << 20
    # Dual form: the dtype of that dense product; bfloat16 is exact for forests of at most 256 trees
    # (float32 is used beyond) and several times faster on CPUs and GPUs with bfloat16 arithmetic;
    # auto takes it only there (`tamrun.solve.dual.count_dtype`).
    dual_counts_dtype: CountDType = CountDType.auto
    # Dual form: rows of K's lower triangle built at a time (the temporaries are about
    # dual_tile_rows x N x (2 itemsize + 2) bytes).
    dual_tile_rows: int = 1024
    # CG starts from these coefficients (a run's fit/coefficients.csv, same model and groups) instead
    # of zeros; None = zeros.
    warm_start: Optional[str] = None


@dataclass
class TrackingConfig:
    enabled: bool = True
    # The MLflow store, e.g. sqlite:////abs/path/mlflow.db or http://tracking-server:5000; None: the
    # environment's MLFLOW_TRACKING_URI when set (as MLflow reads it), else sqlite:///<cwd>/outputs/mlflow.db
    uri: Optional[str] = None
    # When uri is None: the environment variable holding the URI (tracking=server: MLFLOW_TRACKING_URI),
    # so a URI with credentials is never written in a config; unset or empty is an error. None: not used.
    uri_env: Optional[str] = None
    # None: <folder of the sqlite file>/mlartifacts
    artifact_root: Optional[str] = None
    experiment: str = "tamrun"
    # Extra tags of the run (name -> value), e.g. +tracking.tags.team=grid; python -m tamrun.compare --refit
    # sets refit_of=<run id>.
    tags: Dict[str, str] = field(default_factory=dict)
    # None: <model.name>-<data.name>
    run_name: Optional[str] = None
    log_predictions: bool = True
    log_plots: bool = True
    # The fitted model as an MLflow LoggedModel named "model" (runs:/<run id>/model), with its signature
    # (outputs), input example, training support, its state as data and one wheel of tamrun; the sha256 of
    # each file recorded in the store (tamrun/tracking/pyfunc_model.py).
    log_model: bool = True
    # sqlite stores: each connection waits this long for a lock held by another process.
    busy_timeout_s: float = 60.0
    # sqlite stores: the longest wait for <db>.lock (first creation/migration, experiment creation).
    lock_timeout_s: float = 300.0
    # http(s) and database (postgresql://...) stores: how long to wait for the server's TCP answer before
    # failing with a clear error.
    connect_timeout_s: float = 5.0
    # Where a sweep whose store did not answer at its end lists what it holds (its jobs' runs, its summary),
    # for the next run on that store to write (docs/scale.md). None: $XDG_STATE_HOME/tamrun/held, else
    # ~/.local/state/tamrun/held.
    held_dir: Optional[str] = None


@dataclass
class KalmanConfig:
    """State-space adaptation (``adaptive.method=kalman``, tamrun/adaptive/kalman.py, docs/adaptive.md).

    Per group, the static model's inputs psi (each effect's contribution scaled by its standard deviation
    over the training rows, or the design row) get weights theta that drift as a random walk,
    y = psi' theta + eps, theta_t = theta_{t-1} + eta_t, Var(eta) = q Var(eps) I, from theta_0 (the static
    model) with covariance p0 Var(eps) I. The filter runs through the training period (burn-in) and
    forecasts each day from the state after the day before. Every (q, p0) pair of the grid below is
    filtered at once; with more than one pair the pair with the lowest RMSE on the validation period
    (split.validation_start) is kept and the static model is refitted on training + validation.
    """

    # The weights adapted: effects (one per effect, and the intercept) | coefficients (every column of Phi).
    state: KalmanState = KalmanState.effects
    # Drift variance per day of each scaled weight, in units of the noise variance (a grid: >= 0).
    q: List[float] = field(default_factory=lambda: [1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4])
    # Initial covariance of the weights, in units of the noise variance (a grid: > 0); the forecasts hardly
    # depend on it after the burn-in years.
    p0: List[float] = field(default_factory=lambda: [1.0])
    # Rows where any of these columns is not 0 are forecast but not learnt from (e.g. [day_type_jf]:
    # public holidays, which the filter would otherwise read as a change of the weights).
    skip_updates: List[str] = field(default_factory=list)


@dataclass
class AdaptiveConfig:
    """Adaptation over the test period (``mode=adaptive``, docs/adaptive.md): ``method=sliding`` refits
    the coefficients on a sliding window (the fields below), ``method=kalman`` filters the effects'
    weights day by day (`KalmanConfig`, ``adaptive.kalman.*``).

    Refit k (k = 0, 1, ...) happens at t_k = split.test_start + k * step days, on the rows dated in
    [t_k - window days, t_k), and forecasts the days [t_k, t_k + horizon). The effects' state (feature
    ranges, levels, forest thresholds) stays the one fitted on the training split: a refit refits
    the coefficients only.
    """

    # Days of data each refit is fitted on (one year cannot tell the trend from the time of year).
    window: int = 730
    # Days between refits (1 = daily refits).
    step: int = 1
    # Days each refit forecasts from its date; None = step. Must be >= step, so every test day is
    # forecast by the latest refit before it.
    horizon: Optional[int] = None
    # Direct route: recompute a window's Gram from its rows every this many refits (refit k with
    # k % refresh == 0), up/down-dating it in between; 0 = only the first refit. Bounds the rounding
    # drift of the running sums.
    refresh: int = 64
    # At most this many windows per batch; None = as many as the window budget allows.
    max_batch_windows: Optional[int] = None
    # Keep every refit's coefficients (K, G, D) on the host (returned, last one logged).
    keep_coefficients: bool = True
    # sliding | kalman (the settings of adaptive.kalman).
    method: AdaptiveMethod = AdaptiveMethod.sliding
    kalman: KalmanConfig = field(default_factory=KalmanConfig)


@dataclass
class BacktestConfig:
    """Rolling-origin backtest (``mode=backtest``, docs/backtest.md): window k = 0 .. windows-1 has the
    cut-off c_k = split.test_start + k * step (a local midnight of data.timezone), is trained on the rows
    before c_k (``refit``) and scored on the days [c_k, c_k + horizon). Window k equals a plain run
    (mode=run) with split.train_end the day before c_k and split.test_start c_k."""

    # Number of windows (cut-offs).
    windows: int = 4
    # The days each window is scored on after its cut-off: a pandas offset of whole days (7D, 1W, 1MS).
    horizon: str = "7D"
    # Between consecutive cut-offs: a pandas offset of whole days.
    step: str = "7D"
    # expanding | sliding | once (`BacktestRefit`).
    refit: BacktestRefit = BacktestRefit.expanding
    # refit=sliding: the span of training rows before each cut-off, a pandas offset of whole days (365D).
    length: Optional[str] = None
    # Direct route: a window's Gram is recomputed from its rows every this many windows (and wherever its
    # design differs from the previous window's), up/down-dated in between; 0 = only where the design differs.
    refresh: int = 64
    # At most this many windows per batch; None = as many as the window budget allows.
    max_batch_windows: Optional[int] = None


@dataclass
class ExpertConfig:
    """One expert of ``mode=aggregate``: composed by Hydra as the command line
    ``model=<model> mode=<mode> <overrides...>`` would be (``+experiment=...`` included), then given the
    run's data, split, hw, memory, dtype, seed and progress. ``mode``: run (the static model) or adaptive
    with ``adaptive.method=kalman`` among the overrides (the filter; its q chosen on the validation period)."""

    model: str = MISSING
    mode: ModeName = ModeName.run
    overrides: List[str] = field(default_factory=list)


@dataclass
class AggregateConfig:
    """Online aggregation of experts (``mode=aggregate``, tamrun/aggregate/, docs/adaptive.md): every expert
    forecasts the validation period (its models fitted on the rows before it) and the test period (refitted
    on every row before it); a rule combines them day by day, each day's weights from the losses of the days
    before it. Every candidate of rules x eta (EWA's) x gradient x per_group runs over the validation period
    (split.validation_start, required); the one with the lowest validation RMSE then runs on through the
    test period. Losses are in units of s^2, s the target's standard deviation over the training rows."""

    # name -> ExpertConfig (typed when loaded, see `mapping_of`); at least two.
    experts: Dict[str, Any] = mapping_of(ExpertConfig, "an expert")
    # The rules tried: ewa | mlpoly.
    rules: List[AggregationRule] = field(default_factory=lambda: [AggregationRule.ewa, AggregationRule.mlpoly])
    # EWA's learning rates tried (units of 1 / s^2 per unit of loss; a grid, > 0).
    eta: List[float] = field(default_factory=lambda: [0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0])
    # Learn from the losses linearised at the aggregate (true: compete with the best convex combination of
    # the experts) or from the squared errors themselves (false: with the best expert); both are tried by default.
    gradient: List[bool] = field(default_factory=lambda: [True, False])
    # One weight vector per group (true) or one for every group (false); both are tried by default.
    per_group: List[bool] = field(default_factory=lambda: [True, False])
    # Choose the experts too, on the validation period: drop one at a time while that lowers the aggregate's
    # validation RMSE (backward elimination, tamrun/aggregate/pruning.py); false: aggregate every expert.
    select_experts: bool = False


class MachineKind(str, Enum):
    cpu = "cpu"
    gpu = "gpu"


@dataclass
class MachineClass:
    """A machine a run can be given (``tco.classes.<name>``): its kind, memory (GiB), effective memory
    bandwidth (GB/s, what the fit's memory-bound work runs at), cores (CPU) and price per hour (USD, set by
    the user: > 0). `tamrun.tco.plan` plans the run in its memory and prices its predicted time."""

    kind: MachineKind = MachineKind.cpu
    memory_gib: float = MISSING
    bandwidth_gbs: float = MISSING
    cores: Optional[int] = None
    price_per_hour: float = MISSING


@dataclass
class TcoConfig:
    """Right-sizing and cost (docs/memory.md, "What a run needs and what it costs"): the machine classes a
    run is planned on (conf/tco/default.yaml lists rentable ones, with illustrative dated prices)."""

    # name -> MachineClass (typed when loaded, see `mapping_of`); empty: no plan per class, no cost.
    classes: Dict[str, Any] = mapping_of(MachineClass, "a machine class")
    # The class the runs are measured on (their cost_usd is priced at it, and the other classes' times are
    # scaled from it); None: the CPU class whose cores are nearest the threads this run has (on a GPU: the
    # GPU class whose memory is nearest the device's).
    measured_on: Optional[str] = None
    # mode=plan fits nothing: the measured work its time predictions scale, the compute_seconds (features,
    # solve and predict phases) of a run of this config on the measured_on class; None: times not predicted.
    work_seconds: Optional[float] = None


@dataclass
class IntervalConfig:
    """Prediction intervals (tamrun/fit/intervals.py, docs/serving.md): for each level p, the forecast plus the
    (1 - p) / 2 and (1 + p) / 2 quantiles of residuals of rows before the period it covers (a run: its
    validation split, else its training rows; the day-ahead modes: the validation period's day-ahead
    forecasts, then each test day once its truth is known). In the predictions table (lower_80, upper_80),
    the plots, the served model's output and the metrics (coverage_80_test, width_80_test, pinball_test)."""

    # The levels, each in (0, 1); [] = no intervals.
    levels: List[float] = field(default_factory=lambda: [0.8, 0.95])
    method: IntervalMethod = IntervalMethod.auto
    # A group with fewer calibration rows than this takes the quantiles of every group's rows (method fixed).
    min_group_rows: int = 50
    # method online: the days of residuals each day's quantiles are taken from, and the step of the level's
    # adaptation (adaptive conformal inference: a larger step follows a drift faster, with noisier widths).
    window_days: int = 365
    gamma: float = 0.01


@dataclass
class EvaluateConfig:
    """The last check of a run's forecasts (tamrun/fit/unsupported.py, docs/reliability.md): a group whose
    validation or test forecast lies farther than SUPPORT_FACTOR spreads from the training target's median is
    withheld from the forecast and the metrics, named, and counted in the metric groups_unsupported."""

    # The largest share of a run's groups that may be withheld so; more fails the run (exit 2). 0.01: the
    # metrics still describe 99 groups in 100, and 1 group in 2,000 or 2 in 20,000 finish; beyond that, the
    # model (its penalties, its coefficients per training row) is what is wrong. 0: any such group fails the
    # run. Below 1: a run of one group (or whose every group is unsupported) always fails.
    max_unsupported_share: float = 0.01


@dataclass
class ShardConfig:
    """Where a run's groups are fitted (docs/scale.md, "Groups across a Ray cluster"): ``local``, in this
    process (in chunks of groups when the table does not fit: `tamrun.jobs.stream`); ``ray``, each chunk
    of groups a Ray task of the cluster at ``address``, reading its groups from data.path on its node,
    gathered into one MLflow run with the same results (`tamrun.jobs.shard`)."""

    over: ShardOver = ShardOver.local
    # The cluster: its head's <host>:<port>, "auto" or ray://<host>:10001; None: RAY_ADDRESS, else a Ray
    # instance of this process's own (its CPUs).
    address: Optional[str] = None
    # Groups per task; None: the groups spread over twice the cluster's CPUs (at most the chunk of a
    # streamed run when the table does not fit here).
    groups_per_task: Optional[int] = None
    # CPUs each task holds on its node (its torch threads).
    cpus_per_task: int = 1


@dataclass
class ModeConfig:
    """The job: ``run`` fits, evaluates and records; ``plan`` prints the memory oracle's plan only;
    ``adaptive`` refits on a sliding window over the test period (settings: `Config.adaptive`);
    ``aggregate`` combines experts online (settings: `Config.aggregate`); ``backtest`` scores rolling-origin
    windows (settings: `Config.backtest`)."""

    name: ModeName = ModeName.run


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hw: HardwareConfig = field(default_factory=HardwareConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    solver: SolverConfig = field(default_factory=SolverConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    mode: ModeConfig = field(default_factory=ModeConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    backtest: BacktestConfig = field(default_factory=BacktestConfig)
    aggregate: AggregateConfig = field(default_factory=AggregateConfig)
    intervals: IntervalConfig = field(default_factory=IntervalConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    tco: TcoConfig = field(default_factory=TcoConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)
    dtype: DType = DType.float64
    # Seeds torch and the forests' random trees (a forest effect's own `seed` wins).
    seed: int = 0
    # The metric `python -m tamrun` returns to Hydra's sweepers (optuna minimises it) and a sweep's
    # summary ranks by; None = rmse_backtest under mode=backtest, rmse_validation with a validation split,
    # else rmse_test.
    objective: Optional[str] = None
    # More metrics returned after `objective`, for a multi-objective sweeper (Optuna with
    # hydra.sweeper.direction=[minimize, minimize]): each job then returns [objective, *more_objectives],
    # e.g. more_objectives=[cost_usd] trades accuracy against cost (docs/sweeps.md). []: one objective.
    more_objectives: List[str] = field(default_factory=list)
    # Progress of group chunks and CG iterations: auto (a bar on a terminal, log lines otherwise), bar, log, off.
    progress: ProgressMode = ProgressMode.auto


def schema_default(path: str) -> Any:
    """The schema's default of the field at a dotted ``path`` of `Config`, e.g.
    ``schema_default("memory.overhead_factor") == 1.1``: messages that suggest a default read it here,
    so that every default is written once, in the dataclasses above.

    Raises:
        KeyError: ``path`` names no field (or goes through a field that is not a dataclass).
    """
    node: Any = Config
    value: Any = None
    for name in path.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if name not in fields:
            raise KeyError(f"{path}: no field {name!r} in the schema")
        spec = fields[name]
        value = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default
        node = value
    return value
