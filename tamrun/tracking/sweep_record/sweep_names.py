"""Which keys a multirun sweeps, and the names of its jobs' runs.

A sweep's command line (``hydra.overrides.task`` at ``on_multirun_start``) says which keys vary between
its jobs: those given a sweep (``a=1,2``, ``range(...)``, ``choice(...)``, ``interval(...)``,
``glob(...)``), and the keys of ``hydra.sweeper.params`` (optuna's search space, or the basic
sweeper's). A job's run is named by its values of those keys only, e.g. ``fourier · toy.ap=-3`` for
``model=fourier model.effects.toy.ap=-3`` (a config group's choice by its option alone, a field by the
shortest end of its dotted key that tells the swept keys apart), and ``#<job number>`` is appended
when the values may not tell two jobs apart: a sweeper that samples (optuna may draw a value twice), a
list that repeats a value, nothing swept, or a name shortened to fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from tamrun.redact import redacted

# MLflow stores 250 characters of a run name; the UI's run list shows far fewer.
MAX_RUN_NAME = 100
# Characters of one value in a name (a longer one is cut, and the job number appended).
MAX_VALUE = 24
# Characters of a number beyond which it is shown to 6 significant digits (optuna's -4.187364987198273).
MAX_NUMBER = 10
SEPARATOR = " · "
VALUE_TAG_PREFIX = "sweep."


@dataclass
class SweptKeys:
    """The keys a sweep varies, each with its label in a run name ("" for a config group: the option
    alone), and whether every job's name carries its job number."""

    labels: Dict[str, str] = field(default_factory=dict)
    numbered: bool = True

    def to_json(self) -> Dict[str, Any]:
        return {"swept": self.labels, "numbered": self.numbered}

    @classmethod
    def from_json(cls, info: Mapping[str, Any]) -> "SweptKeys":
        """From the sweep file's fields (a sweep file without them: nothing swept, numbered names)."""
        return cls(dict(info.get("swept") or {}), bool(info.get("numbered", True)))


def _enumerated(override: Any) -> Optional[List[str]]:
    """The values of a sweep override, or None when it cannot be listed (interval, glob)."""
    try:
        return list(override.sweep_string_iterator())
    except HydraException:
        return None


def varying_keys(command: Sequence[str], sweeper_params: Optional[Mapping[str, Any]]) -> Dict[str, Optional[List[str]]]:
    """Key -> its listed values (None: not listable) of every key the sweep varies, in command order."""
    parser = OverridesParser.create()
    varying: Dict[str, Optional[List[str]]] = {}
    for override in parser.parse_overrides(list(command)):
        if override.is_sweep_override():
            varying[override.key_or_group] = _enumerated(override)
    for key, value in (sweeper_params or {}).items():
        try:
            override = parser.parse_override(f"{key}={value}")
        except HydraException:  # a sweeper's own syntax: the key varies, its values are the sweeper's
            varying[str(key).lstrip("+~")] = None
            continue
        varying[override.key_or_group] = _enumerated(override) if override.is_sweep_override() else None
    return varying


def short_labels(keys: Iterable[str], groups: Iterable[str]) -> Dict[str, str]:
    """Key -> label: "" for a config group, else the shortest end of the dotted key (at least its last
    part) that no other swept field ends with."""
    keys, groups = list(keys), set(groups)
    fields = [k for k in keys if k not in groups]
    labels = {}
    for key in keys:
        if key in groups:
            labels[key] = ""
            continue
        parts = key.split(".")
        for size in range(1, len(parts) + 1):
            label = ".".join(parts[-size:])
            if not any(other != key and (other == label or other.endswith("." + label)) for other in fields):
                break
        labels[key] = label
    return labels


def swept_keys(command: Sequence[str], sweeper_params: Optional[Mapping[str, Any]], groups: Iterable[str],
               grid: bool) -> SweptKeys:
    """What a sweep varies (see the module doc). ``grid``: the sweeper runs each combination of the
    listed values once (Hydra's basic sweeper), so distinct listed values give distinct names."""
    varying = varying_keys(command, sweeper_params)
    repeats = any(values is None or len(set(values)) < len(values) for values in varying.values())
    return SweptKeys(short_labels(varying, groups), numbered=not varying or not grid or repeats)


def job_values(overrides: Sequence[str], keys: Iterable[str]) -> Dict[str, str]:
    """Key -> value, as written on the job's command line, of the job's overrides of ``keys``."""
    keys = set(keys)
    values = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.key_or_group in keys:
            values[override.key_or_group] = override.get_value_element_as_str() if override.value() is not None else ""
    return values


def compact(value: str) -> Tuple[str, bool]:
    """A value as a name shows it, and whether that lost anything: a number longer than
    MAX_NUMBER characters to 6 significant digits, any other value redacted (`tamrun.redact.redacted`:
    cut first, a URI's password would lose the '@' that marks it) and cut to MAX_VALUE characters."""
    value = redacted(value)
    try:
        number: Optional[str] = f"{float(value):.6g}"
    except ValueError:
        number = None
    if number is not None and len(value) > MAX_NUMBER:
        return number, float(number) != float(value)
    if len(value) <= MAX_VALUE:
        return value, False
    return value[:MAX_VALUE - 1] + "…", True


def job_run_name(swept: SweptKeys, job_num: int, values: Mapping[str, str], default: str) -> str:
    """A job's run name from its swept values (see the module doc); ``default`` when nothing is swept."""
    parts, shortened = [], False
    for key, label in swept.labels.items():
        if key not in values:
            continue
        value, cut = compact(values[key])
        shortened |= cut
        parts.append(f"{label}={value}" if label else value)
    name = SEPARATOR.join(parts) or default
    suffix = f" #{job_num}"
    if len(name) > MAX_RUN_NAME - len(suffix):
        name, shortened = name[:MAX_RUN_NAME - len(suffix) - 1] + "…", True
    return name + suffix if swept.numbered or shortened or not parts else name


def value_tag(key: str) -> str:
    """The tag of a job's value of a swept key: ``sweep.<key>`` (characters MLflow refuses in a tag's
    key as ``_``)."""
    return VALUE_TAG_PREFIX + re.sub(r"[^\w./\- ]", "_", key)


def value_tags(values: Mapping[str, str]) -> Dict[str, str]:
    """The tags of a job's swept values (the UI shows them as columns and filters on them)."""
    return {value_tag(key): value[:5000] for key, value in values.items()}
