"""A data file a user got wrong ends in seconds with one `tamrun:` line naming the field or the file and the
fix, exit 2, the run FAILED; a legitimate one simply works (issue 58; docs/reliability.md, "Data files: no
hang, no internal error").

Real files in tmp_path (CSV, Parquet written by pyarrow and pandas, partitioned folders), real runs
(``python -m tamrun`` in a subprocess for the 1 MB group name, the entry point in-process for the others)
into real sqlite stores; the streamed reader (`tamrun.data.table.Table.scan`, a chunk's `Table.read`) read directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from test_secrets import tamrun
from tamrun.__main__ import main
from tamrun.config.schema import DataConfig, DataSource
from tamrun.data.cells import LARGEST_VALUE, LONGEST_LABEL
from tamrun.data.chunks import GroupChunk
from tamrun.data.table import Table, read_table

DAYS = 1096  # two groups of three years: 2,192 rows


def two_groups(seed: int = 0) -> pd.DataFrame:
    """Daily rows of groups 'a' and 'b': x in [0, 6], y = 3 + sin(x) + noise."""
    rng = np.random.default_rng(seed)
    dates = pd.date_range("2020-01-01", periods=DAYS, freq="D")
    parts = []
    for group in ("a", "b"):
        x = rng.uniform(0, 6, DAYS)
        parts.append(pd.DataFrame({"date": dates, "g": group, "x": x, "y": 3 + np.sin(x) + rng.normal(0, 0.1, DAYS)}))
    return pd.concat(parts, ignore_index=True)


def overrides(path: Path, store: Path) -> List[str]:
    """The issue's run: a spline of x per group, trained on 2020-2021, tested on 2022."""
    return ["data=csv", f"data.path={path}", "data.group=g", "data.target=y", "model=custom",
            "+model.effects.x={kind: spline, column: x, k: 10}", "split.train_end=2021-12-31",
            "split.test_start=2022-01-01", "split.test_end=null", "progress=off", f"tracking.uri=sqlite:///{store}"]


def store_copy(tmp_path: Path, template: Path) -> Path:
    store = tmp_path / "mlflow.db"
    store.write_bytes(template.read_bytes())
    return store


def ran(path: Path, tmp_path: Path, template: Path, monkeypatch, capsys, *extra: str) -> Tuple[int, str, str]:
    """The run in-process: (exit code, its terminal output, the status of its MLflow run)."""
    store = store_copy(tmp_path, template)
    monkeypatch.chdir(tmp_path)
    try:
        main([*overrides(path, store), *extra])
        code = 0
    except SystemExit as ended:
        code = ended.code
    out = capsys.readouterr()
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])
    return code, out.out + out.err, run.info.status


def refused(path, tmp_path, template, monkeypatch, capsys, *texts: str) -> str:
    code, output, status = ran(path, tmp_path, template, monkeypatch, capsys)
    assert code == 2 and status == "FAILED", output[-3000:]
    assert "Traceback" not in output and "internal error" not in output
    line = next(line for line in output.splitlines() if line.startswith("tamrun: data error: "))
    for text in texts:
        assert text in line, line
    return line


def test_a_group_name_of_a_megabyte_is_refused_naming_its_row_and_length(tmp_path, migrated_store):
    """The issue's hang (> 240 s, the run left RUNNING): the message says the row and the length; the
    subprocess's timeout bounds a hang, the test asserts the message."""
    frame = two_groups()
    frame.loc[5, "g"] = "c" * 1_000_000
    path = tmp_path / "long.csv"
    frame.to_csv(path, index=False)
    store = store_copy(tmp_path, migrated_store)
    done = tamrun(overrides(path, store), tmp_path, {}, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert (f"tamrun: data error: data.group='g': 1 row(s) hold a group name longer than {LONGEST_LABEL} characters "
            "(first: the row of 2020-01-06 00:00:00, a name of 1000000 characters: 'cccccccccc") in done.stderr
    assert "Fix: shorten the group names to at most 1000 characters" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr and len(done.stderr) < 20_000
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])
    assert run.info.status == "FAILED"


def test_a_megabyte_of_text_is_redacted_in_linear_time(tmp_path):
    """The hang's cause: the one redaction of every message took quadratic time on a long run of name
    characters. Each shape of a megabyte, in a subprocess bounded by a generous timeout."""
    code = ("from tamrun.redact import redacted\n"
            "for text in ('c' * 10**6, 'c-' * 500_000, '?' * 10**6, '-a' * 500_000, 'a.' * 500_000):\n"
            "    assert redacted(text) == text\n"
            "print(redacted('x' * 10**6 + ' --password=hunter2 ' + 'y' * 10**6).split()[1])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "--password=***"


def test_a_control_character_in_a_group_name_is_refused(tmp_path, migrated_store, monkeypatch, capsys):
    frame = two_groups()
    frame.loc[1500, "g"] = "b\x00zz"  # past the first 4 KiB, where a NUL names a binary file
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    refused(path, tmp_path, migrated_store, monkeypatch, capsys,
            "data.group='g': 1 row(s) hold a group name with a control character (first: the row of "
            "2021-02-08 00:00:00: 'b\\x00zz')", "Fix: remove the control characters")


@pytest.mark.parametrize("character, shown", [("\x1f", "\\x1f"), ("\x00", "\\x00")])
def test_a_control_character_in_a_number_is_quoted_escaped_with_its_row(character, shown, tmp_path, migrated_store,
                                                                          monkeypatch, capsys):
    """The issue's 0x1F (and a NUL past the first 4 KiB, where a binary file is not sniffed): the message
    quotes the value that is not a number, not the column's first (valid) value."""
    frame = two_groups()
    frame["x"] = frame["x"].map(repr)
    frame.loc[1500, "x"] = "3.82" + character + "1770123928726"
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    line = refused(path, tmp_path, migrated_store, monkeypatch, capsys,
                   f"model.effects.x.column='x': the column is not numeric: 1 value(s) are not numbers (first: "
                   f"'3.82{shown}1770123928726' at the row of 2021-02-08 00:00:00 in group 'b')")
    assert frame.loc[0, "x"] not in line


@pytest.mark.parametrize("row, line", [(1500, 1502), (0, 2)])
def test_a_date_of_a_megabyte_is_refused_without_being_parsed(row, line, tmp_path, migrated_store, monkeypatch,
                                                             capsys):
    """pandas' date parsers took minutes on a 1 MB value (the first: its format guessed from it)."""
    frame = two_groups()
    frame["date"] = frame["date"].dt.strftime("%Y-%m-%d")
    frame.loc[row, "date"] = "2" * 1_000_000
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    refused(path, tmp_path, migrated_store, monkeypatch, capsys,
            f"data.date_column='date': the value '{'2' * 40}'... (1000000 characters) at line {line} of the file is "
            "not a date in the format tried")


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize("value", [1.7e308, -1e300, 2e15])
def test_a_value_beyond_the_largest_magnitude_names_column_row_and_bound(kind, value, tmp_path, migrated_store,
                                                                         monkeypatch, capsys):
    frame = two_groups()
    frame.loc[10, "x"] = value
    path = tmp_path / f"data.{kind}"
    frame.to_csv(path, index=False) if kind == "csv" else frame.to_parquet(path, index=False)
    refused(path, tmp_path, migrated_store, monkeypatch, capsys,
            f"model.effects.x.column='x': 1 value(s) lie beyond ±{LARGEST_VALUE:g}, the largest magnitude an "
            f"effect reads (first: {value:g} at the row of 2020-01-11 00:00:00 in group 'a')",
            "Fix: correct those values")


@pytest.mark.parametrize("value, text", [(-np.inf, "data.target='y': 1 row(s) hold NaN or inf"),
                                         (1e308, "data.target='y': 1 row(s) lie far outside the rest")])
def test_an_absurd_target_is_named(value, text, tmp_path, migrated_store, monkeypatch, capsys):
    frame = two_groups()
    frame.loc[10, "y"] = value
    path = tmp_path / "data.parquet"
    frame.to_parquet(path, index=False)
    refused(path, tmp_path, migrated_store, monkeypatch, capsys, text)


def dictionary_encoded(frame: pd.DataFrame, columns: List[str]) -> pa.Table:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for column in columns:
        table = table.set_column(table.schema.get_field_index(column), column,
                                 pa.array(frame[column]).dictionary_encode())
    return table


@pytest.mark.parametrize("columns", [["g"], ["g", "x", "date"], "pandas category"])
def test_a_dictionary_encoded_column_is_read_as_plain_values(columns, tmp_path, migrated_store, monkeypatch, capsys):
    """The issue's "Input example does not match the model signature": a categorical group (pyarrow's
    dictionary_encode, or a pandas category), effect or date column is decoded at load; the run finishes
    and its model predicts from plain values."""
    frame = two_groups()
    path = tmp_path / "data.parquet"
    if columns == "pandas category":
        frame.assign(g=frame["g"].astype("category")).to_parquet(path, index=False)
    else:
        pq.write_table(dictionary_encoded(frame, columns), path)
    code, output, status = ran(path, tmp_path, migrated_store, monkeypatch, capsys)
    assert code == 0 and status == "FINISHED", output[-3000:]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("tamrun").experiment_id])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # the store its files are checked against
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    rows = frame[frame["date"] >= "2022-01-01"].head(4).assign(date=lambda f: f["date"].dt.strftime("%Y-%m-%d"))
    predicted = pd.DataFrame(model.predict(rows[["date", "g", "x"]]))
    numbers = predicted.select_dtypes("number").to_numpy()
    assert len(predicted) == 4 and numbers.shape[1] >= 1 and np.isfinite(numbers).all()


def partitioned(tmp_path: Path, extra: dict) -> Path:
    folder = tmp_path / "by_group"
    two_groups().to_parquet(folder, partition_cols=["g"], index=False)
    for name, content in extra.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(folder / name) if content is None else (folder / name).write_bytes(content)
    return folder


@pytest.mark.parametrize("extra", [{"README.txt": b"about this data\n"}, {"_SUCCESS": b""},
                                   {"g=a/.part-0.parquet.crc": b"crc\x00junk"}, {"g=b/empty.parquet": b""},
                                   {"_common_metadata": b"PAR1\x00\x00PAR1"}, {"g=a/more.parquet": None}],
                         ids=["README.txt", "_SUCCESS", ".crc", "empty file", "_common_metadata", "FIFO"])
def test_files_that_are_not_parquet_data_in_a_folder_are_ignored_and_named(extra, tmp_path, migrated_store,
                                                                             monkeypatch, capsys):
    folder = partitioned(tmp_path, extra)
    code, output, status = ran(folder, tmp_path, migrated_store, monkeypatch, capsys)
    assert code == 0 and status == "FINISHED", output[-3000:]
    (name,) = extra
    assert f"ignoring 1 file(s) of the Parquet folder {folder} (not Parquet, empty, not a regular file, or named " \
           f"with a leading '.' or '_'): {name}" in output


@pytest.mark.parametrize("content, problem", [(b"PAR1" + bytes(40), "a Parquet file cut short (no PAR1 footer)"),
                                              (b"not parquet", "a file named as Parquet that is not one")])
def test_a_broken_parquet_file_in_a_folder_is_named(content, problem, tmp_path, migrated_store, monkeypatch, capsys):
    folder = partitioned(tmp_path, {"g=a/broken.parquet": content})
    refused(folder, tmp_path, migrated_store, monkeypatch, capsys,
            f"data.path='{folder / 'g=a' / 'broken.parquet'}': {problem}", "Fix: rewrite the file, or remove it")


@pytest.mark.parametrize("key_type", [str, np.int32])
def test_a_partition_key_that_is_also_a_column_is_named(key_type, tmp_path, migrated_store, monkeypatch, capsys):
    """The issue's ArrowTypeError (string vs large_string; int32 vs int64 alike): refused, whatever the types."""
    folder = tmp_path / "by_group"
    frame = two_groups()
    for number, (group, rows) in enumerate(frame.groupby("g")):
        (folder / f"g={number if key_type is np.int32 else group}").mkdir(parents=True)
        rows.assign(g=rows["g"] if key_type is str else np.int32(number)).to_parquet(
            folder / f"g={number if key_type is np.int32 else group}" / "part.parquet", index=False)
    refused(folder, tmp_path, migrated_store, monkeypatch, capsys,
            f"data.path='{folder}': the partition key 'g' (folders g=...) is also a column of the files",
            "Fix: drop the column 'g' from the files (the folder names give it)")


def test_the_streamed_reader_reads_the_same_plain_values_and_ignores_the_same_files(tmp_path):
    """A streamed run's scan and its chunks' reads go through the same loader: a dictionary-encoded group
    is plain strings in both, and a README beside the Parquet files is skipped."""
    frame = two_groups()
    folder = tmp_path / "by_group"
    folder.mkdir()
    pq.write_table(dictionary_encoded(frame, ["g"]), folder / "part.parquet")
    (folder / "README.txt").write_text("about this data\n")
    cfg = DataConfig(name="csv", source=DataSource.file, path=str(folder), target="y", group="g")
    scan = Table.open(cfg).scan()
    assert scan.groups == ["a", "b"] and scan.rows.tolist() == [DAYS, DAYS]
    (first, second) = scan.chunks(1)
    loaded = read_table(cfg, {"data.target": "y", "data.group": "g", "x": "x"}, chunk=GroupChunk(second.groups))
    assert loaded.frame["g"].dtype != "category" and set(loaded.frame["g"]) == {"b"} and len(loaded.frame) == DAYS
