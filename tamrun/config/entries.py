"""The entries of the config's mappings (``name -> spec``) typed into their dataclasses.

A mapping of the schema is ``Dict[str, Any]`` to Hydra, so that a whole entry can be added on the
command line (`tamrun.config.schema.mapping_of`); its entries are merged here into their dataclass, and a
misspelt field, a wrong type or a missing value is refused with the entry's full config path.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tamrun.config.schema import ENTRY_NAME, ENTRY_TYPE
from tamrun.errors import ConfigError


def typed_entry(cls: type, node: Any, path: str, what: str, hidden: Tuple[str, ...] = ()) -> Any:
    """``node`` (a mapping, or already a ``cls``) merged onto the defaults of the dataclass ``cls``.

    Raises:
        ConfigError: an unknown field, a wrong type or a missing value, named ``<path>.<field>``; the
            fix lists the fields of ``cls`` (less ``hidden``). ``what`` names the entry ("a fourier effect").
    """
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), node))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "key", None) or getattr(exc, "full_key", None) or "?"
        is_mapping = isinstance(node, (DictConfig, Mapping))
        value = node.get(key) if is_mapping and isinstance(key, str) and key in node else None
        reason = str(exc.msg).splitlines()[0]
        raise ConfigError(f"{path}.{key}", value, f"not a valid field of {what} ({reason})",
                          f"{what} takes: {field_names(cls, hidden)}") from None


def field_names(cls: type, hidden: Tuple[str, ...] = ()) -> str:
    """The fields of the dataclass ``cls``, less ``hidden``, as "a, b, c"."""
    return ", ".join(f.name for f in dataclasses.fields(cls) if f.name not in hidden)


def type_mappings(node: Any, path: str = "") -> None:
    """Replace, in place, every entry of each `mapping_of` field of the dataclass ``node`` (and of the
    dataclasses it holds) by an instance of the field's entry type.

    Raises:
        ConfigError: an entry that is not a mapping, or one `typed_entry` refuses.
    """
    for spec in dataclasses.fields(node):
        value = getattr(node, spec.name)
        entry_type = spec.metadata.get(ENTRY_TYPE)
        if entry_type is None:
            if dataclasses.is_dataclass(value):
                type_mappings(value, f"{path}{spec.name}.")
            continue
        what = spec.metadata[ENTRY_NAME]
        typed = {}
        for name, entry in (value or {}).items():
            field = f"{path}{spec.name}.{name}"
            if not isinstance(entry, (DictConfig, Mapping)) and not isinstance(entry, entry_type):
                raise ConfigError(field, entry, f"{what} must be a mapping of its fields",
                                  f"write it as '+{field}={{<field>: <value>, ...}}' with fields among "
                                  f"{field_names(entry_type)}")
            typed[str(name)] = typed_entry(entry_type, entry, field, what)
        setattr(node, spec.name, typed)
