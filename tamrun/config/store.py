"""Register the typed schemas in Hydra's ConfigStore (called by the entry points, not at import)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from tamrun.config.schema import Config


def register_configs() -> None:
    """Store the root schema as ``base_config``; conf/config.yaml lists it first in its defaults,
    so every group's YAML is merged into (and type-checked against) the dataclasses."""
    ConfigStore.instance().store(name="base_config", node=Config)
