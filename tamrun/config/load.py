"""From a composed Hydra config to the typed, checked `Config` and the parsed effect specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tamrun.config.checks import check_config, check_gcv_effects
from tamrun.config.effects import parse_effects
from tamrun.config.entries import type_mappings
from tamrun.config.schema import Config
from tamrun.config.secret_sources import check_secret_sources
from tamrun.errors import ConfigError


def config_dir() -> Path:
    """The folder holding config.yaml: inside the installed package (wheel), else the checkout's conf/."""
    packaged = Path(__file__).resolve().parents[1] / "conf"
    return packaged if (packaged / "config.yaml").is_file() else Path(__file__).resolve().parents[2] / "conf"


def typed_config(cfg: Any) -> Tuple[Config, Dict[str, Any]]:
    """Merge ``cfg`` into the `Config` schema, type the entries of its mappings (`type_mappings`), check
    every range and parse the effects.

    Raises:
        ConfigError: a missing, mistyped, unknown or out-of-range value (the message names it), or a
            secret where it would be written in clear (`tamrun.config.secret_sources`).
    """
    check_secret_sources(cfg)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        config: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "config"
        reason = str(getattr(exc, "msg", exc)).splitlines()[0]
        raise ConfigError(str(key), getattr(exc, "value", None), reason,
                          f"set {key}=<value> on the command line or in its YAML file") from None
    type_mappings(config)
    check_config(config)
    effects_node = cfg.model.effects if isinstance(cfg, DictConfig) else config.model.effects
    specs = parse_effects(effects_node)
    check_gcv_effects(config, specs)
    return config, specs


def resolved_container(cfg: Any) -> dict:
    """The config as plain, resolved Python containers (for logging)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
