"""A single run's name: its presets and what the command line changed, e.g. ``fourier-national toy.m=8 cuda``.

``<model>-<data>``, then each of the run's command-line overrides in command order: a config group's
choice by its option (``hw=cuda`` as ``cuda``, ``solver=cg`` as ``cg``; the model and data choices are
already in the name), a field as ``<last two parts of its key>=<value>`` (``model.effects.toy.m=8`` as
``toy.m=8``, ``data.path=/data/my.csv`` as ``data.path=my.csv`` (a URI's password masked first), a top-level field as ``dtype=float32``;
a value cut as in a sweep's names), then the device's kind when the run computes off the CPU and no
override named it. What changes nothing the run computes (``tracking.*``, ``progress``) is left out.
Two runs that differ in anything the command line set are so named apart; identical reruns are
numbered by the tracker (``fourier-national #2``, `tamrun.tracking.mlflow_run`). A sweep's jobs are
named by their swept values instead (`tamrun.tracking.sweep_record.sweep_names`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import PurePath
from typing import Iterable, List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser

from tamrun.config.schema import Config
from tamrun.redact import redacted
from tamrun.tracking.sweep_record.sweep_names import MAX_RUN_NAME, compact

# Overrides that change how a run is recorded or shown, not what it computes.
UNNAMED = ("tracking", "progress", "hydra")
# Config groups whose choice is the name's start (<model>-<data>).
BASE_GROUPS = ("model", "data")
# The tag every numbered run carries: a digest of its name before the number (`name_key`).
NAME_KEY_TAG = "name_key"


def scalar_fields() -> List[str]:
    """The top-level fields of the config that are values, not groups (dtype, seed, ...)."""
    return [f.name for f in dataclasses.fields(Config) if f.default_factory is dataclasses.MISSING]


def override_label(key: str, value: Optional[str], scalars: Sequence[str]) -> Optional[str]:
    """How one override shows in a name (None: not at all); ``value`` None: the key is deleted (``~key``)."""
    root = key.split(".", 1)[0]
    last_two = ".".join(key.split(".")[-2:])
    if root in UNNAMED or (key in BASE_GROUPS and value is not None):
        return None
    if value is None:
        return f"~{last_two}"
    if "/" in value:  # a path or a URI: its file's name, of the value redacted (Hydra's escapes taken off first)
        value = PurePath(redacted(value.replace("\\", ""))).name or value
    shown, _ = compact(value)
    if "." not in key and key not in scalars:  # a config group's choice
        return shown
    return f"{last_two}={shown}"


def run_name(model: str, data: str, overrides: Iterable[str] = (), device_kind: str = "cpu") -> str:
    """The name of a run of ``model`` on ``data`` with the command line's ``overrides`` on a device of
    ``device_kind`` (see the module doc), at most `MAX_RUN_NAME` characters."""
    parts = [f"{model}-{data}"]
    scalars = scalar_fields()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        value = None if override.is_delete() else override.get_value_element_as_str()
        label = override_label(override.key_or_group, value, scalars)
        if label is not None:
            parts.append(label)
    device = f" {device_kind}" if device_kind != "cpu" and device_kind not in parts[1:] else ""
    name, room = " ".join(parts), MAX_RUN_NAME - len(" #99") - len(device)
    return (name if len(name) <= room else name[:room - 1] + "…") + device


def name_key(name: str) -> str:
    """A digest of a name, the value of `NAME_KEY_TAG` (a filter string cannot quote every name)."""
    return hashlib.sha1(name.encode()).hexdigest()[:16]


def numbered(name: str, earlier: int) -> str:
    """The name of a rerun that ``earlier`` runs of the same name started before: ``name`` for the
    first, ``name #2`` for the second, ..."""
    return name if earlier == 0 else f"{name} #{earlier + 1}"


def earlier_runs(client, experiment_id: str, key: str, run_id: str, start_time: int) -> int:
    """How many active runs of ``experiment_id`` tagged with the name key ``key`` started before the run
    ``run_id`` (started at ``start_time``; a tie goes by run id): reruns are numbered in the order they
    started, so that runs numbering themselves at once take distinct numbers."""
    count, token = 0, None
    while True:
        page = client.search_runs([experiment_id], filter_string=f"tags.{NAME_KEY_TAG} = '{key}'",
                                  max_results=1000, page_token=token)
        count += sum((r.info.start_time, r.info.run_id) < (start_time, run_id) for r in page)
        token = page.token
        if not token:
            return count
