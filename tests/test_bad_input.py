"""Every bad input of docs/reliability.md: one readable message naming the field (or column), the
value and the fix; exit code 2; no traceback; the MLflow run (if it had started) FAILED with the error
as a tag and the log as an artifact; the store still readable.

The table runs in-process through the command line's own entry (`tamrun.__main__.main`, real Hydra);
`test_bad_input_through_a_real_subprocess` runs some rows as ``python -m tamrun`` to prove the exit
code and the absence of a traceback as a user sees them.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import csv_overrides, synthetic_frame
from tamrun.__main__ import main
from tamrun.config.effects import EFFECT_SPECS
from tamrun.config.ranges import EFFECTS, SETTINGS, numeric_fields
from tamrun.config.schema import Config
from tamrun.device.manager import require_dtype
from tamrun.errors import DeviceError


def _nan_target(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[[10, 20, 30], "y"] = np.nan
    return f


def _inf_feature(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[[5, 6], "x"] = np.inf
    return f


def _duplicated_dates(f: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([f, f.iloc[100:104]], ignore_index=True)


def _missing_group(f: pd.DataFrame) -> pd.DataFrame:
    f["g"] = f["g"].astype(float)
    f.loc[[7, 8], "g"] = np.nan
    return f


def _no_group(f: pd.DataFrame) -> pd.DataFrame:
    f["g"] = np.nan
    return f


def _small_group(f: pd.DataFrame) -> pd.DataFrame:
    """Group 2 keeps only 5 rows in training (2020) and all its rows in the test year."""
    train2 = f.index[(f["g"] == 2) & (f["date"] < "2021-01-01")]
    return f.drop(train2[5:])


def _test_only_group(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[f["date"] >= "2021-01-01", "g"] = f.loc[f["date"] >= "2021-01-01", "g"].replace(2, 3)
    return f


def _test_only_level(f: pd.DataFrame) -> pd.DataFrame:
    return f[~((f["dow"] == 6) & (f["date"] < "2021-01-01"))]


def _text_column(f: pd.DataFrame) -> pd.DataFrame:
    f["label"] = "a"
    return f


def _constant_column(f: pd.DataFrame) -> pd.DataFrame:
    f["c"] = 1.0
    return f


def _text_target(f: pd.DataFrame) -> pd.DataFrame:
    f["y"] = "a"
    return f


def _undated(f: pd.DataFrame) -> pd.DataFrame:
    f["date"] = "someday"
    return f


def _absurd_target(f: pd.DataFrame) -> pd.DataFrame:
    f.loc[100, "y"] = 1e308
    return f


def _day_first(f: pd.DataFrame) -> pd.DataFrame:
    f["date"] = f["date"].dt.strftime("%d/%m/%Y %H:%M")
    return f


def _empty_feature(f: pd.DataFrame) -> pd.DataFrame:
    f["x"] = np.nan
    return f


def _header_twice(f: pd.DataFrame) -> pd.DataFrame:
    f["x2"] = f["x"]
    f.columns = ["date", "x", "dow", "g", "y", "x"]
    return f


@dataclass
class Case:
    """One bad input: ``argv`` ({csv} = the case's CSV file, {tmp} = its folder), the CSV's edit
    (``frame``) or raw bytes (``raw``), the texts the message must hold, and whether the MLflow run
    had started (then it must be FAILED)."""

    id: str
    argv: List[str]
    expected: List[str]
    started: bool
    frame: Optional[Callable[[pd.DataFrame], pd.DataFrame]] = None
    raw: Optional[bytes] = None
    csv: bool = False  # fit the synthetic CSV model (csv_overrides) rather than the national preset
    needs: Optional[str] = None  # a device kind that must be absent
    subprocess: bool = False
    setup: Optional[Callable[[Path], None]] = field(default=None, repr=False)
    # Modules made unimportable for the case (a driver the team extra may have installed): None in
    # sys.modules in-process, a package raising ModuleNotFoundError ahead on PYTHONPATH in a subprocess.
    hide: List[str] = field(default_factory=list)


def _file_named(name: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_text("not a folder\n")


def _folder_named(name: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).mkdir()


def _gzipped(keep: float = 1.0, junk: bool = False) -> Callable[[Path], None]:
    """Write data.csv.gz: the case's CSV gzipped, cut to its first ``keep`` part, or a gzip header
    followed by bytes that are not deflate data (``junk``)."""
    def write(tmp: Path) -> None:
        packed = b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4 if junk else gzip.compress((tmp / "data.csv").read_bytes())
        (tmp / "data.csv.gz").write_bytes(packed[:int(len(packed) * keep)])
    return write


LONG = "a" * 5000  # one path component longer than any file system allows (255 bytes on Linux)

CASES = [
    # --- config: refused before any run starts
    Case("a data path without data=csv", ["data.path={tmp}/my.csv"],
         ["data.path='", "my.csv'", "the embedded table (data=national) reads no file, so this path would be ignored",
          "Fix: add data=csv to read it"], False, subprocess=True),
    Case("unknown group option", ["model=nope"], ["Could not find 'model/nope'", "fourier", "Fix:"], False,
         subprocess=True),
    Case("unknown field", ["solver.tl=1e-6"], ["solver.tl", "Key 'tl' not in 'SolverConfig'", "Fix:"], False),
    Case("misspelled effect field", ["+model.effects.temp.mm=3"],
         ["model.effects.temp.mm=3", "a fourier effect takes: column, m, s, cyclic, period, ap"], False),
    Case("wrong type", ["solver.max_iter=abc"], ["solver.max_iter", "'abc'", "could not be converted to Integer",
                                                 "Fix:"], False, subprocess=True),
    Case("wrong type in an effect", ["model.effects.temp.m=abc"],
         ["model.effects.temp.m='abc'", "a fourier effect takes"], False),
    Case("negative m", ["model.effects.temp.m=-2"], ["model.effects.temp.m=-2", "in [1, 1000]", "Fix:"], False),
    Case("forest depth 0", ["model=forest", "model.effects.forest.max_depth=0"],
         ["model.effects.forest.max_depth=0", "in [1, 20]", "Fix: set model.effects.forest.max_depth=6"], False),
    Case("forest depth 21", ["model=forest", "model.effects.forest.max_depth=21"],
         ["model.effects.forest.max_depth=21", "in [1, 20]"], False),
    Case("forest n_trees 0", ["model=forest", "model.effects.forest.n_trees=0"],
         ["model.effects.forest.n_trees=0", "Fix: set model.effects.forest.n_trees=50"], False),
    Case("tolerance 0", ["solver.tol=0"], ["solver.tol=0.0", "in (0, 1)", "Fix: set solver.tol=1e-6"], False),
    Case("tolerance negative", ["solver.tol=-1e-6"], ["solver.tol=-1e-06", "in (0, 1)"], False),
    Case("fraction above 1", ["memory.dense_fraction=1.5"], ["memory.dense_fraction=1.5", "(0, 1]", "Fix:"], False),
    Case("fraction 0", ["memory.chunk_fraction_cpu=0"], ["memory.chunk_fraction_cpu=0.0", "(0, 1]"], False),
    Case("size factor 1", ["memory.oom.size_factor=1.0"], ["memory.oom.size_factor=1.0", "(0, 1)",
                                                          "Fix: set memory.oom.size_factor=0.7"], False),
    Case("unknown effect kind", ["model.effects.temp.kind=wavelet"],
         ["model.effects.temp.kind='wavelet'", "unknown effect kind", "use one of linear, fourier"], False),
    Case("crossing of an unknown kind",
         ["+model.effects.cross={kind: crossing, left: {kind: wavelet, column: toy}, right: {kind: fourier, column: toy}}"],
         ["model.effects.cross.left.kind='wavelet'", "unknown effect kind"], False),
    Case("crossing of effect names", ["+model.effects.cross={kind: crossing, left: temp, right: toy}"],
         ["model.effects.cross.left='temp'", "must be a mapping", "Fix: write it as"], False),
    Case("unknown derived-column kind", ['+data.derived.tempc={kind: kelvin, expr: "temperature - 273.15"}'],
         ["data.derived.tempc.kind='kelvin'", "unknown derived-column kind", "use one of time_index, isin, expr"],
         False, subprocess=True),
    Case("misspelled derived-column field", ['+data.derived.tempc={kind: expr, exp: "temperature - 273.15"}'],
         ["data.derived.tempc.exp='temperature - 273.15'", "not a valid field of a derived column",
          "a derived column takes: kind, column, values, unit, expr"], False),
    Case("derived column not a mapping", ["+data.derived.tempc=5"],
         ["data.derived.tempc=5", "a derived column must be a mapping", "Fix: write it as"], False),
    Case("unknown dtype", ["dtype=float16"], ["dtype", "float16", "float64", "Fix:"], False),
    Case("malformed limit", ["memory.limit=lots"], ["memory.limit='lots'", "not a size", "2GiB"], False,
         subprocess=True),
    Case("zero limit", ["memory.limit=0"], ["memory.limit='0'", "in [1, 2^63-1]", "memory.limit=null"], False),
    Case("busy timeout 0", ["tracking.busy_timeout_s=0"], ["tracking.busy_timeout_s=0.0", "in (0, 604800]"], False),
    Case("csv without a path", ["data=csv"], ["data.path=None", "needs the path", "Fix:"], False),
    Case("unreachable tracking server", ["tracking.uri=http://127.0.0.1:9"],
         ["tracking.uri='http://127.0.0.1:9'", "does not answer", "tracking.enabled=false"], False, subprocess=True),
    Case("store folder not creatable", ["tracking.uri=sqlite:///{tmp}/afile/mlflow.db"],
         ["tamrun: filesystem error: {tmp}/afile: cannot be created ([Errno 17] File exists; the MLflow store, "
          "tracking.uri). Fix: point tracking.uri at a store in a writable folder"], False, setup=_file_named("afile")),
    Case("store is a folder", ["tracking.uri=sqlite:///{tmp}/store.db"],
         ["tamrun: filesystem error: {tmp}/store.db: cannot be created ([Errno 21] Is a directory; the MLflow store, "
          "tracking.uri). Fix: point tracking.uri at a store in a writable folder"], False,
         setup=_folder_named("store.db")),
    # --- numbers out of range (tamrun/config/ranges.py), before any run
    Case("seed beyond 64 bits", ["seed=99999999999999999999999"],
         ["seed=99999999999999999999999", "a seed must be an integer in [0, 2^63-1]", "Fix: set seed=0"], False,
         subprocess=True),
    Case("negative seed", ["seed=-1"], ["seed=-1", "in [0, 2^63-1]"], False),
    Case("negative forest seed", ["model=forest", "+model.effects.forest.seed=-5"],
         ["model.effects.forest.seed=-5", "in [0, 2^63-1]", "Fix: set model.effects.forest.seed=null"], False),
    Case("limit beyond float", ["memory.limit=1e400"], ["memory.limit='inf'", "not a size"], False),
    Case("negative limit", ["memory.limit=-5MiB"], ["memory.limit='-5MiB'", "in [1, 2^63-1]"], False),
    Case("limit beyond 64 bits", ["memory.limit=1e30TiB"], ["memory.limit='1e30TiB'", "in [1, 2^63-1]",
                                                            "memory.limit=null"], False),
    Case("negative safety margin", ["memory.safety_margin=-1MiB"],
         ["memory.safety_margin='-1MiB'", "in [0, 2^63-1]", "Fix: set memory.safety_margin=16MiB"], False),
    Case("overhead factor below 1", ["memory.overhead_factor=0.5"],
         ["memory.overhead_factor=0.5", "in [1, 1000]", "Fix: set memory.overhead_factor=1.1"], False),
    Case("max_iter 0", ["solver.max_iter=0"], ["solver.max_iter=0", "in [1, 1000000000]",
                                               "Fix: set solver.max_iter=2000"], False),
    Case("infinite jitter", ["solver.jitter=inf"], ["solver.jitter=inf", "a finite number in [0, 1000000]"], False),
    Case("jitter growth 1", ["solver.jitter_growth=1"], ["solver.jitter_growth=1.0", "in (1, 1000000]", "Fix: set "
                                                         "solver.jitter_growth=10"], False),
    Case("negative retries", ["memory.oom.max_retries=-1"], ["memory.oom.max_retries=-1", "in [0, 50]"], False),
    Case("absurd retries", ["memory.oom.max_retries=1000"], ["memory.oom.max_retries=1000", "in [0, 50]",
                                                             "Fix: set memory.oom.max_retries=3"], False),
    Case("negative backoff", ["memory.oom.delay_ms=-1"], ["memory.oom.delay_ms=-1.0", "in [0, 3600000]",
                                                          "Fix: set memory.oom.delay_ms=200"], False),
    Case("threads 0", ["hw.threads=0"], ["hw.threads=0", "in [1, 65536]", "Fix: set hw.threads=null"], False),
    Case("window 0", ["mode=adaptive", "adaptive.window=0"], ["adaptive.window=0", "in [1, 100000]"], False),
    Case("busy timeout NaN", ["tracking.busy_timeout_s=nan"], ["tracking.busy_timeout_s=nan", "a finite number"],
         False),
    Case("lock timeout beyond a week", ["tracking.lock_timeout_s=1e9"],
         ["tracking.lock_timeout_s=1000000000.0", "in (0, 604800]"], False),
    Case("too many frequencies", ["model.effects.temp.m=1001"], ["model.effects.temp.m=1001", "in [1, 1000]",
                                                                  "Fix: set model.effects.temp.m=6"], False),
    Case("infinite Sobolev order", ["model.effects.temp.s=inf"], ["model.effects.temp.s=inf", "in [0, 10]"],
         False),
    Case("spline degree 0", ["+model.effects.sx.deg=0"], ["model.effects.sx.deg=0", "in [1, 5]"], False,
         csv=True),
    Case("spline difference order too high", ["model.effects.sx.k=5", "+model.effects.sx.p=9"],
         ["model.effects.sx.p=9", "in [0, 7] (basis width k+deg)", "use p=2"], False, csv=True),
    Case("linear scale 0", ["+model.effects.lin={kind: linear, column: x, scale: 0}"],
         ["model.effects.lin.scale=0.0", "non-zero"], False, csv=True),
    Case("unknown categorical topology", ["model.effects.dow.topo=ring"],
         ["model.effects.dow.topo='ring'", "unknown topology", "nominal, fourier, cyclic, difference"], False,
         csv=True),
    Case("unknown forest split", ["model=forest", "+model.effects.forest.split=median"],
         ["model.effects.forest.split='median'", "use split=uniform or split=quantile"], False),
    Case("model without effects", ["model=custom"], ["model.effects={}", "the model has no effects"], False),
    Case("empty experiment name", ["tracking.experiment="], ["tracking.experiment=''", "empty",
                                                             "Fix: set tracking.experiment=tamrun"], False),
    # --- stores, paths and drivers, before any run
    Case("store path too long", [f"tracking.uri=sqlite:///{{tmp}}/{LONG}/mlflow.db"],
         ["tamrun: filesystem error: {tmp}/aaa", " characters): cannot be created ([Errno 36] File name too long; the "
          "MLflow store, tracking.uri)"], False),
    Case("artifact root under a file", ["tracking.artifact_root={tmp}/afile/artifacts"],
         ["tamrun: filesystem error: {tmp}/afile/artifacts: cannot be created ([Errno 20] Not a directory; the runs' "
          "artifacts, tracking.artifact_root). Fix: point tracking.artifact_root at a writable folder"], False,
         setup=_file_named("afile")),
    Case("artifact root too long", [f"tracking.artifact_root={{tmp}}/{LONG}"],
         ["tamrun: filesystem error: {tmp}/aaa", "File name too long; the runs' artifacts, tracking.artifact_root"],
         False),
    Case("postgresql driver missing", ["tracking.uri=postgresql://user:hunter2@127.0.0.1/db"],
         ["tracking.uri='postgresql://user:***@127.0.0.1/db'", "the database driver 'psycopg' is not installed",
          "pip install 'tamrun[team]' (psycopg 3; or psycopg2-binary", "tracking.uri=sqlite:///"], False,
         subprocess=True, hide=["psycopg"]),
    Case("mysql driver missing", ["tracking.uri=mysql://user@127.0.0.1/db"],
         ["the database driver 'MySQLdb' is not installed", "pip install mysqlclient"], False),
    # --- data and split: the run has started and must end FAILED
    Case("missing data file", ["data=csv", "data.path={tmp}/nope.csv", "model=spline"],
         ["data.path=", "nope.csv", "no such file", "Fix:"], True),
    Case("data path is a folder", ["data=csv", "data.path={tmp}", "model=spline"],
         ["data.path=", "a folder, not a file"], True),
    Case("unreadable file", [], ["data.encoding='utf-8'", "is not utf-8 text", "set data.encoding"], True, csv=True,
         raw=b"\xff\xfe\x00\x81garbage\x00\xc3\x28\n\x9f\x92\x96\n"),
    Case("empty file", [], ["data.path=", "the file is empty"], True, csv=True, raw=b""),
    Case("header only", [], ["data.path=", "no rows"], True, csv=True, raw=b"date,x,dow,g,y\n"),
    Case("missing column", ["model.effects.sx.column=nope"], ["model.effects.sx.column='nope'", "no such column",
                                                              "use one of: date, x"], True, csv=True,
         subprocess=True),
    Case("non-numeric column", ["model.effects.sx.column=label"],
         ["model.effects.sx.column='label'", "not numeric", "Fix:"], True, csv=True, frame=_text_column),
    Case("NaN in the target", [], ["data.target='y'", "3 row(s) hold NaN or inf", "data.nan_policy=drop"], True,
         csv=True, frame=_nan_target, subprocess=True),
    Case("inf in a feature", [], ["model.effects.sx.column='x'", "2 row(s) hold NaN or inf"], True, csv=True,
         frame=_inf_feature),
    Case("duplicated timestamps", [], ["data.date_column='date'", "4 row(s) repeat a date (first: 2020-01-05 04:00:00 in group 1 of column 'g')",
                                       "data.duplicate_dates=warn"], True, csv=True, frame=_duplicated_dates),
    Case("rows without a group", [], ["data.group='g'", "2 row(s) have no group value"], True, csv=True,
         frame=_missing_group),
    Case("no row has a group, rows dropped", ["data.nan_policy=drop"],
         ["data.nan_policy='drop'", "has a value in the group column 'g'", "leaves no data", "data.group=null"], True,
         csv=True, frame=_no_group),
    Case("group with fewer rows than coefficients", ["data.small_groups=error"],
         ["data.group='g'", "group g=2 has 5 training row(s) for", "data.small_groups=warn"], True, csv=True,
         frame=_small_group),
    Case("group empty in training", [], ["data.group='g'", "group 3 appears in the test split but not in training"],
         True, csv=True, frame=_test_only_group),
    Case("data path too long", ["data=csv", f"data.path={{tmp}}/{LONG}.csv", "model=spline"],
         ["data.path=", "the path cannot be used ([Errno 36] File name too long)"], True),
    Case("truncated gz", ["data.path={tmp}/data.csv.gz"],
         ["data.path=", "cannot be read as CSV (Compressed file ended before the end-of-stream marker"], True,
         csv=True, setup=_gzipped(keep=0.5)),
    Case("corrupt gz", ["data.path={tmp}/data.csv.gz"], ["data.path=", "cannot be read as CSV (Error -3 while "
                                                           "decompressing data"], True, csv=True,
         setup=_gzipped(junk=True)),
    Case("column named twice", [], ["data.path=", "the header names column(s) ['x'] more than once",
                                    "distinct name"], True, csv=True, frame=_header_twice),
    Case("date column missing", ["data.date_column=when"], ["data.date_column='when'", "no such column"], True,
         csv=True),
    Case("target column missing", ["data.target=load"], ["data.target='load'", "no such column"], True, csv=True),
    Case("group column missing", ["data.group=grp"], ["data.group='grp'", "no such column"], True, csv=True),
    Case("non-numeric target", [], ["data.target='y'", "the column is not numeric: 9600 value(s) are not numbers "
                                    "(first: 'a' at the row of 2020-01-01 00:00:00 in group 0)"], True, csv=True,
         frame=_text_target),
    Case("dates unparseable", [], ["data.date_column='date': the value 'someday' at line 2 of the file is not a "
                                   "date in the format tried (none recognised, read from the first date 'someday' "
                                   "with data.dayfirst=false). Fix: set data.date_format"], True, csv=True,
         frame=_undated),
    Case("target far outside the rest", [], ["tamrun: data error: data.target='y': 1 row(s) lie far outside the "
                                             "rest (farther from the median 6.97036 than 10000 robust spreads of "
                                             "1.71): 2020-01-05 04:00:00 in group 1 (1e+308). Fix: correct or remove "
                                             "those values"], True, csv=True, frame=_absurd_target, subprocess=True),
    Case("absurd predictions", ["data.target_outliers=warn"],
         ["tamrun: numerical error: predictions=6.2", "the largest train prediction is more than 1e+06 times the "
          "training target's scale (9.56633, the larger of its 1st and 99th percentiles): not a forecast. Fix: look "
          "for absurd target values"], True, csv=True, frame=_absurd_target),
    Case("dates day first", [], ["data.date_column='date': the value '13/01/2020 00:00' at line 290 of the file is "
                                 "not a date in the format tried ('%m/%d/%Y %H:%M', read from the first date "
                                 "'01/01/2020 00:00' with data.dayfirst=false). Fix: set "
                                 "data.date_format='%d/%m/%Y %H:%M' (the format of '13/01/2020 00:00'), or "
                                 "data.dayfirst=true"], True, csv=True, frame=_day_first, subprocess=True),
    Case("date format that does not fit", ["data.date_format='%d.%m.%Y'"],
         ["data.date_column='date': the value '2020-01-01 00:00:00' at line 2 of the file is not a date in the "
          "format tried ('%d.%m.%Y', data.date_format). Fix: set data.date_format='%Y-%m-%d %H:%M:%S' (the format "
          "of '2020-01-01 00:00:00')"], True, csv=True),
    Case("feature all NaN", [], ["model.effects.sx.column='x'", "9600 row(s) hold NaN or inf"], True, csv=True,
         frame=_empty_feature),
    Case("feature all NaN, rows dropped", ["data.nan_policy=drop"],
         ["data.nan_policy='drop'", "no finite value at all in ['x']", "leaves no data"], True, csv=True,
         frame=_empty_feature),
    Case("train_end before train_start", ["split.train_start=2020-06-01", "split.train_end=2020-03-01"],
         ["split.train_end='2020-03-01'", "the train period ends before it starts (train_start=2020-06-01)"], True,
         csv=True),
    Case("test_end before test_start", ["split.test_end=2020-12-01"],
         ["split.test_end='2020-12-01'", "the test period ends before it starts"], True, csv=True),
    Case("validation overlapping test", ["split.validation_start=2020-11-01", "split.validation_end=2021-01-15"],
         ["split.validation_end='2021-01-15'", "must lie inside training (train_end=2020-12-31)"], True, csv=True),
    Case("validation after training", ["split.validation_start=2021-03-01"],
         ["split.validation_end=None", "must lie inside training"], True, csv=True),
    Case("split with no rows", ["split.test_start=2030-01-01", "split.test_end=2030-12-31"],
         ["split.test_start='2030-01-01'", "no rows", "the data covers"], True, csv=True),
    Case("split bound not a date", ["split.train_end=soon"], ["split.train_end='soon'", "not a date",
                                                             "YYYY-MM-DD"], True, csv=True),
    Case("train/test overlap", ["split.test_start=2020-06-01"],
         ["split.test_start='2020-06-01'", "overlaps training", "Fix:"], True, csv=True),
    Case("level seen only in the test set", [], ["model.effects.dow.column='dow'", "level(s) [6]",
                                                 "never in training"], True, csv=True, frame=_test_only_level),
    Case("constant feature", ["+model.effects.c={kind: linear, column: c}"],
         ["model.effects.c.column='c'", "constant over the training split (value 1.0 in all 8784 rows)", "data.constant_features=warn"], True,
         csv=True, frame=_constant_column),
    Case("impossible memory limit", ["memory.limit=1KiB"], ["memory.limit='1.00 KiB'", "raise memory.limit"], True,
         csv=True),
    # --- hardware: the device is chosen once the run has started
    Case("hw=cuda absent", ["hw=cuda"], ["hw='cuda'", "no cuda device", "hw=cpu"], True, csv=True, needs="cuda"),
    Case("hw=mps absent", ["hw=mps"], ["hw='mps'", "no mps device"], True, csv=True, needs="mps"),
    Case("hw=xpu absent", ["hw=xpu"], ["hw='xpu'", "no xpu device"], True, csv=True, needs="xpu"),
]


def _device_present(kind: Optional[str]) -> bool:
    from tamrun.device.manager import device_available

    return kind is not None and device_available(kind)


def _prepare(case: Case, tmp_path: Path, store_template: Optional[Path] = None) -> List[str]:
    """Write the case's CSV (or other files) and return its full argv; the store is a copy of
    ``store_template`` when given, else created by the run."""
    path = tmp_path / "data.csv"
    if case.raw is not None:
        path.write_bytes(case.raw)
    else:
        frame = synthetic_frame(days=400, groups=3)
        (case.frame(frame) if case.frame else frame).to_csv(path, index=False)
    if case.setup:
        case.setup(tmp_path)
    argv = [a.replace("{csv}", str(path)).replace("{tmp}", str(tmp_path)) for a in case.argv]
    if case.csv:
        argv = csv_overrides(path) + argv
    if not any(a.startswith("tracking.uri=") for a in argv):
        if store_template is not None:
            shutil.copyfile(store_template, tmp_path / "mlflow.db")
        argv.append(f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}")
    return argv


def _check_store(case: Case, tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    if not case.started:
        assert not db.exists() or not MlflowClient(tracking_uri=f"sqlite:///{db}").search_runs(["0", "1"])
        return
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (logged,) = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])
    assert logged.info.status == "FAILED"
    assert logged.data.tags["error_type"].endswith("Error") and logged.data.tags["error"]
    log_text = Path(client.download_artifacts(logged.info.run_id, "logs/run.log", str(tmp_path))).read_text()
    assert logged.data.tags["error"][:60] in log_text and "Traceback" in log_text  # the traceback goes to the log
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_in_process(case, tmp_path, monkeypatch, capsys, migrated_store):
    if _device_present(case.needs):
        pytest.skip(f"this machine has {case.needs}: hw={case.needs} is valid here")
    argv = _prepare(case, tmp_path, migrated_store)
    monkeypatch.chdir(tmp_path)
    for module in case.hide:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(SystemExit) as ended:
        main(argv)
    out = capsys.readouterr()
    output = out.out + out.err
    assert ended.value.code == 2, output
    for text in case.expected:
        assert text.replace("{tmp}", str(tmp_path)) in output, output
    assert "Traceback" not in output
    _check_store(case, tmp_path)


def test_the_table_has_at_least_thirty_distinct_cases():
    assert len({c.id for c in CASES}) == len(CASES) >= 30


SUBPROCESS_CASES = [c for c in CASES if c.subprocess]


def _hidden_modules(modules: List[str], folder: Path) -> str:
    """A folder of packages that raise ModuleNotFoundError as an absent module does (for PYTHONPATH)."""
    for module in modules:
        (folder / module).mkdir(parents=True)
        (folder / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n")
    return str(folder)


@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=[c.id for c in SUBPROCESS_CASES])
def test_bad_input_through_a_real_subprocess(case, tmp_path, migrated_store):
    argv = _prepare(case, tmp_path, migrated_store)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "TAMRUN_"))}
    if case.hide:
        env["PYTHONPATH"] = os.pathsep.join([_hidden_modules(case.hide, tmp_path / "hidden"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "tamrun", *argv], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    for text in case.expected:
        assert text.replace("{tmp}", str(tmp_path)) in output, output
    assert "Traceback" not in output
    _check_store(case, tmp_path)


def test_a_store_locked_past_the_busy_timeout_is_refused(tmp_path, monkeypatch, capsys, migrated_store):
    """Another connection holds the store with BEGIN EXCLUSIVE for the whole run: after
    tracking.busy_timeout_s the run stops with a message naming that field, no run is left in the
    store and the store is intact."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(migrated_store, db)
    monkeypatch.chdir(tmp_path)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SystemExit) as ended:
            main(["tracking.busy_timeout_s=1", f"tracking.uri=sqlite:///{db}"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    out = capsys.readouterr()
    output = out.out + out.err
    assert ended.value.code == 2, output
    assert (f"tamrun: config error: tracking.busy_timeout_s=1.0: another process held the store sqlite:///{db} "
            "locked for longer") in output and "Fix: raise tracking.busy_timeout_s" in output, output
    assert "Traceback" not in output
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_hydra_verbose_shows_the_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    level = logging.getLogger().level
    try:
        with pytest.raises(SystemExit) as ended:
            main(["hydra.verbose=true", "memory.limit=lots", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"])
    finally:  # Hydra leaves the root logger at DEBUG: later runs would log to this test's closed stream
        logging.getLogger().setLevel(level)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "Traceback" in err and "memory.limit='lots'" in err


# --- every numeric setting, found by introspection of the schema: a new field cannot escape

# The sides of a crossing whose own fields are probed.
CROSSING_SIDES = "left: {kind: fourier, column: x}, right: {kind: linear, column: dow}, "
def numeric_settings() -> List[tuple]:
    """(test id, dotted field, the override that sets it to <v>, int or float) for every numeric field
    of `Config` and of every effect spec (as an effect ``probe`` added to the default model)."""
    found = [(name, name, f"{name}=<v>", kind) for name, kind in numeric_fields(Config)]
    for kind_name, cls in EFFECT_SPECS.items():
        body = CROSSING_SIDES if kind_name == "crossing" else "column: x, "
        for name, kind in numeric_fields(cls):
            override = f"+model.effects.probe={{kind: {kind_name}, {body}{name}: <v>}}"
            found.append((f"{kind_name}.{name}", f"model.effects.probe.{name}", override, kind))
    return found


NUMERIC_SETTINGS = numeric_settings()
ABSURD = {float: ["nan", "inf"], int: ["-1", str(2**64)]}


def test_every_numeric_setting_has_a_declared_range():
    declared = set(SETTINGS) | {f"{kind}.{name}" for kind, fields in EFFECTS.items() for name in fields}
    fields = {name for name, _ in numeric_fields(Config)}
    fields |= {f"{kind}.{name}" for kind, cls in EFFECT_SPECS.items() for name, _ in numeric_fields(cls)}
    assert {"seed", "memory.oom.max_retries", "solver.tol", "fourier.m", "forest.seed"} <= fields
    assert fields == declared, f"without a range: {sorted(fields - declared)}; stale: {sorted(declared - fields)}"


@pytest.mark.parametrize("field, override, kind", [s[1:] for s in NUMERIC_SETTINGS],
                         ids=[s[0] for s in NUMERIC_SETTINGS])
def test_every_numeric_setting_is_range_checked(field, override, kind, tmp_path, monkeypatch, capsys):
    """NaN and inf (floats), -1 and 2^64 (ints) are refused, naming the field, before any run."""
    monkeypatch.chdir(tmp_path)
    for value in ABSURD[kind]:
        with pytest.raises(SystemExit) as ended:
            main([override.replace("<v>", value), f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
        out = capsys.readouterr()
        output = out.out + out.err
        assert ended.value.code == 2, output
        assert f"tamrun: config error: {field}=" in output and "must be" in output and "Fix: " in output, output
        assert "Traceback" not in output
        assert not (tmp_path / "mlflow.db").exists()  # refused before the MLflow run


def test_float64_on_a_device_without_it_is_refused():
    """No MPS here: the capability check itself is called with the kind that lacks float64."""
    with pytest.raises(DeviceError, match=r"dtype='float64': the MPS backend has no float64 support. "
                                          r"Fix: use dtype=float32 with hw=mps"):
        require_dtype("mps", torch.float64)
    require_dtype("mps", torch.float32)
    require_dtype("cpu", torch.float64)


# --- inputs that are handled rather than refused (docs/reliability.md says what happens to each)

def _shuffled(f: pd.DataFrame) -> pd.DataFrame:
    return f.sample(frac=1.0, random_state=0)


def _run_csv(tmp_path: Path, monkeypatch, edit, *argv: str, store: Optional[Path] = None):
    """The CLI on the synthetic CSV edited by ``edit``: (the run, its logs/run.log, its coefficients)."""
    case = Case("handled", list(argv), [], True, frame=edit, csv=True)
    args = _prepare(case, tmp_path, store)
    monkeypatch.chdir(tmp_path)
    main(args)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (logged,) = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])
    text = Path(client.download_artifacts(logged.info.run_id, "logs/run.log", str(tmp_path))).read_text()
    coef = pd.read_csv(client.download_artifacts(logged.info.run_id, "fit/coefficients.csv", str(tmp_path)))
    return logged, text, coef


def test_unsorted_timestamps_are_sorted_and_fit_as_sorted(tmp_path, monkeypatch, migrated_store):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, _, shuffled = _run_csv(tmp_path / "a", monkeypatch, _shuffled, "tracking.log_plots=false", store=migrated_store)
    logged, _, ordered = _run_csv(tmp_path / "b", monkeypatch, None, "tracking.log_plots=false", store=migrated_store)
    assert logged.info.status == "FINISHED"
    pd.testing.assert_frame_equal(shuffled, ordered, check_exact=False, rtol=1e-9)


def test_nan_policy_drop_drops_and_says_how_many(tmp_path, monkeypatch, migrated_store):
    logged, text, _ = _run_csv(tmp_path, monkeypatch, _nan_target, "data.nan_policy=drop", "tracking.log_plots=false",
                               store=migrated_store)
    assert logged.info.status == "FINISHED"
    assert "dropping 3 row(s) with NaN/inf in ['y'" in text
    assert logged.data.metrics["system/data/n_train_rows"] == 366 * 24 - 3  # 2020 is a leap year; rows 10, 20, 30 dropped


def test_nan_policy_drop_drops_the_rows_without_a_group(tmp_path, monkeypatch, migrated_store):
    logged, text, _ = _run_csv(tmp_path, monkeypatch, _missing_group, "data.nan_policy=drop",
                               "tracking.log_plots=false", store=migrated_store)
    assert logged.info.status == "FINISHED"
    assert "dropping 2 row(s) without a group in column 'g'" in text
    assert logged.data.metrics["system/data/n_train_rows"] == 366 * 24 - 2  # rows 7 and 8 (in 2020) dropped


def test_a_group_smaller_than_the_model_is_a_warning_by_default(tmp_path, monkeypatch, migrated_store):
    logged, text, _ = _run_csv(tmp_path, monkeypatch, _small_group, "tracking.log_plots=false", store=migrated_store)
    assert logged.info.status == "FINISHED"
    assert "group g=2 has 5 training row(s) for" in text
    # the warning offers the value the config does not hold (error), never the one it holds (warn)
    assert "Fix: train on more rows, group more coarsely, use a smaller model (data.small_groups=warn; " \
           "data.small_groups=error refuses such data)" in text and "set data.small_groups=warn" not in text


def test_tracking_server_without_its_environment_variable_is_refused(tmp_path, monkeypatch, capsys):
    """tracking=server reads the URI from MLFLOW_TRACKING_URI: unset, the run stops before any store
    is opened, with exit 2 and a message naming tracking.uri_env and the export to do."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(SystemExit) as ended:
        main(["tracking=server"])
    output = "".join(capsys.readouterr())
    assert ended.value.code == 2, output
    assert ("tamrun: config error: tracking.uri_env='MLFLOW_TRACKING_URI': the environment variable "
            "MLFLOW_TRACKING_URI is unset or empty. Fix: export MLFLOW_TRACKING_URI=") in output, output
    assert "Traceback" not in output and not (tmp_path / "outputs" / "mlflow.db").exists()


FOREST_CROSSING = ("+model.effects.cr={kind: crossing, left: {kind: forest, column: x, n_trees: 2, max_depth: 2, "
                   "ap: -3}, right: {kind: fourier, column: x, m: 2, ap: -3}, ap: -3}")


def test_a_forest_crossing_with_more_coefficients_than_rows_says_so_without_a_warning(tmp_path, monkeypatch,
                                                                                      migrated_store):
    """A forest crossing has more coefficients than a small group has rows by design: said once at INFO,
    no warning (a warning only when something is wrong); data.small_groups=error still refuses it."""
    logged, text, _ = _run_csv(tmp_path, monkeypatch, _small_group, FOREST_CROSSING, "tracking.log_plots=false",
                               store=migrated_store)
    assert logged.info.status == "FINISHED"
    said = [line for line in text.splitlines() if "training row(s) for" in line]
    assert len(said) == 1 and " INFO tamrun.pipeline: " in said[0] and "by design: a forest crossing" in said[0], said
    assert "group g=2 has 5 training row(s) for" in said[0] and "small_groups=warn" not in text
