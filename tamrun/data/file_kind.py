"""What a data file is, told before it is parsed, and what an error about it may quote.

`local_path` refuses a URI (``s3://``, ``https://``, ``ftp://``, ...: tamrun reads local files only) before
it becomes a `Path`, whose normalisation would collapse its ``//`` and hide a password from the redaction.
`regular_file` refuses a path that is not a regular file for what it is: missing, a folder, a named pipe
(FIFO: reading it would wait for a writer), a character or block device (``/dev/zero`` never ends), a
socket, or a file of the kernel's pseudo file systems (``/proc``, ``/sys``: ``/proc/self/environ`` holds the
process's environment, secrets included). `sniff` reads the first `SNIFF_BYTES` and names the format from
its content, not its name: gzip, bz2, xz, zstd and zip are read as such (pandas would infer the
compression from the name only), an Excel workbook or any other binary file is refused as what it is
(a Parquet file is read as such before: `tamrun.data.parquet`). `header_problem` names a header that was split with the wrong delimiter (one column whose
name holds ``;``, a tab or ``|``), and `decode_problem` a file that is not in ``data.encoding``.

An error never quotes more of a file than `excerpt`: a few names of its first line, each cut short,
redacted (`tamrun.redact`), and only when that line looks like a CSV header (`quotable`): no name holds
':', '=', '@' or '$' (the separators of credential files' lines: a ``.pgpass`` line
``host:port:db:user:password``, a ``.env`` line ``NAME=value``, ``user@host``, a crypt(3) hash), is a number
(a data row, not a header), holds a secret-named word (``password``, ``token``, ...) or looks like a password
or token (`tamrun.redact.looks_like_credential`). Otherwise no name of it is quoted, only their count. A
value of the file (a date that does not parse, a column that is not numeric) is quoted unless it looks
like a password or token (`tamrun.data.cells.quoted`).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from urllib.parse import urlsplit
from typing import Iterable, Optional

from tamrun.errors import DataError, os_reason
from tamrun.redact import looks_like_credential, redacted, secret_name

SNIFF_BYTES = 4096
PSEUDO_FILE_SYSTEMS = ("/proc", "/sys")  # a device anywhere is refused by its mode
EXCERPT_NAMES = 12  # names an error lists at most
EXCERPT_CHARS = 40  # characters of one name
DELIMITERS = {";": "';'", "\t": "a tab ('\\t')", "|": "'|'"}
FIX_FILE = "point data.path at a CSV file (optionally compressed: .gz, .bz2, .xz, .zst, .zip)"
# Leading bytes of each compression pandas reads, as its `compression` argument names it.
COMPRESSIONS = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
                b"PK\x03\x04": "zip"}
# Formats refused, by their leading bytes: (what it is, the fix).
REFUSED = {b"\xd0\xcf\x11\xe0": ("an Excel 97-2003 workbook (.xls), not a CSV", "save the sheet as CSV (UTF-8)"),
           b"ARROW1": ("an Arrow IPC file, not a CSV", "convert it to CSV"),
           b"SQLite format 3\x00": ("an SQLite database, not a CSV", "export the table to CSV")}


# Signs no CSV header's name holds and credential files' lines do (module doc).
CREDENTIAL_SIGNS = ":=@$"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
NOT_QUOTED = ("its first line does not look like a CSV header (a name holds ':', '=', '@' or '$', is a number, or "
              "looks like a password or token), so no name of it is quoted")


def quotable(name: object) -> bool:
    """Whether ``name``, a name of a file's first line, looks like a column's name an error may quote
    (module doc): no credential sign, not a number, no secret-named or credential-like word, nothing the
    redaction would mask."""
    text = str(name).strip()
    if any(sign in text for sign in CREDENTIAL_SIGNS) or _NUMBER.fullmatch(text) or redacted(text) != text:
        return False
    return not any(secret_name(word) or looks_like_credential(word) for word in text.split())


def excerpt(names: Iterable[object]) -> str:
    """At most `EXCERPT_NAMES` names of a file (its columns), each cut to `EXCERPT_CHARS`, redacted,
    comma-separated, ``(N more)`` when there are more; only their count when one of them is not
    `quotable` (the line is not a header: it may be a credential file's)."""
    names = [str(name) for name in names]
    if not all(quotable(name) for name in names):
        return f"{len(names)} name(s); {NOT_QUOTED}"
    shown = [name if len(name) <= EXCERPT_CHARS else name[:EXCERPT_CHARS - 3] + "..." for name in names[:EXCERPT_NAMES]]
    more = f" ({len(names) - EXCERPT_NAMES} more)" if len(names) > EXCERPT_NAMES else ""
    return redacted(", ".join(shown)) + more


# A URI's scheme and '//': two characters or more (a one-letter scheme would be a Windows drive).
_URI = re.compile(r"\s*(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+)://")
FIX_REMOTE = ("copy the data to a local disk, or mount its bucket (s3fs, gcsfuse, blobfuse2), and point data.path at "
              "the local path; credentials belong in the environment, never in a path")


def local_path(text: str, field: str = "data.path") -> Path:
    """``text`` as a local path (``~`` expanded); a URI is a `DataError` on ``field`` naming its scheme:
    tamrun reads local files and folders only. Judged on the text as given, before a `Path` collapses
    ``s3://`` to ``s3:/`` (the error quotes it redacted, its password masked)."""
    found = _URI.match(text)
    if found is None:
        return Path(text).expanduser()
    scheme = found.group("scheme").lower()
    if scheme == "file":
        raise DataError(field, text, "a file: URI, not a path", f"give the path itself: data.path={urlsplit(text).path}")
    raise DataError(field, text, f"a remote {scheme}:// URI: tamrun reads local files and folders only", FIX_REMOTE)


def use_one_of(names: Iterable[object]) -> str:
    """The fix of an error naming a column the file lacks: ``use one of: <its names>`` (`excerpt`), or,
    when they are not quotable, to check data.path and data.delimiter."""
    names = [str(name) for name in names]
    if all(quotable(name) for name in names):
        return f"use one of: {excerpt(names)}"
    return (f"check that data.path names the data file and data.delimiter its delimiter: the file has {len(names)} "
            f"column(s) and {NOT_QUOTED}")


def what_it_is(mode: int) -> Optional[str]:
    """What a file of ``mode`` (st_mode) is when it is not a regular file nor a folder."""
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), None)


def regular_file(path: Path, field: str = "data.path") -> Path:
    """``path`` when it is a regular data file; else a `DataError` on ``field`` saying what it is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(field, str(path), "no such file", "point data.path at an existing CSV file") from None
    except OSError as exc:  # e.g. a name longer than the file system allows, a folder not searchable
        raise DataError(field, str(path), f"the path cannot be used ({os_reason(exc)})",
                        "point data.path at an existing CSV file") from None
    if stat.S_ISDIR(mode):
        raise DataError(field, str(path), "a folder, not a file (and it holds no Parquet files)",
                        "point data.path at a CSV file inside it, or at a folder of Parquet files")
    kind = what_it_is(mode)
    if kind is not None:
        raise DataError(field, str(path), f"{kind}, not a regular file (it is not read)", FIX_FILE)
    real = os.path.realpath(path)
    system = next((root for root in PSEUDO_FILE_SYSTEMS if real == root or real.startswith(root + "/")), None)
    if system is not None:
        raise DataError(field, str(path), f"a file of the kernel's {system} file system, not a data file (it is not "
                                          "read)", FIX_FILE)
    return path


def sniff(path: Path, field: str = "data.path") -> Optional[str]:
    """The compression of ``path`` by its leading bytes (pandas' name; None: plain text); a format that is
    not a CSV is a `DataError` naming it (module doc)."""
    try:
        with open(path, "rb") as file:
            head = file.read(SNIFF_BYTES)
    except OSError as exc:
        raise DataError(field, str(path), f"the file cannot be read ({os_reason(exc)})", FIX_FILE) from None
    for magic, (what, fix) in REFUSED.items():
        if head.startswith(magic):
            raise DataError(field, str(path), what, fix)
    compression = next((name for magic, name in COMPRESSIONS.items() if head.startswith(magic)), None)
    if compression == "zip" and b"[Content_Types].xml" in head:
        raise DataError(field, str(path), "an Excel workbook (.xlsx), not a CSV", "save the sheet as CSV (UTF-8)")
    if compression is None and b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataError(field, str(path), "a binary file, not a CSV (it holds NUL bytes)", FIX_FILE)
    return compression


def header_problem(path: Path, header: list, delimiter: str) -> Optional[DataError]:
    """A header read as one column whose name holds another delimiter than ``delimiter``: the error naming
    data.delimiter, else None."""
    if len(header) != 1:
        return None
    found = [d for d in DELIMITERS if d != delimiter and d in header[0]]
    if not found:
        return None
    best = max(found, key=header[0].count)
    return DataError("data.delimiter", delimiter, f"the file {path} has one column by this delimiter, and its header "
                     f"({excerpt(header)}) is separated by {DELIMITERS[best]}",
                     f"set data.delimiter='{best}'" if best != "\t" else "set data.delimiter='\\t'")


UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")  # the byte order marks a UTF-16 file starts with (little, big endian)


def decode_problem(path: Path, exc: UnicodeDecodeError, encoding: str) -> DataError:
    """The error for a file that is not text in ``encoding``: where it fails, and the fix (data.encoding)."""
    block = exc.object if isinstance(exc.object, (bytes, bytearray)) else b""
    byte = block[exc.start:exc.start + 1].hex() or "?"
    likely = "latin-1 (ISO-8859-1) or cp1252" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else "utf-8"
    with open(path, "rb") as handle:  # a regular file (`regular_file`), read already
        if handle.read(2) in UTF16_MARKS:  # a UTF-16 byte order mark opens the file
            likely = "utf-16"
    return DataError("data.encoding", encoding, f"the file {path} is not {encoding} text (byte 0x{byte} at offset "
                     f"{exc.start} of a block cannot be decoded)",
                     f"set data.encoding to the file's encoding (e.g. data.encoding={likely.split()[0]}), or save "
                     f"the file as {encoding}")
