"""A data file that is not what data.path needs is named for what it is (issue 44; docs/reliability.md).

Real files in tmp_path (a FIFO, a device, the kernel's /proc, compressed, Parquet, Excel-like, binary,
';'- and tab-delimited, Latin-1, a secret-laden header), read by the real loader: each is refused with
the cause and the setting that fixes it, or read as what it is (a gzip or bz2 file named .csv). An error
quotes at most a short, redacted excerpt of the file. One whole command on ``/proc/self/environ`` with
a cloud secret in the environment: exit 2, the cause named, the secret nowhere (terminal, store).
"""

from __future__ import annotations

import bz2
import gzip
import os

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import csv_overrides, synthetic_frame
from test_load import data_config
from test_secrets import tamrun
from tamrun.data.file_kind import EXCERPT_CHARS
from tamrun.data.table import load_table
from tamrun.errors import DataError


@pytest.fixture
def frame():
    return synthetic_frame(days=20)


def refused(path, match, **fields) -> DataError:
    with pytest.raises(DataError, match=match) as caught:
        load_table(data_config(path, **fields))
    return caught.value


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "data.csv"
    os.mkfifo(fifo)
    error = refused(fifo, "a named pipe")
    assert error.field == "data.path" and "no such file" not in str(error)


@pytest.mark.parametrize("path, what", [("/dev/zero", "a character device"), ("/dev/null", "a character device"),
                                        ("/proc/self/environ", "kernel's /proc"), ("/proc/self/status", "/proc"),
                                        ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys")])
def test_system_files_are_refused_for_what_they_are(path, what):
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing on this machine")
    refused(path, what)


def test_a_link_to_proc_is_refused_as_proc(tmp_path):
    link = tmp_path / "data.csv"
    link.symlink_to("/proc/self/environ")
    refused(link, "kernel's /proc")


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress])
def test_a_compressed_file_named_csv_is_read_by_its_content(tmp_path, frame, compress):
    plain, packed = tmp_path / "plain.csv", tmp_path / "packed.csv"
    frame.to_csv(plain, index=False)
    packed.write_bytes(compress(plain.read_bytes()))
    pd.testing.assert_frame_equal(load_table(data_config(packed)), load_table(data_config(plain)))


def test_a_parquet_file_is_read_as_parquet_by_its_content(tmp_path, frame):
    path, plain = tmp_path / "data.csv", tmp_path / "plain.csv"  # named .csv, read as the Parquet it is
    frame.to_parquet(path, index=False)
    frame.to_csv(plain, index=False)
    pd.testing.assert_frame_equal(load_table(data_config(path)), load_table(data_config(plain)), check_dtype=False)


@pytest.mark.parametrize("head, what", [(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(100), "Excel 97-2003"),
                                        (b"PK\x03\x04" + bytes(30) + b"[Content_Types].xml", "Excel workbook"),
                                        (b"date,x\x00\x01\x02binary", "binary file"),
                                        (b"AWS_SECRET_ACCESS_KEY=abc\x00HOME=/root\x00", "binary file")])
def test_other_formats_are_named(tmp_path, head, what):
    path = tmp_path / "data.csv"
    path.write_bytes(head)
    error = refused(path, what)
    assert "abc" not in str(error)


@pytest.mark.parametrize("delimiter, setting", [(";", "data.delimiter=';'"), ("\t", "data.delimiter='\\t'"),
                                                ("|", "data.delimiter='|'")])
def test_a_file_of_another_delimiter_names_it_and_reads_with_it(tmp_path, frame, delimiter, setting):
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False, sep=delimiter)
    error = refused(path, "separated by")
    assert error.field == "data.delimiter" and setting in error.fix
    assert len(load_table(data_config(path, delimiter=delimiter))) == len(frame)


def test_a_latin1_file_names_the_encoding_and_reads_with_it(tmp_path, frame):
    path = tmp_path / "data.csv"
    frame.assign(city=["Besançon", "Orléans", "Nîmes"] * (len(frame) // 3) + ["Sète"] * (len(frame) % 3)) \
        .to_csv(path, index=False, encoding="latin-1")
    error = refused(path, "is not utf-8 text")
    assert error.field == "data.encoding" and "data.encoding=latin-1" in error.fix
    assert "Besançon" in set(load_table(data_config(path, encoding="latin-1"))["city"])


def test_an_error_quotes_only_a_short_redacted_excerpt_of_the_file(tmp_path):
    """A file whose header is not the data's (here a shadow-like line with a hash, then secrets): no name of
    it is quoted, only their count (a plain header's list is cut to a few short names:
    tests/test_secrets_kept_out.py::test_a_plain_header_is_still_quoted)."""
    path = tmp_path / "data.csv"
    names = ["root:$6$saltsalt$" + "h" * 80 + ":19000:0:99999:7:::", "password=hunter2", "token: tok-123456"] + \
        [f"c{i}" for i in range(40)]
    path.write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n")
    error = refused(path, "no such column")
    text = str(error)
    assert "h" * EXCERPT_CHARS not in text and "hunter2" not in text and "tok-123456" not in text
    assert "the file has 43 column(s) and its first line does not look like a CSV header" in text and len(text) < 800


def test_proc_environ_as_data_names_proc_and_leaks_no_secret(tmp_path, csv_path, store_uri):
    secret = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
    overrides = [o for o in csv_overrides(csv_path) if not o.startswith("data.path=")]
    done = tamrun([*overrides, "data.path=/proc/self/environ", f"tracking.uri={store_uri}"], tmp_path / "cwd",
                  {"AWS_SECRET_ACCESS_KEY": secret})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "data.path='/proc/self/environ': a file of the kernel's /proc file system" in done.stderr
    assert secret not in done.stdout + done.stderr
    client = MlflowClient(tracking_uri=store_uri)
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        assert run.info.status == "FAILED" and secret not in repr(run.data.tags)


def test_a_utf16_file_names_utf16_and_reads_with_it(tmp_path, frame):
    """A UTF-16 file (its byte order mark first, as Excel's "Unicode text" and PowerShell write it): the fix
    names utf-16, not latin-1, and with it the file reads."""
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False, encoding="utf-16")
    error = refused(path, "is not utf-8 text")
    assert error.field == "data.encoding" and "data.encoding=utf-16" in error.fix, error.fix
    assert len(load_table(data_config(path, encoding="utf-16"))) == len(frame)
