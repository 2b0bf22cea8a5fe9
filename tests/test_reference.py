"""The reference pages stay complete: docs/configuration.md names every field of the typed config
(tamrun/config/schema.py, nested groups walked) in backquotes, by its dotted path or by its path inside
its group (``oom.size_factor`` in the memory table), so a new field cannot ship undocumented; every
section of docs/benchmarks.md is dated."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Iterator, List

from tamrun.config.schema import Config

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def field_paths(cls: type, prefix: str = "") -> Iterator[str]:
    """Dotted paths of every leaf field of a config dataclass; a nested dataclass (or Optional of one) is walked."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        kind = hints[item.name]
        inner: List[type] = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        nested = kind if dataclasses.is_dataclass(kind) else (inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else None)
        if nested is not None:
            yield from field_paths(nested, f"{prefix}{item.name}.")
        else:
            yield prefix + item.name


def named(path: str, text: str) -> bool:
    """``group.a.b`` is named as `group.a.b` or `a.b` (inside its group's table), in backquotes, alone or as
    a setting (`a.b=...`, `a.b: ...`), or set on a command line of the page (``group.a.b=...``)."""
    parts = path.split(".")
    candidates = {path, ".".join(parts[1:])} if len(parts) > 1 else {path}
    quoted = any(re.search(r"`" + re.escape(name) + r"(`|=|: )", text) for name in candidates if name)
    return quoted or re.search(r"(?<![\w.])" + re.escape(path) + "=", text) is not None


def test_every_config_field_is_in_the_reference():
    text = REFERENCE.read_text(encoding="utf-8")
    paths = list(field_paths(Config))
    assert len(paths) > 100 and "memory.oom.size_factor" in paths and "adaptive.kalman.q" in paths
    missing = [path for path in paths if not named(path, text)]
    assert not missing, f"fields of tamrun/config/schema.py not named in docs/configuration.md: {missing}"


def test_the_reference_check_fails_on_a_field_it_does_not_name():
    assert not named("memory.not_a_field", "`memory.limit` and `oom.size_factor`")
    assert named("memory.oom.size_factor", "`oom.size_factor`") and named("hw.device", "sets `hw.device`;")
    assert named("data.target", "python -m tamrun data.target=y") and named("data.unit", "adds `unit: MW`")
    assert not named("data.target", "python -m tamrun xdata.target=y")


def test_every_benchmark_section_is_dated():
    """docs/benchmarks.md's figures are dated: every section (``## ``) but the peer's set-up names its day."""
    headings = re.findall(r"^## (.+)$", (REFERENCE.parent / "benchmarks.md").read_text(encoding="utf-8"), re.M)
    assert len(headings) > 10
    undated = [h for h in headings if not h.startswith("Set up") and not re.search(r"\b20\d\d-\d\d-\d\d\b", h)]
    assert not undated, f"benchmark sections without their date: {undated}"
