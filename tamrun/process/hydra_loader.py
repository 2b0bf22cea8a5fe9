"""Hydra's compositions checked before Hydra builds anything from them (`tamrun.config.trusted`).

Hydra composes a command's config (`ConfigLoaderImpl.load_configuration`: the run's, a multirun's, each
sweep job's) and right after it configures logging from ``hydra.hydra_logging``, instantiates
``hydra.callbacks`` and, in a multirun, the sweeper and the launcher. `install`, called by the entry
point before ``hydra.main`` runs, makes Hydra compose with `TrustedConfigLoader`, whose composition ends
with `tamrun.config.trusted.check_composed`, and read configs through this module's sources: YAML files
with `FileConfigSource` (a file's aliases measured before OmegaConf expands them, a file yaml cannot read
named), packages with `ImportlibResourcesConfigSource` (only Hydra's, its plugins' and tamrun's). They
travel with Hydra's loader and its registry of sources to a sweep's workers (joblib, submitit and Ray
pickle them by class, and the classes are tamrun's), so a job composed there is checked too. These are
the places tamrun reaches into Hydra's internals (``hydra._internal``): the loader class
`Hydra.create_main_hydra2` builds, and the ``file`` and ``pkg`` schemes of Hydra's registry of sources.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins import file_config_source as hydra_file_source
from hydra._internal.core_plugins import importlib_resources_config_source as hydra_package_source
from hydra.plugins.config_source import ConfigResult

from tamrun.errors import ConfigError
from tamrun.config.trusted import (MAX_CONFIG_DEPTH, check_bytes, check_composed, check_package, check_size,
                                   too_deep, yaml_error, yaml_size)


class FileConfigSource(hydra_file_source.FileConfigSource):
    """Hydra's ``file://`` config source (the primary config's folder, ``--config-dir``,
    ``hydra.searchpath``), refusing a YAML file whose aliases expand past
    `tamrun.config.trusted.MAX_CONFIG_NODES`, larger than `tamrun.config.trusted.MAX_CONFIG_BYTES` (before it is parsed),
    nested past Python's recursion limit or that yaml cannot read (a ``!!python/object`` tag).
    It keeps the name of Hydra's class: Hydra's registry of sources compares names, and a sweep's
    worker, which restores the registry and then registers Hydra's own sources, keeps this one."""

    def load_config(self, config_path: str) -> ConfigResult:
        import yaml

        path = Path(os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path))))
        try:
            if path.is_file():
                check_bytes(str(path), path.stat().st_size, "this config file")
                size, line = yaml_size(path.read_text(encoding="utf-8", errors="replace"))
                check_size(f"{path} {line}", size, "this YAML file")
            return super().load_config(config_path)
        except yaml.YAMLError as exc:
            raise yaml_error(str(path), exc) from None
        except RecursionError:
            raise too_deep(str(path)) from None


class ImportlibResourcesConfigSource(hydra_package_source.ImportlibResourcesConfigSource):
    """Hydra's ``pkg://`` config source, refusing a package other than Hydra's, its plugins' or tamrun's
    (`tamrun.config.trusted.check_package`) before it is imported (Hydra's class name kept, as above)."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider, path)
        check_package(self.path)


def use_trusted_sources() -> None:
    """Hydra reads ``file://`` and ``pkg://`` configs through this module's `FileConfigSource` and
    `ImportlibResourcesConfigSource` (once its plugins, which register Hydra's own sources, are loaded)."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    Plugins.instance()
    for source in (FileConfigSource, ImportlibResourcesConfigSource):
        SourcesRegistry.instance().types[source.scheme()] = source


class TrustedConfigLoader(ConfigLoaderImpl):
    """Hydra's config loader, whose every composition is checked (`check_composed`) before it returns:
    an override over `MAX_CONFIG_BYTES` refused before it is parsed, one nested past Python's recursion
    limit named."""

    def load_configuration(self, config_name: Optional[str], overrides: List[str], run_mode: Any,
                           from_shell: bool = True, validate_sweep_overrides: bool = True) -> Any:
        use_trusted_sources()  # again in a sweep's worker, which unpickled this loader
        for override in overrides:
            check_bytes(override_key(override), len(override.encode("utf-8", "replace")), "this override")
        try:
            cfg = super().load_configuration(config_name, overrides, run_mode, from_shell=from_shell,
                                             validate_sweep_overrides=validate_sweep_overrides)
            check_composed(cfg)
        except RecursionError:
            raise too_deep(deepest(overrides)) from None
        except AttributeError as exc:  # OmegaConf merging a mapping into a node that is None (Optional[Dict])
            raise unmergeable(exc, overrides) from None
        return cfg


def unmergeable(exc: AttributeError, overrides: List[str]) -> ConfigError:
    """The config error for an override OmegaConf could not merge (``+hydra.sweeper.params={...}`` onto
    Optuna's ``params: null``): the key its message names, the override that sets it, and the fix."""
    key = next((line.split(":", 1)[1].strip() for line in str(exc).splitlines()
                if line.strip().startswith("full_key:")), "")
    given = next((o for o in overrides if key and override_key(o).lstrip("+~") == key), None)
    return ConfigError(key or "the command line", given or overrides, f"Hydra could not merge this value into the "
                       f"config ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                       f"set the mapping's keys one by one ({key or 'key'}.<name>=<value>), as docs/sweeps.md shows")


def override_key(override: str) -> str:
    """The key an override sets (``+a.b=[...]``: ``+a.b``)."""
    return override.split("=", 1)[0]


def deepest(overrides: List[str]) -> str:
    """The key of the override whose brackets nest deepest past `MAX_CONFIG_DEPTH` (the one Hydra's
    parser recursed on), or "the composed config" when none does."""
    def depth(text: str) -> int:
        level = most = 0
        for char in text:
            level += 1 if char in "[{" else -1 if char in "]}" else 0
            most = max(most, level)
        return most

    deep = max(overrides, key=depth, default="")
    return override_key(deep) if deep and depth(deep) > MAX_CONFIG_DEPTH else "the composed config"


def install() -> None:
    """Hydra's next `hydra.main` composes with `TrustedConfigLoader` and this module's sources (module doc)."""
    from hydra._internal import hydra as hydra_app

    use_trusted_sources()
    hydra_app.ConfigLoaderImpl = TrustedConfigLoader
