"""A logged model's files as data: the digest of each, and the one wheel of tamrun that serves it.

A logged model holds no Python source: its state (safetensors + JSON), MLflow's MLmodel, requirements
and examples, and one wheel of tamrun, which `mlflow models serve` installs in the environment it builds
from the requirements (pinned there by its sha256, which pip checks). The run records the sha256 of
every file of the model in the tracking store (the LoggedModel's tag `MANIFEST_TAG`), and the loader
(`tamrun.tracking.pyfunc_loader`) compares the files it was given with it before it reads any of them.

The wheel is written here, not by a build backend (none need be installed where a run logs its model):
the package's files (without `LEFT_OUT`), its metadata and RECORD, zipped in a fixed order with fixed
times, so the same sources give the same bytes. It is kept in `wheel_cache` under its sources' digest:
built once per version of the sources, not per run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import stat
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import tamrun
from tamrun.errors import TamrunError

log = logging.getLogger(__name__)

MANIFEST_TAG = "tamrun.model_files"  # the LoggedModel's tag: {"<path in the model>": "<sha256>", ...} as JSON
# What of the package the wheel leaves out: caches, the embedded data (5 MB) and the Hydra plugins (pyproject's
# wheel installs those apart; a model does not need them).
LEFT_OUT = ("__pycache__", "national", "hydra_plugins")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every entry's time: the same sources give the same wheel
CACHE_ENV = "XDG_CACHE_HOME"
CHUNK = 1 << 20  # bytes read at a time when hashing a file
# Files MLflow itself writes into a model's folder when it downloads it (a registered model's name and version
# in ``registered_model_meta``): not the run's, not compared; MLflow reads them as data.
WRITTEN_BY_MLFLOW = ("registered_model_meta",)


class ModelFileError(TamrunError):
    """A logged model's file that is not as its run recorded it (or a model whose record is missing): the
    model is refused before anything of it is read."""

    kind = "model"


def sha256_of(path: Path) -> str:
    """The sha256 of the regular file ``path``; opened without blocking, so that an entry swapped for a FIFO
    after it was looked at is refused (`ModelFileError`), not waited on."""
    digest = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ModelFileError(str(Path(path).name), str(path), "is not a regular file", "leave only the model's "
                                 "own files in its folder")
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def entries(folder: Path) -> Dict[str, Path]:
    """Every entry of ``folder`` (at any depth) that is not a directory, by its path there (``/``-separated),
    sorted: regular files, and any symbolic link, FIFO, socket or device (a symbolic link not followed)."""
    return {path.relative_to(folder).as_posix(): path for path in sorted(Path(folder).rglob("*"))
            if path.is_symlink() or not path.is_dir()}


def special_kind(path: Path) -> Optional[str]:
    """What ``path`` is when it is not a regular file (``a FIFO``, ...), read from its own status (a link not
    followed, nothing opened: opening a FIFO blocks); None for a regular file."""
    mode = os.lstat(path).st_mode
    kinds = [(stat.S_ISREG, None), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def file_digests(folder: Path) -> Dict[str, str]:
    """The sha256 of every file under ``folder``, by its path there (``/``-separated), sorted; an entry that
    is not a regular file (`special_kind`) is a `ModelFileError`, never opened."""
    found = entries(folder)
    for name, path in found.items():
        kind = special_kind(path)
        if kind:
            raise ModelFileError(name, str(path), f"is {kind}, not a regular file: a model holds regular files only",
                                 "leave only the model's own files in its folder")
    return {name: sha256_of(path) for name, path in found.items()}


def manifest_text(digests: Dict[str, str]) -> str:
    return json.dumps(digests, sort_keys=True, separators=(",", ":"))


def first_difference(folder: Path, recorded: Dict[str, str]) -> Optional[Tuple[str, str]]:
    """(path, how it differs) of the first entry of ``folder`` (`entries`: any that is not a directory) that is
    not as ``recorded``: changed, missing, added, or not a regular file (never opened); None when every file is
    as recorded."""
    found = {name: path for name, path in entries(folder).items()
             if name not in WRITTEN_BY_MLFLOW or special_kind(path)}
    for name in sorted(set(found) | set(recorded)):
        if name not in found:
            return name, "is missing"
        kind = special_kind(found[name])
        if name not in recorded:
            return name, f"was added (the run recorded no such file{f'; it is {kind}' if kind else ''})"
        if kind:
            return name, f"is {kind}, not the regular file the run logged"
        if sha256_of(found[name]) != recorded[name]:
            return name, "changed since the run logged it (its sha256 is not the one recorded in the tracking store)"
    return None


def _package_files() -> List[Tuple[str, Path]]:
    """(path in the wheel, file) of the package's files, without `LEFT_OUT` or compiled files."""
    root = Path(tamrun.__file__).parent
    files = []
    for path in sorted(root.rglob("*")):
        inside = path.relative_to(root)
        if path.is_file() and path.suffix != ".pyc" and not set(inside.parts) & set(LEFT_OUT):
            files.append((f"tamrun/{inside.as_posix()}", path))
    return files


def wheel_name() -> str:
    return f"tamrun-{tamrun.__version__}-py3-none-any.whl"


def _metadata(requires: Iterable[str]) -> Dict[str, bytes]:
    info = f"tamrun-{tamrun.__version__}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.1\nName: tamrun\nVersion: {tamrun.__version__}\n",
                        *(f"Requires-Dist: {line}\n" for line in requires)])
    wheel = "Wheel-Version: 1.0\nGenerator: tamrun.tracking.model_files\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return {f"{info}/METADATA": metadata.encode(), f"{info}/WHEEL": wheel.encode()}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def write_wheel(target: Path, requires: Iterable[str]) -> Path:
    """The wheel of the installed package at ``target`` (a file of `wheel_name`), its dependencies
    ``requires`` (requirement lines) in its metadata."""
    entries = {name: path.read_bytes() for name, path in _package_files()}
    entries.update(_metadata(requires))
    record = f"tamrun-{tamrun.__version__}.dist-info/RECORD"
    entries[record] = "".join([*(_record_line(name, data) for name, data in entries.items()), f"{record},,\n"]).encode()
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return target


def wheel_cache() -> Path:
    """Where built wheels are kept: ``$XDG_CACHE_HOME/tamrun/wheels`` (``~/.cache`` without it)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache") / "tamrun" / "wheels"


def sources_digest(requires: Iterable[str]) -> str:
    """One sha256 of the package's files (paths and bytes), its version and ``requires``."""
    digest = hashlib.sha256(f"{tamrun.__version__}\n{list(requires)}\n".encode())
    for name, path in _package_files():
        digest.update(f"{name}\0{sha256_of(path)}\n".encode())
    return digest.hexdigest()


def tamrun_wheel(requires: List[str], fallback: Path) -> Path:
    """The wheel of this tamrun (`write_wheel`), from `wheel_cache` when these sources were built before;
    written there (atomically) otherwise, or in ``fallback`` (a folder) when the cache cannot be written."""
    folder = wheel_cache() / sources_digest(requires)[:32]
    target = folder / wheel_name()
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{wheel_name()}.{os.getpid()}"
        write_wheel(partial, requires)
        os.replace(partial, target)
    except OSError as exc:
        log.info("the wheel cache %s cannot be written (%s): the wheel is built for this model only", folder, exc)
        return write_wheel(Path(fallback) / wheel_name(), requires)
    return target


def wheel_requirement(wheel: Path) -> str:
    """The requirement line that installs ``wheel`` from the model's folder (pip runs there) only when its
    sha256 is the one pinned: ``file:tamrun-<version>-py3-none-any.whl#sha256=<hex>``."""
    return f"file:{wheel.name}#sha256={sha256_of(wheel)}"
